"""The shortcuts' rule, applied to every plan the core judges: a shortcut may save work, never decide.

A plan runs the cheap way first (a warm start, from a copy of the reference's checkpoints, against
a cached reference; ``training/shortcuts.py`` says which of them a run used). A failure seen
through a shortcut is judged again on the slow path (cold, from step 0, against a fresh
reference), and the slow path's failure is the verdict; a slow pass is a disagreement, reported
and failing too, unless the harness proves its own copy changed or the shortcut's runs tested
nothing (a crash point that never fired). A resume whose evidence fits
noise is first checked against a second uninterrupted run, and a crash point that never fired is
run again: neither leaves a cause named that the evidence does not prove.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.jobs import JobSpec
from ..errors import NotDeterministic
from ..faults.plan import Plan
from ..training.determinism import HINT
from ..training.engine.run import CRASH_POINT_TRIES, missed_crash_point
from ..training.reference.prefix import Prefix
from ..training.shortcuts import Judged, slow
from ..training.trajectory import RunRecord
from ..training.verdict import Verdict

if TYPE_CHECKING:
    from .runs import Core

# fingerprints of what a resume restores and noise never changes: one that differs names a cause
RESTORED_INPUTS = {"lr", "batch", "epoch", "rng"}


@dataclass(frozen=True)
class Allowed:
    """The shortcuts a caller lets one plan take; whatever it allows, a failure through one is
    judged again on the slow path. ``prefix``: from the reference's checkpoint before its first
    fault where it can; ``reuse``: a plan passed on this job is not run again; ``defer``: that
    judgement waits until the caller ``settle``s the plan (a search, for the plan it reports)."""

    prefix: bool = False
    reuse: bool = False
    defer: bool = False


NONE = Allowed()


def run_judged(core: Core, job: JobSpec, plan: Plan, allowed: Allowed) -> tuple[RunRecord, Verdict]:
    """A plan's verdict under the shortcuts' rule: a failure through a shortcut is judged again on the
    slow path, whose failure is the verdict; a slow pass is a disagreement, and fails too."""
    shortcuts, prefixes = core.shortcuts, core.prefixes
    prefix = allowed.prefix
    if shortcuts.off(job):  # a shortcut disagreed with the slow path earlier this session
        prefix, runs_as = False, slow(job)
    else:
        runs_as = job
    if allowed.reuse and (ran := shortcuts.reused(job, plan, from_copy_ok=prefix)) is not None:
        return ran
    start = prefixes.start(job, plan, core.reference(job)) if prefix else None
    fast = core.judged(runs_as, plan, start, tails=prefix)
    if not fast.verdict.passed and core.references.stale(job, shortcuts.forget_job):  # a stale cached reference
        core.discard(fast.record)
        start = prefixes.start(job, plan, core.reference(job)) if prefix else None
        fast = core.judged(runs_as, plan, start, tails=prefix)
    if not fast.verdict.passed:
        if fast.used and not allowed.defer:
            return slow_judged(core, job, plan, fast, start)
        if fast.used:  # a search's failure steers its shrinking; the plan it reports is settled
            shortcuts.defer(job, plan, fast, start)
        prefixes.failed(job, core.reference(job), plan, start, fast.verdict, fast.verdict)
        return fast.record, fast.verdict
    if fast.used and shortcuts.take_audit(job):  # --spotchaos-audit: a pass through a shortcut, proven slow
        slow_path = core.judged(slow(job), plan, None)
        if not slow_path.verdict.passed:
            result = shortcuts.disagreed(job, plan, fast, slow_path, audit=True)
            prefixes.failed(job, core.reference(job), plan, start, result.verdict, fast.verdict)
            return result.record, result.verdict
    if allowed.reuse:
        shortcuts.passed(job, plan, fast, start)
    return fast.record, fast.verdict


def slow_judged(core: Core, job: JobSpec, plan: Plan, fast: Judged, start: Prefix | None) -> tuple[RunRecord, Verdict]:
    """A failure through a shortcut judged again on the slow path: the slow failure is the verdict;
    a slow pass is a disagreement (a failure too), unless the harness proves its copy changed or its
    crash point never fired through the shortcut (a run that tested nothing)."""
    slow_path = core.judged(slow(job), plan, None)
    why = start.changed() if start is not None else None
    if why is None and missed_crash_point(plan, fast.record, fast.verdict.failures):
        tries = len(fast.record.missed_tries) + 1
        why = (
            f"{fast.record.unfired[0].split(':', 1)[0]} through it in {tries} run(s): the job's file-system "
            "events fell otherwise than in its reference, and those runs tested nothing"
        )
    if slow_path.verdict.passed and why is not None:
        result = core.shortcuts.explained(job, plan, fast, slow_path, why)
    elif slow_path.verdict.passed:
        result = core.shortcuts.disagreed(job, plan, fast, slow_path, audit=False)
    else:
        core.discard(fast.record)
        core.shortcuts.confirmed(job, plan)
        result = slow_path
    core.prefixes.failed(job, core.reference(job), plan, start, result.verdict, fast.verdict)
    return result.record, result.verdict


def noise_first(core: Core, job: JobSpec, verdict: Verdict) -> None:
    """A resume whose evidence fits noise (a loss that differs with nothing else beside it, or the
    final weights alone), of a job whose noise was never measured (``determinism_runs`` unset): a
    second uninterrupted run says first whether the job differs run to run without any preemption,
    which no resume cause would explain (issue 60)."""
    divergence = verdict.first_divergence
    # noise fits a loss that differs (and the state it drags along): not in attempt 0 (the verdict's
    # own "not deterministic" already), with no input fingerprint differing beside it (a batch, an
    # RNG digest, a learning rate name a restore) and no cause the framework's integration gave; or
    # the final weights alone
    named = {divergence.field, *divergence.also_differs} & RESTORED_INPUTS if divergence is not None else set()
    fits_noise = (
        divergence.attempt > 0 and not named and not divergence.caveats
        if divergence is not None
        else bool(verdict.differing_tensors)
    )
    if verdict.passed or not fits_noise or job.exactness != "bit" or job.determinism_runs is not None:
        return
    audit, _ = core.references.second_run(job)
    if not audit.reproducible:
        raise NotDeterministic(
            f"job {job.name!r} is not deterministic without any preemption: {audit.text()} (a second uninterrupted "
            "run, made because a resumed run differed: that difference may be the job's own, not the resume's); no "
            f"resume can be judged bit for bit. Hint: {HINT}"
        )


def judged_until_fired(core: Core, job: JobSpec, plan: Plan, start: Prefix | None, *, tails: bool = False) -> Judged:
    """A run whose only failure is a crash point counted from a step that never fired tested
    nothing: the job's file-system events fell otherwise than in its reference (a checkpoint
    written in a thread lands before or after a step by its timing). It is run again, at most
    ``CRASH_POINT_TRIES`` runs in all, and the record keeps each miss; a crash point that never
    fires in any of them fails as before."""
    missed: list[str] = []
    while True:
        judged = core.judged_once(job, plan, start, tails=tails)
        noise_first(core, job, judged.verdict)
        if len(missed) + 1 >= CRASH_POINT_TRIES or not missed_crash_point(plan, judged.record, judged.verdict.failures):
            judged.record.missed_tries = missed
            return judged
        missed.append(judged.record.unfired[0])
        core.discard(judged.record)

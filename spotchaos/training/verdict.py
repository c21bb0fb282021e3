"""Is the preempted run the run it would have been? Pure functions, no I/O.

The reference is one uninterrupted run of the same job. The chaos run passes only if every
step's loss (and every fingerprint the trainer reports beside it) equals the reference bit for
bit, replayed steps included; no step is missing; the final per-tensor digests are equal; every
SIGTERM was answered inside the grace window by a checkpoint and a clean exit; and every
restart resumed from the newest checkpoint that was durable (or said why it rolled back).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

from ..config.exit_status import ExitExpectation
from ..faults import traits
from ..faults.checkpoint import Damage
from .continuity import continuity_failures
from .determinism import HINT, Envelope
from .engine.landing import untested
from .trajectory import Attempt, FaultRecord, RunRecord, StepRecord

EXIT_0 = ExitExpectation()  # the contract's default: exit 0 after a notice's checkpoint

# What a fingerprint that diverges together with the loss usually means.
FINGERPRINT_HINTS = {
    "lr": "the learning rate differs: LR scheduler (or optimizer param groups) not restored?",
    "batch": "the batch differs: data order or position in the epoch not restored?",
    "epoch": "the epoch counter differs: the job resumed into another epoch than this step belongs to (a "
    "checkpoint written between two epochs?)",
    "rng": "the RNG state differs: python/numpy/torch RNG state not saved or not restored?",
    "opt": "the optimizer state differs: optimizer state (moments, step counts) not saved or not restored, "
    "or saved before the optimizer step finished?",
}

# A batch that differs only some steps after the resume: the position was restored, a later order not.
LATER_BATCH_HINT = (
    "the batch differs, and the {agreed} step{s} after the resume had the right batches: the position in the "
    "epoch was restored, the order of what came later was not. At an epoch's start that is the next epoch's "
    "shuffling: a sampler's epoch not set, or its generator restored in another state (torchdata 0.11.0's "
    "StatefulDataLoader with shuffle=True, generator=g and num_workers=0 does this: give the sampler and the "
    "loader a generator each, docs/frameworks.md)"
)


@dataclass
class Divergence:
    step: int
    attempt: int
    field: str  # "loss" or the name of a fingerprint
    reference: Any
    observed: Any
    resumed_from: int | None  # the checkpoint step this attempt resumed after, if any
    also_differs: list[str] = field(default_factory=list)
    agreeing: list[str] = field(default_factory=list)  # fingerprints both runs reported, still equal
    # what the job's framework integration knew of the checkpoint resumed from, or of the resume
    # itself (a JIT checkpoint written mid-step, a checkpoint without RNG state): the likeliest cause
    caveats: list[str] = field(default_factory=list)

    def describe(self) -> str:
        where = f"step {self.step} (attempt {self.attempt}"
        if self.resumed_from == -1:  # the restart counted from the start again
            where += ", its steps counted from the start again" if self.step == 0 else ", after a restart from step 0"
        elif self.resumed_from is not None:
            distance = self.step - self.resumed_from
            where += (
                ", the first step after resuming from step " + str(self.resumed_from)
                if distance == 1
                else f", {distance} steps after resuming from step {self.resumed_from}"
            )
        where += ")"
        text = f"{self.field} diverged at {where}: reference {_show(self.reference)}, got {_show(self.observed)}"
        hints = [self._hint(f) for f in dict.fromkeys([self.field, *self.also_differs]) if f in FINGERPRINT_HINTS]
        others = [f for f in self.also_differs if f != self.field]
        if others:
            text += f"; also differs at that step: {', '.join(others)}"
        if self.caveats:
            text += "; cause: " + " ".join(self.caveats)
        if not hints:
            hints = self._timing_hints()
        if hints:
            text += "; hint: " + " ".join(hints)
        return text

    def _hint(self, fingerprint: str) -> str:
        """What a differing fingerprint usually means; for a batch, where it differs says more: a
        divergence is the first difference, so the batches of the steps since the resume agreed."""
        distance = None if self.resumed_from is None else self.step - self.resumed_from
        if fingerprint == "batch" and distance is not None and distance > 1:
            return LATER_BATCH_HINT.format(agreed=distance - 1, s="" if distance == 2 else "s")
        return FINGERPRINT_HINTS[fingerprint]

    def _timing_hints(self) -> list[str]:
        """Without a fingerprint that names the cause, where the divergence sits still narrows it.

        The first step after a resume computes its loss from the restored weights before any
        update: if it differs, what that step *draws* differs (dropout masks, augmentation: RNG
        state; or the batch itself). If it matched and the next one did not, the *update* differs:
        optimizer moments, LR scheduler or gradient-scaler state.
        """
        if self.resumed_from is None:
            return []
        if self.resumed_from == -1:  # the restart printed step 0 again: no resume a hint could explain
            return [
                "the restart reported its first step again, as a fresh start does, but not with a fresh start's "
                "loss: it restored state while counting its steps from the start again, or the job differs run to "
                "run from its very first step"
            ]
        distance = self.step - self.resumed_from
        if distance == 1:
            if "batch" in self.agreeing:
                return [
                    "the first step after resuming differs while its batch is the same: the RNG state "
                    "(dropout masks, augmentation) was not saved or not restored?"
                ]
            return [
                "the very first step after resuming differs, before any update from the restored state: the RNG "
                "state (dropout masks, augmentation, shuffling) or the data order/position was not restored?"
            ]
        if distance == 2:
            return [
                "the first step after resuming matched and the next did not, so the restored update differs: "
                "optimizer state (moments, step counts), LR scheduler or gradient scaler not restored?"
            ]
        return []


def _show(value: Any) -> str:
    if isinstance(value, str) and value.startswith(("0x", "-0x")):
        try:
            return f"{value} ({float.fromhex(value)!r})"
        except ValueError:
            pass
    return repr(value)


@dataclass
class GraceResult:
    attempt: int
    fault: str
    signal_step: int
    exit_seconds: float | None
    grace_seconds: float
    exit_code: int | None
    checkpoint_step: int | None  # newest checkpoint the attempt wrote at or after the signal
    steps_after_notice: int  # steps the job still ran after the signal: the notice's latency in steps
    ok: bool


@dataclass
class Verdict:
    passed: bool
    failures: list[str]
    first_divergence: Divergence | None
    missing_steps: list[int]
    unexpected_steps: list[int]
    differing_tensors: list[str]
    lost_steps: int
    grace: list[GraceResult]
    reference_steps: int
    damage: list[DamageOutcome] = field(default_factory=list)
    precision: str = "bit-exact"  # what "equal" meant: see precision_note
    state_difference: dict[str, Any] | None = None  # the first checkpoint after a resume that differs
    warnings: list[str] = field(default_factory=list)  # what passed here but would fail where the job runs

    def message(self) -> str:
        if self.passed:
            return self.precision
        text = "\n".join(f"- {f}" for f in self.failures)
        if self.precision != "bit-exact":
            text += f"\n  (what was compared: {self.precision})"
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _compare_step(ref: StepRecord, got: StepRecord) -> list[str]:
    """Names of the fields that differ: "loss" first, then fingerprints both runs report."""
    fields = ["loss"] if ref.loss != got.loss else []
    for name in sorted(set(ref.fingerprints) & set(got.fingerprints)):
        if ref.fingerprints[name] != got.fingerprints[name]:
            fields.append(name)
    return fields


def counter_restarts(reference: RunRecord) -> bool:
    """Whether the job's step numbers go back during its uninterrupted run (a counter per epoch)."""
    numbers = [s.step for s in reference.steps]
    return any(later <= earlier for earlier, later in itertools.pairwise(numbers))


def _resume_points(attempts: list[Attempt]) -> dict[int, int | None]:
    """For each attempt, the step it resumed after (from its resume event or its first step)."""
    points: dict[int, int | None] = {}
    for attempt in attempts:
        resumes = attempt.of_rank("resume")
        if resumes:
            points[attempt.index] = resumes[0]["from_step"]
        elif attempt.index > 0 and attempt.steps:
            points[attempt.index] = attempt.steps[0].step - 1
        elif attempt.index > 0 and attempt.final is not None and attempt.final["step"] >= 0:
            points[attempt.index] = attempt.final["step"]  # nothing was left to train: it resumed after the last step
        else:
            points[attempt.index] = None
    return points


def find_divergence(
    reference: RunRecord,
    chaos: RunRecord,
    resumed: dict[int, int | None] | None = None,
    envelope: Envelope | None = None,
) -> Divergence | None:
    """The chronologically first step occurrence in ``chaos`` that differs from the reference
    (bit for bit, or beyond the job's measured envelope)."""
    by_step = {s.step: s for s in reference.steps}
    resumed = resumed if resumed is not None else _resume_points(chaos.attempts)
    compare = envelope.step_differences if envelope is not None else _compare_step
    for got in chaos.steps:
        ref = by_step.get(got.step)
        if ref is None:
            continue
        differing = compare(ref, got)
        if differing:
            main = differing[0]
            ref_value = ref.loss if main == "loss" else ref.fingerprints[main]
            got_value = got.loss if main == "loss" else got.fingerprints[main]
            agreeing = sorted((set(ref.fingerprints) & set(got.fingerprints)) - set(differing))
            return Divergence(
                step=got.step,
                attempt=got.attempt,
                field=main,
                reference=ref_value,
                observed=got_value,
                resumed_from=resumed.get(got.attempt),
                also_differs=differing[1:],
                agreeing=agreeing,
                caveats=_caveats(chaos.attempts, got.attempt, batch_agrees="batch" in agreeing),
            )
    return None


def _caveats(attempts: list[Attempt], index: int, *, batch_agrees: bool = False) -> list[str]:
    """What a framework integration said of attempt ``index``'s resume and of the checkpoint it
    resumed from (a ``caveat`` field of the resume and checkpoint events), once each. A caveat of
    the data's position (``data_caveat``) is left out where the divergent step's batch agrees: the
    job put the data where it belonged by itself (a sampler that skips the trained batches)."""
    attempt = next((a for a in attempts if a.index == index), None)
    resumes = attempt.of_rank("resume") if attempt is not None else []
    if not resumes:
        return []
    uri = resumes[0].get("uri")
    said = [resumes[0].get("caveat")]
    # what the checkpoint resumed from was, as written (the last writer of its name before the attempt)
    written = [e for a in attempts if a.index < index for e in a.of_rank("checkpoint") if e.get("uri") == uri]
    said += [written[-1].get("caveat")] if written else []
    said += [None if batch_agrees else resumes[0].get("data_caveat")]  # a guess, after what is known
    return list(dict.fromkeys(c for c in said if isinstance(c, str) and c))


def _grace_results(chaos: RunRecord, exit_after: ExitExpectation) -> list[GraceResult]:
    results = []
    for attempt in chaos.attempts:
        fault = attempt.fault
        if fault is None or fault.grace_seconds is None:
            continue
        ckpts = [e["step"] for e in attempt.of_kind("checkpoint") if e["step"] >= fault.observed_step]
        # a checkpoint after the signal, unless training ended before the notice could matter
        # torchrun's agent exits 1 on the notice it forwarded: the ranks' checkpoint says how they ended
        exited = exit_after.matches(attempt.exit_code) or attempt.launcher_signalled
        ok = not fault.grace_exceeded and exited and (bool(ckpts) or attempt.final is not None)
        results.append(
            GraceResult(
                attempt=attempt.index,
                fault=fault.fault,
                signal_step=fault.observed_step,
                exit_seconds=fault.exit_seconds,
                grace_seconds=fault.grace_seconds,
                exit_code=attempt.exit_code,
                checkpoint_step=max(ckpts) if ckpts else None,
                steps_after_notice=sum(1 for s in attempt.steps if s.step > fault.observed_step),
                ok=ok,
            )
        )
    return results


def _open_phase(attempt: Attempt) -> tuple[str, int | None] | None:
    """The phase the job was inside when it ended (``probe.phase``: begun, no end reported), and
    the step after which it began; None when it was in none."""
    open_phases: list[tuple[str, int | None]] = []
    for event in attempt.of_rank("phase", 0):
        name, state = str(event.get("name")), event.get("state")
        if state == "begin":
            open_phases.append((name, event.get("step")))
        elif state == "end" and any(n == name for n, _ in open_phases):
            index = max(i for i, (n, _) in enumerate(open_phases) if n == name)
            del open_phases[index]
    return open_phases[-1] if open_phases else None


def _phase_grace(g: GraceResult, attempt: Attempt, signal: str) -> str | None:
    """A grace window that closed while the job was inside a phase it reports: named with it (None:
    it was in none). A job that reports its notice got it; one read from its lines may not have."""
    inside = _open_phase(attempt)
    if inside is None:
        return None
    name, began = inside
    where = f"its {name!r} phase (begun after step {began}, no end reported)"
    window = f"the {g.grace_seconds:g}-s window of {signal} closed, so it was SIGKILLed before any checkpoint"
    if attempt.of_kind("notice"):
        return (
            f"grace window exceeded: the trainer received the notice but was still inside {where} when {window}: "
            f"the {name} phase ran on past the notice — end it on a notice (check the flag inside its loop), "
            "then checkpoint"
        )
    return (
        f"grace window exceeded: the job was still inside {where} when {window}; it reports no notice, so "
        f"whether it saw the signal is unknown: if it handles SIGTERM, the {name} phase ran on past it — end it "
        "on a notice, then checkpoint"
    )


def _grace_failure(g: GraceResult, attempt: Attempt, exit_after: ExitExpectation) -> str:
    """Why the notice's checkpoint is missing, from the first evidence that explains it: the
    launcher killed the ranks, the window ran out, or the job exited (or lost its nodes) without it."""
    signal = f"{g.fault} after step {g.signal_step} (attempt {g.attempt})"
    if attempt.launcher_killed:
        return _killed_by_launcher(g, attempt, signal)
    if attempt.fault is not None and attempt.fault.grace_exceeded:
        return _window_exceeded(g, attempt, attempt.fault, signal)
    return _no_checkpoint(g, attempt, exit_after, signal)


def _killed_by_launcher(g: GraceResult, attempt: Attempt, signal: str) -> str:
    after = attempt.launcher_shutdown_seconds
    if g.grace_seconds > after:
        trap = "the 30-second trap: " if after == 30 else ""
        return (
            f"{trap}torchrun's agent SIGKILLed the ranks {after:g} s after forwarding {signal}, before their "
            f"emergency checkpoint was durable, although the provider's grace is {g.grace_seconds:g} s; the "
            f"agent's {after:g} s is its --shutdown-timeout: launch with --shutdown-timeout={g.grace_seconds:g} "
            "(torch 2.11 and later; the job's shutdown_timeout_seconds here) or finish the checkpoint within it "
            "(save less on notice, or checkpoint more often so the notice only finishes a step)"
        )
    return (
        f"torchrun's agent SIGKILLed the ranks {after:g} s after forwarding {signal}, before their emergency "
        f"checkpoint was durable: under torchrun it must finish within the agent's --shutdown-timeout ({after:g} s)"
    )


def _window_exceeded(g: GraceResult, attempt: Attempt, fault: FaultRecord, signal: str) -> str:
    if provider := traits(g.fault).metadata:  # posted on the instance metadata, no signal sent
        return (
            f"grace window exceeded: the job did not exit within {g.grace_seconds:g} s of {signal}, a reclaim "
            f"notice posted on {provider}'s instance metadata with no SIGTERM, so it was SIGKILLed; "
            f"{fault.detail or 'the metadata was not read'}: poll the metadata for the notice "
            "(on this cloud no signal may come before the kill)"
        )
    if fault.detail and not attempt.of_kind("notice"):
        return (
            f"the signal never reached the trainer: {signal} was not answered within {g.grace_seconds:g} s "
            f"and the trainer reported no notice; {fault.detail}"
        )
    if (in_phase := _phase_grace(g, attempt, signal)) is not None:
        return in_phase
    if attempt.of_kind("notice"):
        return (
            f"grace window exceeded: the trainer received the notice but did not exit within "
            f"{g.grace_seconds:g} s of {signal}, so it was SIGKILLed — is its checkpoint too slow for the window?"
        )
    said = next((e.get("text") for e in attempt.of_kind("caveat") if e.get("about") == "sigterm"), None)
    return (
        f"grace window exceeded: the job did not exit within {g.grace_seconds:g} s of {signal}, so it "
        "was SIGKILLed — "
        + (f"cause: {said}" if said else "does the trainer handle SIGTERM (checkpoint, then exit 0)?")
    )


def _no_checkpoint(g: GraceResult, attempt: Attempt, exit_after: ExitExpectation, signal: str) -> str:
    newest = [e["step"] for e in attempt.of_kind("checkpoint")]
    if g.exit_code is None:  # the launcher ran on and restarted the group (Ray Train, at the deadline)
        return (
            f"no checkpoint at or after step {g.signal_step} after {signal} before the grace window's end took "
            f"the group's nodes (its newest checkpoint: {max(newest) if newest else 'none'}): every step since "
            "was trained again"
        )
    if traits(g.fault).reclaims:  # the window's end took the node and the job with it
        return (
            f"no checkpoint at or after step {g.signal_step} after {signal}, one node's notice that only that "
            f"node's ranks received, before the grace window's end took the node (its newest checkpoint: "
            f"{max(newest) if newest else 'none'}): every step since was trained again — do the ranks agree on a "
            "notice (one all-reduce of the flag a step)? A rank that saves alone waits in a collective the others "
            "never join"
        )
    if not exit_after.matches(g.exit_code) and exit_after.expected != 0:
        return exit_after.failure(g.exit_code, signal, g.exit_seconds or 0)
    if g.exit_code != 0 and not exit_after.matches(g.exit_code):
        return (
            f"the job exited with status {g.exit_code} {g.exit_seconds or 0:.2f} s after {signal} instead of "
            "checkpointing and exiting 0"
            + (
                " — a group-wide SIGTERM also reaches DataLoader workers; do they ignore it?"
                if traits(g.fault).whole_group and not traits(g.fault).warns
                else ""
            )
        )
    return (
        f"no checkpoint at or after step {g.signal_step} after {signal}; it exited {g.exit_code} "
        f"(newest checkpoint of that attempt: {max(newest) if newest else 'none'})"
    )


@dataclass
class DamageOutcome:
    """A checkpoint fault and what the job did about it."""

    attempt: int  # the attempt that resumed after the damage
    fault: str
    checkpoint: str
    file: str | None
    detail: str
    damaged_step: int | None
    expected_resume: int | None
    resumed_from: int | None
    rolled_back: bool
    ok: bool
    problem: str | None


def _judge_damage(attempt: Attempt, start: int, damage: Damage) -> DamageOutcome:
    expected = -1 if damage.expected_resume is None else damage.expected_resume
    rolled_back = bool(attempt.of_kind("rollback"))
    name = Path(damage.checkpoint).name
    what = (
        f"{damage.fault} on {name}"
        + (f"/{damage.file}" if damage.file and damage.file != name else "")  # a one-file checkpoint: once
        + (f" ({damage.detail})" if damage.detail else "")
    )
    problem = None
    if damage.makes_unloadable and start == damage.damaged_step and _resumed_another_copy(attempt, damage):
        pass  # a second copy of the same step (Lightning's last.ckpt beside epoch=E-step=S.ckpt), untouched
    elif damage.makes_unloadable and start == damage.damaged_step:
        problem = (
            f"silent bad load: attempt {attempt.index} resumed from the damaged checkpoint after step "
            f"{damage.damaged_step} ({what})" + ("" if rolled_back else " without reporting a rollback")
        )
    elif start < expected:
        cause = "trusted a stale or torn 'latest' pointer? " if not damage.makes_unloadable else ""
        problem = (
            f"attempt {attempt.index} resumed after step {start}, but the newest intact checkpoint was after step "
            f"{expected} ({what}): {cause}work was lost"
        )
    elif damage.needs_rollback and start == expected and not rolled_back:
        problem = (
            f"attempt {attempt.index} skipped the damaged checkpoint ({what}) without saying so: "
            "report a 'rollback' event (probe.rollback) when a checkpoint does not verify"
        )
    return DamageOutcome(
        attempt=attempt.index,
        fault=damage.fault,
        checkpoint=damage.checkpoint,
        file=damage.file,
        detail=damage.detail,
        damaged_step=damage.damaged_step,
        expected_resume=damage.expected_resume,
        resumed_from=None if start < 0 else start,
        rolled_back=rolled_back,
        ok=problem is None,
        problem=problem,
    )


def _reported_path(uri: str) -> PurePosixPath:
    """The path of a checkpoint as the job reported it: a ``file:`` URI decoded ("+" is "%2B" in a
    URI), a plain path as it is."""
    return PurePosixPath(unquote(urlparse(uri).path) if uri.startswith("file:") else uri)


def _resumed_another_copy(attempt: Attempt, damage: Damage) -> bool:
    """Whether the attempt says it resumed from another checkpoint beside the damaged one, of the same
    step: a job that saves each step twice (a named checkpoint and a ``last`` copy) loses nothing
    when one copy is damaged. Judged from the resume event alone (a copy that is a link to the damaged file
    would load it, and its divergence shows in the losses and weights)."""
    resumes = attempt.of_kind("resume")
    uri = resumes[0].get("uri") if resumes else None
    if not isinstance(uri, str) or not uri:
        return False
    path = _reported_path(uri)
    damaged = PurePosixPath(damage.checkpoint)
    return path.is_absolute() and path.parent == damaged.parent and path != damaged


def _rotated_away(attempt: Attempt, start: int, durable_uris: dict[str, int], removed: dict[str, int]) -> str | None:
    """A restart that resumed before a durable checkpoint the job itself had deleted, while nothing
    durable was left newer than where it resumed: its rotation removed the last complete checkpoint
    before the newer one was (an asynchronous save that deletes older checkpoints when the save is
    handed off, not when it is written)."""
    gone = {uri: step for uri, step in durable_uris.items() if uri in removed and step > start}
    left = [step for uri, step in durable_uris.items() if uri not in removed and step > start]
    if not gone or left:
        return None
    uri, step = max(gone.items(), key=lambda item: item[1])
    name = _reported_path(uri).name
    return (
        f"attempt {attempt.index} resumed after step {start}: the checkpoint after step {step} ({name}) was durable, "
        f"but the job deleted it in attempt {removed[uri]} before a newer checkpoint was: its rotation removed the "
        "last complete checkpoint (delete an older checkpoint only once the newer one is written: with an "
        "asynchronous save, such as Lightning's AsyncCheckpointIO, once its write has finished)"
    )


def _after_crash(attempt: Attempt, start: int, durable: int, crashed: Attempt) -> str:
    """A restart after a crash point that did not resume from the newest checkpoint durable before
    it: what was seen, and a cause only where the job's own events give it (its rollbacks name the
    checkpoints it found damaged); otherwise whether the checkpoint was unloadable or never looked
    for is not known."""
    crash = f"crash {crashed.fault.detail if crashed.fault else ''} in attempt {crashed.index}".replace("  ", " ")
    before = f"a checkpoint after step {durable} had been durable before the crash"
    skipped = [_reported_path(str(e.get("skipped_uri"))).name for e in attempt.of_kind("rollback")]
    if skipped:
        where = "started from scratch" if start < 0 else f"resumed after step {start}"
        return (
            f"{crash} left neither the old nor the new checkpoint loadable: attempt {attempt.index} found "
            f"{', '.join(skipped)} damaged (its rollback events) and {where}, although {before}"
        )
    if start < 0:
        return (
            f"{crash}: attempt {attempt.index} started from scratch, although {before}; it loaded no checkpoint and "
            "reported no rollback, so whether none was loadable or none was looked for is not known"
        )
    return (
        f"{crash}: attempt {attempt.index} resumed after step {start}, although {before}; it reported no rollback, "
        "so whether the crash damaged the newer checkpoint or the restart passed it over is not known"
    )


def _resume_unknown(attempt: Attempt, durable: int) -> str:
    """A job whose step counter restarts (per epoch) and that reports no resume point: where it
    resumed cannot be told from its step numbers."""
    first = attempt.steps[0].step if attempt.steps else None
    return (
        f"where attempt {attempt.index} resumed is unknown: its first step line said step {first}, but the job's "
        "step counter restarts during its uninterrupted run (per epoch?), so a step number is no position; the "
        f"newest durable checkpoint was after step {durable}. Report a global step, or the resume point "
        "(probe.resume), to have the resume checked"
    )


def _lost_or_recounted(attempt: Attempt, start: int, durable: int, fresh: StepRecord | None) -> str:
    """A restart that resumed before the newest durable checkpoint. Where it printed step 0 again,
    its first loss tells a fresh start (the reference's step-0 loss: the checkpoint ignored, work
    lost) from a restart that restored state yet counted its steps from 0 again (a step or epoch
    counter saved or restored wrong: the tutorial's ``EPOCHS_RUN`` that names the epoch it saved)."""
    first = attempt.steps[0] if attempt.steps else None
    if (
        start == -1
        and first is not None
        and fresh is not None
        and first.step == fresh.step
        and first.loss != fresh.loss
    ):
        return (
            f"attempt {attempt.index} counted its steps from {first.step} again although a checkpoint after step "
            f"{durable} was durable, yet its first loss, {_show(first.loss)}, is not a fresh start's "
            f"({_show(fresh.loss)}): it did not start afresh but restored state (the weights?) with its step count "
            "begun again; the step or epoch counter it saves in its checkpoint, or restores, is the likely cause "
            "(work was redone, not lost)"
        )
    return (
        f"attempt {attempt.index} resumed after step {start} although a checkpoint after step "
        f"{durable} was durable and no rollback was reported: work was lost silently"
    )


def _resume_checks(
    chaos: RunRecord, resumed: dict[int, int | None], counts_per_epoch: bool = False, fresh: StepRecord | None = None
) -> tuple[list[str], list[DamageOutcome]]:
    """Each restart must resume from the newest checkpoint that is durable and intact: the newest
    reported durable, or, after a checkpoint fault, the newest one the fault left intact.
    ``counts_per_epoch``: the job's step numbers restart in its uninterrupted run; ``fresh``: the
    uninterrupted run's first step, what a fresh start reports."""
    failures: list[str] = []
    outcomes: list[DamageOutcome] = []
    durable: int | None = None
    previous: Attempt | None = None
    damage: Damage | None = None  # applied before a restart, judged at the first restart that resumes
    durable_uris: dict[str, int] = {}  # every checkpoint reported durable so far -> its step
    removed: dict[str, int] = {}  # durable checkpoints the job reported deleting -> the attempt that did
    for attempt in chaos.attempts:
        if attempt.failed_restart:
            continue  # it never resumed: the failure says why
        point = resumed[attempt.index]
        crashed_before_resuming = point is None and not attempt.steps and attempt.fault is not None
        if previous is not None and not crashed_before_resuming:
            start = -1 if point is None else point
            if damage is not None:
                outcome = _judge_damage(attempt, start, damage)
                outcomes.append(outcome)
                if outcome.problem:
                    failures.append(outcome.problem)
                damage = None
            elif (rotated := _rotated_away(attempt, start, durable_uris, removed)) is not None:
                failures.append(rotated)
            elif durable is not None and start < durable and counts_per_epoch and not attempt.of_kind("resume"):
                failures.append(_resume_unknown(attempt, durable))
            elif previous.fault is not None and traits(previous.fault.fault).armed_by_environment:
                if durable is not None and start < durable:
                    failures.append(_after_crash(attempt, start, durable, previous))
            elif durable is not None and start < durable and not attempt.of_kind("rollback"):
                failures.append(_lost_or_recounted(attempt, start, durable, fresh))
            elif attempt.of_kind("rollback"):
                # a rollback skips what did not verify, and only that: nothing here was damaged, so
                # the newest durable checkpoint it did not skip must still be the one resumed
                skipped = {e["skipped_uri"] for e in attempt.of_kind("rollback")}
                intact = [step for uri, step in durable_uris.items() if uri not in skipped]
                if intact and start < max(intact):
                    failures.append(
                        f"attempt {attempt.index} rolled back past an intact checkpoint: it resumed after step "
                        f"{start}, but the checkpoint after step {max(intact)} was durable and not the one it "
                        "skipped (does the resume trust a 'latest' pointer with no fallback?)"
                    )
        for event in attempt.of_kind("checkpoint"):
            durable_uris[event["uri"]] = event["step"]
            removed.pop(event["uri"], None)  # written again under the same name: there again
        for event in attempt.of_kind("removed"):
            if event["uri"] in durable_uris:
                removed[event["uri"]] = attempt.index
        steps = [e["step"] for e in attempt.of_kind("checkpoint")]
        if steps:
            durable = max(steps) if durable is None else max(durable, *steps)
        if attempt.damage is not None and attempt.damage.applied:
            damage = attempt.damage
        previous = attempt
    return failures, outcomes


def judge(
    reference: RunRecord,
    chaos: RunRecord,
    envelope: Envelope | None = None,
    *,
    faulted_from_start: bool = False,
    exit_after: ExitExpectation = EXIT_0,
) -> Verdict:
    """Compare a chaos run with the uninterrupted reference run of the same job: bit for bit, or
    within the ``envelope`` the job's own uninterrupted runs measured (exactness = "envelope").
    ``exit_after``: the exit a notice must end in where the job runs (config/exit_status.py).
    ``faulted_from_start``: faults acted from the first step (storage faults), so a difference in
    attempt 0 is theirs to explain, not the job's own non-determinism."""
    failures: list[str] = []
    ref_steps = sorted({s.step for s in reference.steps})
    got_steps = {s.step for s in chaos.steps}
    missing = sorted(set(ref_steps) - got_steps)
    unexpected = sorted(got_steps - set(ref_steps))

    for unfired in chaos.unfired:  # a plan that preempted nothing proves nothing: never a pass
        failures.append(f"planned fault {unfired}: the run proves nothing about it (preempt a step the job reaches)")
    last_step = ref_steps[-1] if ref_steps else -1
    for attempt in chaos.attempts:  # a fault that landed late past what it was to test proves another plan
        if attempt.fault is not None and (why := untested(attempt.fault, last_step)):
            failures.append(why)
    failed_restarts = [a.failed_restart for a in chaos.attempts if a.failed_restart]
    failures.extend(failed_restarts)  # what follows from it (missing steps, no final) would only repeat it
    resumed = _resume_points(chaos.attempts)
    divergence = find_divergence(reference, chaos, resumed, envelope)
    if divergence is not None and divergence.attempt == 0 and not faulted_from_start:
        failures.append(_not_deterministic(divergence, chaos, envelope))
    elif divergence is not None:
        failures.append(divergence.describe())
    if missing and not failed_restarts:
        failures.append(_missing_steps(missing, resumed) + _ended_early(missing, ref_steps, got_steps, chaos))
    if unexpected:
        failures.append(_unexpected_steps(unexpected, chaos))
    differing, final_failure = _final_weights(reference, chaos, envelope, failed_restarts)
    failures.extend([final_failure] if final_failure else [])

    grace = _grace_results(chaos, exit_after)
    attempts = {a.index: a for a in chaos.attempts}
    failures.extend(_grace_failure(g, attempts[g.attempt], exit_after) for g in grace if not g.ok)
    warnings = list(dict.fromkeys(filter(None, (exit_after.warning(g.exit_code) for g in grace))))
    fresh = reference.steps[0] if reference.steps else None
    resume_failures, damage = _resume_checks(chaos, resumed, counter_restarts(reference), fresh)
    failures.extend(resume_failures)
    failures.extend(continuity_failures(chaos.attempts))  # the logger's run and steps, the best checkpoint

    precision = precision_note(reference, chaos)
    if envelope is not None:
        precision = envelope.note() + ("" if precision == "bit-exact" else f"; {precision}")
    return Verdict(
        precision=precision,
        passed=not failures,
        failures=failures,
        first_divergence=divergence,
        missing_steps=missing,
        unexpected_steps=unexpected,
        differing_tensors=differing,
        lost_steps=max(0, len(chaos.steps) - len(reference.steps)),
        grace=grace,
        reference_steps=len(ref_steps),
        damage=damage,
        warnings=warnings,
    )


def _missing_steps(missing: list[int], resumed: dict[int, int | None]) -> str:
    """Steps the reference ran and no attempt did; a hint where one is missing exactly where a
    restart picked up (the resume point a trainer reports comes from the same counter, so the step
    at it or just after it)."""
    text = f"{len(missing)} step(s) never ran after the preemptions: {_ranges(missing)}"
    at_resume = sorted(
        (step, index)
        for index, start in resumed.items()
        if start is not None
        for step in (start, start + 1)
        if step in missing
    )
    if at_resume:
        step, index = at_resume[0]
        text += (
            f"; hint: step {step} is missing exactly where attempt {index} resumed: "
            "is the step counter restored off by one?"
        )
    return text


def _ended_early(missing: list[int], ref_steps: list[int], got_steps: set[int], chaos: RunRecord) -> str:
    """A job that stops short of the reference's last step and exits 0 believes it is done: no error
    says so, only the count of its optimizer steps."""
    last = chaos.attempts[-1] if chaos.attempts else None
    if last is None or last.exit_code != 0 or not ref_steps or ref_steps[-1] not in missing:
        return ""
    trained = max(got_steps) + 1 if got_steps else 0
    return (
        f"; the job exited 0 after {trained} optimizer step(s), {len(ref_steps) - len(got_steps)} fewer than the "
        f"reference's {len(ref_steps)}: it ended as if training were done (an epoch or step counter restored "
        "past where it was, or an epoch's remaining batches skipped?)"
    )


def _unexpected_steps(unexpected: list[int], chaos: RunRecord) -> str:
    text = f"steps the reference never ran: {_ranges(unexpected)}"
    if any(traits(f.fault).reruns for f in chaos.faults):
        text += (
            "; hint: started again after it had finished (its final checkpoint written), the job trained on: "
            "a restart after the last step must find nothing left to train"
        )
    return text


def _final_weights(
    reference: RunRecord, chaos: RunRecord, envelope: Envelope | None, failed_restarts: list[str]
) -> tuple[list[str], str | None]:
    """(the tensors whose final digests differ, the failure that says so, or that there was no
    final event at all; none after a failed restart, which says it already)."""
    ref_final, got_final = reference.final, chaos.final
    if got_final is None:
        return [], None if failed_restarts else "the preempted run never reported a 'final' event"
    if ref_final is None:
        return [], None
    ref_d, got_d = ref_final["digests"], got_final["digests"]
    differing = sorted(k for k in set(ref_d) | set(got_d) if ref_d.get(k) != got_d.get(k))
    if envelope is not None:  # tensors that differ between uninterrupted runs: see the envelope's note
        differing = envelope.final_differences(differing, chaos)
    if not differing:
        return [], None
    shown = ", ".join(differing[:8]) + (f" and {len(differing) - 8} more" if len(differing) > 8 else "")
    return differing, f"final weights differ in {len(differing)} of {len(ref_d)} tensor(s): {shown}"


def _not_deterministic(divergence: Divergence, chaos: RunRecord, envelope: Envelope | None) -> str:
    """A difference before any fault reached the job: not a resume bug, its own verdict."""
    first = chaos.attempts[0].fault
    before = f"before {first.fault} after step {first.observed_step} reached it" if first else "before any fault"
    values = f"{divergence.field}: reference {_show(divergence.reference)}, got {_show(divergence.observed)}"
    if envelope is not None:
        return (
            f"the job's own noise exceeds its envelope without any preemption: attempt 0 differs from the "
            f"uninterrupted run at step {divergence.step}, {before} ({values}), by more than {envelope.factor:g}x the "
            f"spread {envelope.audit.runs} uninterrupted runs showed; measure with more runs (determinism_runs) or "
            "widen envelope_factor"
        )
    return (
        f"the job is not deterministic without any preemption: attempt 0 differs from the uninterrupted run at "
        f"step {divergence.step}, {before} ({values}); nothing was resumed yet, so this is not a resume bug. "
        f"Set determinism_runs = 3 to measure it; hint: {HINT}"
    )


def precision_note(reference: RunRecord, chaos: RunRecord) -> str:
    """How exact the comparison was: losses from the probe are exact bits; printed ones are not."""
    printed = [
        e["printed"] for run in (reference, chaos) for a in run.attempts for e in a.of_kind("step") if "printed" in e
    ]
    if not printed:
        return "bit-exact"
    from .logadapter import significant_digits

    digits = min(significant_digits(p) for p in printed)
    final = chaos.final
    if final is None:
        weights = "final weights not compared (the run did not finish)"
    elif final.get("digests"):
        weights = f"final weights compared bit for bit ({len(final['digests'])} tensors)"
    else:
        weights = "no weights digest (set final_weights in the job's log table)"
    counted = ""
    convention = chaos.convention or reference.convention or {}
    if convention.get("first_step"):
        first = convention["first_step"]
        counted = f"; steps here count from 0 (the script's step line {first} is step 0)"
    return (
        f"losses compared as printed, to {digits} significant digit(s); {weights}; "
        f"a bit-exact claim needs the probe or the weights digest{counted}"
    )


def _ranges(values: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    parts, start, prev = [], None, None
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            parts.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = v
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else str(start))
    return ", ".join(parts)

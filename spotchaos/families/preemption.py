"""Preemption and damage: run a plan (notices, hard kills, crash points, checkpoint damage between
attempts) and fail unless the resumed run is bit-exact with the reference."""

from __future__ import annotations

from ..config.jobs import JobSpec
from ..core import NONE, Allowed, Core
from ..errors import ConfigError, ScenarioFailure, SpotchaosError
from ..faults.plan import Plan
from ..record import note_run
from ..training.trajectory import RunRecord
from ..training.verdict import Verdict


class ChaosFailure(ScenarioFailure):
    """A plan under which the job did not resume bit-exact (or broke another verdict)."""

    def __init__(self, job: str, plan: Plan, verdict: Verdict, workdir: str) -> None:
        self.job, self.plan, self.verdict, self.workdir = job, plan, verdict, workdir
        super().__init__(
            f"job {job!r} under plan {plan}:\n{verdict.message()}\n  (logs and checkpoints kept in {workdir})"
        )


class DamageNotApplied(SpotchaosError):
    """A plan's checkpoint fault found nothing to damage (no durable checkpoint yet, say)."""


def check(
    core: Core,
    job: JobSpec,
    plan: Plan | str,
    ran: tuple[RunRecord, Verdict] | None = None,
    allowed: Allowed = NONE,
) -> Verdict:
    """Run one plan (a :class:`Plan` or ``"sigterm@5,sigkill@12"``); raise :class:`ChaosFailure`
    unless every verdict holds. ``ran``: the plan's run and verdict, already made (a plan run
    ahead of the search, in parallel), judged and recorded as if run now. ``allowed``: the
    shortcuts it may take (a search's plans after its first: a start from the reference's copy,
    reuse of another search's pass, the slow path's judgement deferred until ``settle``d)."""
    plan = Plan.parse(plan) if isinstance(plan, str) else plan
    if not plan.preemptions:
        raise ConfigError(f"job {job.name!r}: an empty plan preempts nothing; give at least one FAULT@STEP")
    run, verdict = ran if ran is not None else core.run(job, plan, allowed)
    skipped = [a.damage for a in run.attempts if a.damage is not None and not a.damage.applied]
    if skipped:
        raise DamageNotApplied(
            f"job {job.name!r} under plan {plan}: {skipped[0].fault} could not be applied: {skipped[0].detail}"
        )
    note_run(plan, run, verdict, core.reference(job))
    if not verdict.passed:
        raise ChaosFailure(job.name, plan, verdict, run.workdir)
    return verdict


def settle(core: Core, job: JobSpec, failure: ChaosFailure) -> ChaosFailure:
    """The failure a search reports, as the slow path judges it: the same failure where its run took
    no shortcut (or was settled already), else the slow path's verdict, noted for the report."""
    settled = core.settle(job, failure.plan)
    if settled is None:
        return failure
    run, verdict = settled
    note_run(failure.plan, run, verdict, core.reference(job))
    again = ChaosFailure(job.name, failure.plan, verdict, run.workdir)
    for note in getattr(failure, "__notes__", []):  # hypothesis's: the falsifying example, how to replay it
        again.add_note(note)
    return again

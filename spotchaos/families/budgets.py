"""Time budgets: checkpoint overhead against the job's budget (with interval advice and the cost
of a completed job), and the notice flush (SIGTERM to a durable checkpoint) against the grace window."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..budgets.advisor import advise
from ..budgets.cost import JobFigures, estimate
from ..budgets.overhead import fastest_of, measure_overhead, notice_flushes
from ..config.jobs import JobSpec
from ..config.presets import MTBF_PRESETS
from ..core import Allowed, Core
from ..errors import ScenarioFailure
from ..faults.plan import Plan, Preemption
from ..record import note_figures, note_plans
from ..training.engine.warmth import RESTARTS_COLD
from ..training.trajectory import RunRecord
from .preemption import ChaosFailure

# Uninterrupted runs an over-budget figure may take before it is judged: the first and two more.
OVERHEAD_RUNS = 3

Measure = Callable[[Callable[[], RunRecord]], RunRecord]


class BudgetFailure(ScenarioFailure):
    """A time budget (checkpoint overhead, notice flush) was exceeded, or could not be measured."""


def fresh_run(core: Core, job: JobSpec) -> RunRecord:
    """One more uninterrupted run (the overhead scenario measures on it)."""
    return core.run_once(job, Plan(), "measure")


def measured_run(core: Core, job: JobSpec, measure: Measure | None = None) -> RunRecord:
    """The uninterrupted run the overhead is read from: the reference run itself, whose steps and
    checkpoints carry the seconds the job measured (the harness's holds after its checkpoints fall
    outside both); one more run only where ``measure`` (pytest-benchmark keeping its figures) times it."""
    return measure(lambda: fresh_run(core, job)) if measure is not None else core.reference(job)


def notice_step(reference: RunRecord) -> int:
    """Where the timing run's SIGTERM lands: half-way through the reference's last checkpoint interval
    that leaves a step after it, so the run starts from that checkpoint's copy (the prefix) and trains
    a few steps instead of the whole job; half-way through the job where it reports no checkpoint."""
    total, late = len(reference.steps), reference.late_checkpoint()
    return max(0, total // 2 - 1) if late is None else late + max(1, (total - 1 - late) // 2)


def timing_run(core: Core, job: JobSpec) -> RunRecord:
    """A run with one SIGTERM late in the job, cached per job: notice flush and restart latency.

    It must itself pass every verdict; figures from a run that did not resume are meaningless.
    Its restart starts cold: it stands for a restart in production, which pays the job's imports
    (a warm start would not); the attempt the notice reaches may fork warm. It starts from the
    reference's checkpoint before the notice where the job takes prefixes: the notice and the
    restart are the same wherever.
    """
    key = ("timing", job.key())
    if key not in core.measured:
        plan = Plan((Preemption(notice_step(core.reference(job)), "sigterm"),))
        record, verdict = core.run(replace(job, warm=RESTARTS_COLD), plan, Allowed(prefix=True))
        if not verdict.passed:
            raise ChaosFailure(job.name, plan, verdict, record.workdir)
        core.measured[key] = record
    return core.measured[key]


def check_overhead(core: Core, job: JobSpec, measure: Measure | None = None) -> dict[str, Any]:
    """Checkpoint overhead against ``job.overhead_budget``, plus interval advice and cost.

    ``measure`` wraps one more uninterrupted run to measure on (the plugin passes pytest-benchmark's
    timer where it keeps its figures); without it the reference run is measured (``measured_run``).
    """
    run = measured_run(core, job, measure)
    runs = [measure_overhead(run.attempts[0], job.overhead_budget)]
    overhead = runs[0]
    while overhead.fraction is not None and not overhead.passed and len(runs) < OVERHEAD_RUNS:
        # A short run has few intervals, and one slow fsync on a busy machine can be their median:
        # an over-budget figure is measured again and each interval judged at its fastest
        # (fastest_of). A job over its budget is over it in every run.
        runs.append(measure_overhead(fresh_run(core, job).attempts[0], job.overhead_budget))
        overhead = fastest_of(runs)
    measured = [m.fraction for m in runs]
    figures: dict[str, Any] = {"overhead": {**overhead.to_dict(), "measured_fractions": measured}}
    if overhead.fraction is not None:
        restarted = timing_run(core, job).attempts[-1]
        restart = restarted.ready_seconds or 0.0
        mtbf = job.mtbf_seconds or MTBF_PRESETS["typical"]
        interval = (overhead.interval_steps or 1) * (overhead.step_seconds or 0.0)
        advice = advise(
            checkpoint_seconds=overhead.checkpoint_seconds or 0.0,
            restart_seconds=restart,
            mtbf_seconds=mtbf,
            configured_interval=interval,
        )
        cost = estimate(
            job.cost,
            JobFigures(
                step_seconds=overhead.step_seconds or 0.0,
                steps_run=len(run.steps),
                checkpoint_seconds=overhead.checkpoint_seconds or 0.0,
                interval_seconds=interval,
                restart_seconds=restart,
                mtbf_seconds=mtbf,
                checkpoint_bytes=overhead.checkpoint_bytes or 0,
            ),
        )
        figures["advice"] = advice.to_dict()
        figures["advice"]["mtbf_source"] = "job" if job.mtbf_seconds else "preset 'typical' (assumed)"
        figures["cost"] = cost.to_dict()
    note_figures(figures, passed=overhead.passed)
    note_plans(1)
    if not overhead.passed:
        raise BudgetFailure(f"job {job.name!r}: {overhead.message()}")
    return figures


def check_notice_flush(core: Core, job: JobSpec) -> None:
    """SIGTERM to durable checkpoint must take at most half the grace window."""
    flushes = notice_flushes(timing_run(core, job))
    failed = [f for f in flushes if not f.passed]
    note_figures({"notice_flush": [f.to_dict() for f in flushes]}, passed=bool(flushes) and not failed)
    note_plans(1)
    if failed or not flushes:
        detail = "; ".join(f.message() for f in failed) or "no notice was delivered"
        raise BudgetFailure(f"job {job.name!r}: {detail}")

"""The scenario record: what the report says of one scenario (one test, one job).

This module alone writes it. The runner's families call these functions with what they found;
the fixture calls them when a scenario errors or is skipped. So the rules (a failure is never
undone by a later pass, the plots show the minimal failing plan, an error is never a pass) live
in one place.

The record of the scenario running now travels in a context variable, not as a parameter through
every family: the fixture (or a Python API user) enters it, ``with ScenarioRecord(...) as record:``,
and whatever a family notes inside goes to it. Outside one, noting does nothing.
"""

from __future__ import annotations

import threading
from collections import Counter
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any

from .faults.plan import Plan
from .report.gate_cost import add_cold_reasons
from .report.gate_cost import empty as empty_cost
from .training.trajectory import RunRecord
from .training.verdict import Verdict


@dataclass
class ScenarioRecord:
    """What the report says of one scenario (one test, one job)."""

    scenario: str
    job: str
    seed: int | None
    passed: bool = True
    plans_tried: int = 0
    failing_plan: str | None = None
    verdict: dict[str, Any] | None = None
    error: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    reference: dict[str, Any] | None = None
    figures: dict[str, Any] = field(default_factory=dict)  # overhead, advice, cost, notice flush
    trajectory: dict[str, Any] | None = None  # the run shown in the plots: the failing one, else the last
    # what the scenario cost: every run made while it ran (its job's reference included, when this
    # scenario was the first to need it), in runs, starts, steps trained and seconds (note_cost)
    cost: dict[str, Any] = field(default_factory=dict)
    # what passed here but would fail where the job runs (exit 0 after a notice on a Kubernetes Job)
    warnings: list[str] = field(default_factory=list)

    def __enter__(self) -> ScenarioRecord:
        """What the families note in this context goes to this record (entries nest)."""
        self.__dict__.setdefault("_tokens", []).append(_CURRENT.set(self))
        return self

    def __exit__(self, *exc_info: object) -> None:
        _CURRENT.reset(self.__dict__["_tokens"].pop())


_CURRENT: ContextVar[ScenarioRecord | None] = ContextVar("spotchaos_scenario_record", default=None)
_COST_LOCK = threading.Lock()


def current() -> ScenarioRecord | None:
    """The record of the scenario running in this context; None outside one. A thread pool's
    threads start without it unless given a copy of the context: the search's plans run ahead in
    threads note their runs' cost there (under a lock), and their runs when the search reaches them."""
    return _CURRENT.get()


def note_run(plan: Plan, run: RunRecord, verdict: Verdict, reference: RunRecord) -> None:
    """One judged run of a plan: its summary, the reference once, the trajectory to plot, the verdict."""
    record = current()
    if record is None:
        return
    summary = {
        "plan": str(plan),
        "passed": verdict.passed,
        "wall_seconds": round(run.wall_seconds, 3),
        "attempts": len(run.attempts),
        "lost_steps": verdict.lost_steps,
        "faults": [f.__dict__ for f in run.faults],
        "damage": [asdict(d) for d in verdict.damage],  # each checkpoint fault and what the job did
        "restart_seconds": [a.start_seconds for a in run.attempts[1:]],
        "starts": [a.start_kind for a in run.attempts],
        "memory": run.memory_peaks(),
        # processes that left the job's process group (setsid, a double fork), found by the run's marker and ended
        "escaped_processes": [p for a in run.attempts for p in a.escaped],
        "not_reached": run.not_reached,  # planned faults whose attempt never started: training was already done
        # started from the reference's checkpoint after this step (attempt 0: its steps, credited); None: step 0
        "prefix_step": run.prefix_step,
        "reused": run.reused,  # run by another scenario of this session on the same job: its verdict, not run again
        # its last attempt is another plan's, which began on the same bytes (training/reference/tails.py); None: its own
        "tail_of": run.tail_of,
    }
    if run.missed_tries:  # earlier runs of the plan whose crash point never fired: run again (Core.judged)
        summary["missed_tries"] = run.missed_tries
    if run.shortcuts:  # its shortcuts and the slow path disagreed (training/shortcuts.py)
        summary["shortcuts"] = run.shortcuts
    if any(a.gpus for a in run.attempts):  # where each attempt ran: the devices it leased, and when
        summary["gpus"] = [a.gpus for a in run.attempts]
    if any(a.placement for a in run.attempts):  # the cluster node each attempt ran on
        summary["nodes"] = [a.placement for a in run.attempts]
    record.runs.append(summary)
    if record.reference is None:
        record.reference = {
            "wall_seconds": round(reference.wall_seconds, 3),
            "steps": len(reference.steps),
            "start_seconds": reference.attempts[0].start_seconds,
            "memory": reference.memory_peaks(),
            "convention": reference.convention,  # how a log-adapter script counts its steps, and whence
            "determinism": reference.audit,  # bit-reproducible or not, the mode, the envelope
            "snapshots": reference.snapshots,  # the copies plans may start from, or why there are none
            "cache": reference.cache,  # read from the reference cache, stored in it, recomputed, or why not
        }
    if record.passed or not verdict.passed:  # the plots show the last failing run (the minimal plan), else the last
        record.trajectory = {
            "plan": str(plan),
            "reference": [[step, loss] for _, step, loss in reference.series()["points"]],
            "prefix_step": run.prefix_step,  # attempt 0 is the reference's steps through it, copied
            **run.series(),
        }
    record.warnings += [w for w in verdict.warnings if w not in record.warnings]
    if not verdict.passed:
        record.passed = False
        record.failing_plan = str(plan)  # hypothesis runs the minimal plan last
        record.verdict = verdict.to_dict()
    elif record.passed:
        record.verdict = verdict.to_dict()


def note_cost(run: RunRecord, reference_steps: int | None) -> None:
    """One more run made for the scenario running now: its attempts (each a start of the job),
    the steps they trained (replays included), and its seconds: start-up (launch to the job's
    first step), training (the rest of the attempts), harness (the run's own work around them).
    ``reference_steps``: the uninterrupted run's steps, the unit of "runs' worth"."""
    record = current()
    if record is None:
        return
    with _COST_LOCK:  # plans run ahead in threads note here too
        record.cost = _add_run(record.cost or empty_cost(), run, reference_steps)


def _add_run(cost: dict[str, Any], run: RunRecord, reference_steps: int | None) -> dict[str, Any]:
    trained = run.trained  # a prefix from the reference is credited, neither started nor trained
    # a start is a launch: a group restarted in place (torchrun's agent, Ray Train's controller) is
    # an attempt of its own but no start, neither warm nor cold
    launched = [a for a in trained if not a.group_restart]
    startup = sum(a.start_seconds or 0.0 for a in trained)
    attempts = sum(a.wall_seconds for a in trained)
    cost["runs"] += 1
    cost["starts"] += len(launched)
    steps = sum(len(a.steps) for a in trained)
    cost["steps"] += steps
    tails = [a for a in run.attempts if a.start_kind == "tail"]  # another plan's last attempt, reused
    tail_steps = sum(len(a.steps) for a in tails)
    cost["prefix_steps"] = cost.get("prefix_steps", 0) + len(run.steps) - steps - tail_steps
    cost["prefix_runs"] = cost.get("prefix_runs", 0) + (run.prefix_step is not None)
    cost["tail_steps"] = cost.get("tail_steps", 0) + tail_steps
    cost["tail_runs"] = cost.get("tail_runs", 0) + bool(tails)
    cost["reference_steps"] = reference_steps if reference_steps else cost["reference_steps"]
    cost["startup_seconds"] = round(cost["startup_seconds"] + startup, 3)
    warm = [a for a in launched if a.start_kind == "warm"]
    cost["warm_starts"] += len(warm)
    cost["warm_startup_seconds"] = round(cost["warm_startup_seconds"] + sum(a.start_seconds or 0.0 for a in warm), 3)
    cold = Counter(a.start_kind.partition(": ")[2] for a in launched if a.start_kind.startswith("cold: "))
    add_cold_reasons(cost["cold_because"], cold)
    cost["training_seconds"] = round(cost["training_seconds"] + max(0.0, attempts - startup), 3)
    held = sum(a.wall_seconds * a.gpu_count for a in trained)  # a GPU is paid for from launch to exit
    cost["gpu_seconds"] = round(cost.get("gpu_seconds", 0.0) + held, 3)
    cost["harness_seconds"] = round(cost["harness_seconds"] + max(0.0, run.wall_seconds - attempts), 3)
    return cost


def note_cached_reference() -> None:
    """The job's reference was read from the reference cache, for the scenario running now: no run made."""
    record = current()
    if record is not None:
        with _COST_LOCK:
            cost = record.cost or empty_cost()
            cost["cached_references"] = cost.get("cached_references", 0) + 1
            record.cost = cost


def note_harness(seconds: float) -> None:
    """Seconds the harness spent on the scenario's runs outside them (judging a run: the state diff
    reading checkpoints in the job's confinement, the leak scan), added to its harness seconds."""
    record = current()
    if record is not None and record.cost:
        with _COST_LOCK:
            record.cost["harness_seconds"] = round(record.cost["harness_seconds"] + seconds, 3)


def note_cleared(why: str) -> None:
    """The failures noted so far were a shortcut's, which the slow path overruled (a search that
    stopped at a plan only a shortcut failed): the scenario is judged again by what follows."""
    if (record := current()) is not None:
        record.passed, record.failing_plan, record.verdict = True, None, None
        record.warnings.append(why)


def note_plans(count: int, *, add: bool = False) -> None:
    """How many plans the scenario ran (a search's count, or one more for a fixed plan)."""
    if (record := current()) is not None:
        record.plans_tried = record.plans_tried + count if add else count


def note_figures(figures: dict[str, Any], *, passed: bool = True) -> None:
    """Figures for the report (overhead, advice, cost, notice flush); a failed budget fails the record."""
    if (record := current()) is not None:
        record.figures.update(figures)
        record.passed = record.passed and passed


def note_figure_row(key: str, row: dict[str, Any]) -> None:
    """One more row of a figure the report shows as a table (a reshard, a drain): appended."""
    if (record := current()) is not None:
        record.figures.setdefault(key, []).append(row)


def note_storage(figures: dict[str, Any]) -> None:
    """One storage scenario's figures (with its problems, if any): appended, and failing the record."""
    if (record := current()) is not None:
        record.figures.setdefault("storage", []).append(figures)
        record.passed = record.passed and figures["passed"]


def note_failure(record: ScenarioRecord, plan: Plan | str | None = None, message: str | None = None) -> None:
    """A verdict failed (the plan, when the failure names one; its message, when no judged run
    carried it: a job that is not deterministic, a budget)."""
    record.passed = False
    if plan is not None:
        record.failing_plan = str(plan)
    if message is not None and (record.verdict is None or record.verdict.get("passed")):
        record.verdict = {"passed": False, "failures": [message]}


def note_error(record: ScenarioRecord, message: str) -> None:
    """The scenario could not be judged: an error, never a pass."""
    record.passed = False
    record.error = message


def as_reported(record: ScenarioRecord, *, outcome: str, replay: str = "", test_failure: str | None = None) -> dict:
    """The record as the report carries it, with pytest's outcome and the replay command. A test
    that failed although its record passed (it failed after the verdict) makes the record an
    error first: the report never shows a failed test as a pass."""
    if test_failure is not None and record.passed:
        note_error(record, f"the test failed after the scenario ran: {test_failure}")
    return {**asdict(record), "outcome": outcome, "replay": replay}

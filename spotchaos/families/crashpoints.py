"""Crash points: kills inside the job's own checkpoint writes and loads.

The crash-point hook (``spotchaos/faults/crashpoint``) numbers every file-system event a job makes under
its checkpoint directory; these functions trace a save and a restart's load, so a plan
``crash@N`` can kill the job just before any one of those events. ``crash@N`` counts those
events, not training steps.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from pathlib import Path
from typing import Any

from ..config.jobs import JobSpec
from ..core import Core
from ..errors import SpotchaosError
from ..faults.plan import Plan, Preemption
from ..training.engine.attempt import read_fs_events
from ..training.engine.options import FS_EVENTS
from ..training.trajectory import RunRecord


def trace(
    core: Core, job: JobSpec, plan: Plan, *, prefix: bool = False
) -> tuple[RunRecord, list[list[dict[str, Any]]]]:
    """Run with every file-system event under the checkpoint directory logged, per attempt that
    ran (``prefix``: from the reference's checkpoint before the plan's first fault, where it can;
    its first attempt, the reference's steps, ran nothing and logged nothing)."""
    logs: list[list[dict[str, Any]]] = []

    def read_logs(record: RunRecord) -> None:
        workdir = Path(record.workdir)
        logs.extend(read_fs_events(workdir / f"attempt-{a.index}" / FS_EVENTS) for a in record.trained)

    start = core.prefixes.start(job, plan, core.reference(job)) if prefix else None
    record = core.run_once(job, plan, "trace", read_logs, trace_fs=True, prefix=start)
    return record, logs


def save_boundaries(core: Core, job: JobSpec) -> list[dict[str, Any]]:
    """Every file-system event of one checkpoint save of the uninterrupted run: the first save
    that also rotates an old checkpoint away, else the last save. Each is a crash point.

    A save's window runs from the step before it to the step after it, not to its
    ``checkpoint`` event: a trainer may finish work in the background once the checkpoint
    is durable (the reference unlinks rotated checkpoints so), and a crash there counts too.
    """
    record, (log, *_) = _reference_trace(core, job) or trace(core, job, Plan())
    events = record.attempts[0].events
    windows = _log_save_windows(events, log) if job.log is not None else _probe_save_windows(events, log)
    windows = [w for w in windows if w]
    if not windows:
        if not any(e["event"] == "checkpoint" for e in events):
            raise SpotchaosError(f"job {job.name!r} reported no checkpoint: there is no save to crash inside")
        raise SpotchaosError(
            f"job {job.name!r}: no file-system event under its checkpoint directory fell inside a save "
            f"({len(log)} event(s) traced): does it write its checkpoints under {{checkpoint_dir}}?"
        )
    rotating = [w for w in windows[1:] if any(e["event"] in ("shutil.rmtree", "os.remove") for e in w)]
    return rotating[0] if rotating else windows[-1]


def save_crash_points(core: Core, job: JobSpec) -> list[Plan]:
    """A crash point before each file-system event of one save (``save_boundaries``): counted from
    the step the job reported before the save's first event (``crash@S+N``) where the job takes the
    reference's prefix, so the plan starts from the copy of the checkpoint before that save instead
    of from step 0; counted from the attempt's start (``crash@N``) otherwise.

    Every point of one save counts from the same step, the one before the save began: a save
    written in a thread ends one step or another by its timing, and a count from a later step
    would miss its events in a run that wrote faster (the hook's count runs on across steps)."""
    plans = []
    reference = core.reference(job)
    boundaries = save_boundaries(core, job)
    first = boundaries[0]
    anchor, since = first.get("step"), first.get("since")
    counted = _counts(anchor) and _counts(since) and since >= 1
    for boundary in boundaries:
        relative = None
        if counted:  # the events since step ``anchor``'s report: those before the save's first, then its own
            relative = Plan((Preemption(boundary["index"] - first["index"] + since, "crash", after_step=anchor),))
        if relative is not None and core.prefixes.start(job, relative, reference) is not None:
            plans.append(relative)
        else:
            plans.append(Plan((Preemption(boundary["index"], "crash"),)))
    return plans


def _counts(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _reference_trace(core: Core, job: JobSpec) -> tuple[RunRecord, list[list[dict[str, Any]]]] | None:
    """The reference's own file-system events, where it logged them (a job that takes prefixes
    does: ``core/references.py``): the uninterrupted run a save's crash points are read from."""
    reference = core.reference(job)
    log = Path(reference.workdir) / "attempt-0" / FS_EVENTS
    return (reference, [read_fs_events(log)]) if os.path.lexists(log) else None


def _probe_save_windows(events: list[dict[str, Any]], log: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A probe job stamps its events itself: a save runs from the step before it began (its
    checkpoint event's time less the seconds it says the save took: an asynchronous save reports
    once its write is done, steps after it began) to the step after its checkpoint event."""
    windows = []
    step_times: list[float] = []
    for index, event in enumerate(events):
        if event["event"] == "step":
            step_times.append(event["t"])
        elif event["event"] == "checkpoint" and step_times:
            began = event["t"] - max(0.0, float(event.get("seconds") or 0.0))
            earlier = bisect_right(step_times, began)
            before = step_times[earlier - 1] if earlier else step_times[-1]  # none before it began: the last step
            after = (e["t"] for e in events[index + 1 :] if e["event"] == "step")
            next_step_t = next(after, float("inf"))
            windows.append([e for e in log if before < e["t"] < next_step_t])
    return windows


def _log_save_windows(events: list[dict[str, Any]], log: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A log-adapter job's lines are stamped when the harness read them, a poll or a busy moment
    after the script printed them, and a checkpoint when the harness found the file. So the save
    holding the steps up to step s lies between the reading of step s-1's line and step s+1's
    (the script may print before or after it saves); with a save at every step, two saves
    share a window, and every event in it is still inside a save."""
    seen = {e["step"]: e["t"] for e in events if e["event"] == "step"}
    saved = sorted({e["step"] for e in events if e["event"] == "checkpoint"})
    windows = []
    for step in saved:
        start = seen.get(step - 1, float("-inf"))
        end = seen.get(step + 1, float("inf"))
        windows.append([e for e in log if start < e["t"] < end])
    return windows


def resume_boundaries(core: Core, job: JobSpec) -> tuple[Preemption, list[dict[str, Any]]]:
    """The reads of a restart that loads a checkpoint: a hard kill right after the newest checkpoint
    that leaves the job two steps to run, then the resume traced. Late in the job, so the traced run
    and every plan crashing in that load start from the reference's copy of that checkpoint (where
    the job takes prefixes) and train the few steps after it, not the whole job; the kill still
    lands before the job finishes."""
    reference = core.reference(job)
    steps = reference.saved_steps
    if not steps:
        raise SpotchaosError(f"job {job.name!r} reported no checkpoint: there is no load to crash inside")
    late = reference.late_checkpoint()
    kill = Preemption(late + 1 if late is not None else min(steps[0] + 1, len(reference.steps) - 2), "sigkill")
    record, logs = trace(core, job, Plan((kill,)), prefix=True)
    if len(logs) < 2:
        raise SpotchaosError(f"job {job.name!r} finished before {kill} could interrupt it")
    first_step = next((e["t"] for e in record.trained[1].of_kind("step")), float("inf"))
    return kill, [e for e in logs[1] if e["event"] == "open-read" and e["t"] < first_step]

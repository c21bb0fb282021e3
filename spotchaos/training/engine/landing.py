"""Where a fault really landed, and whether it still tested what its plan says. Pure functions.

A held job (the probe, or the in-process hook of a Python script that prints its steps) takes its
fault exactly after the planned step. A job that cannot be held (not Python, steps printed some
other way) takes it wherever it has got to when the harness sees the step and acts: on
millisecond steps, several steps later. The record says how many; the verdict fails a plan whose
fault landed past the end of training or past the checkpoint it was meant to precede, since the
run then tested another plan than the one it reports.
"""

from __future__ import annotations

from ..events import Event
from ..trajectory import FaultRecord


def settle(
    fault: FaultRecord,
    events: list[Event],
    *,
    held_step: int | None,
    ends_job: bool,
    job_clock: bool,
    started_wall: float | None = None,
) -> None:
    """Fill in ``fault.landed_step``, ``steps_late``, ``held`` and ``passed_checkpoint`` from the
    attempt's events.

    ``ends_job``: the fault stops the job at once (SIGKILL), so every step it reported came before;
    ``job_clock``: the events carry the job's own time (the probe), so those stamped before the
    delivery came before it (a log-adapter line carries the time the harness read it);
    ``started_wall``: the attempt's launch, so a checkpoint file written during it counts as passed
    wherever its event stands (a block-buffered job's lines arrive after the file they precede).
    """
    steps = [(i, e["step"]) for i, e in enumerate(events) if e["event"] == "step" and e.get("rank", 0) == 0]
    due = max(fault.planned_step, steps[0][1]) if steps else fault.planned_step  # resumed past it: its first step
    if held_step is not None and held_step >= fault.planned_step:
        fault.held = True
        landed = held_step
    elif ends_job and steps:
        landed = max(step for _, step in steps)
    elif job_clock:
        before = [events[i]["step"] for i, _ in steps if events[i]["t"] <= fault.delivered_wall]
        landed = max([fault.observed_step, *before])
    else:
        landed = fault.observed_step
    fault.landed_step = landed
    fault.steps_late = max(0, landed - due)
    if not fault.steps_late:
        return
    reached = next((i for i, step in steps if step >= due), len(events))
    passed = [
        e["step"]
        for i, e in enumerate(events)
        if e["event"] == "checkpoint"
        and e.get("rank", 0) == 0
        and due <= e["step"] <= landed
        and (i > reached or _written_during(e, started_wall))
        and (ends_job or e["t"] <= fault.delivered_wall)
    ]
    fault.passed_checkpoint = min(passed) if passed else None


def _written_during(event: Event, started_wall: float | None) -> bool:
    """The checkpoint's file (whose stored step was read) was written after the attempt's launch:
    this attempt trained to it, even where its event was recorded before the step lines that
    precede it arrived. A file left by an earlier attempt (a rollback re-trains past it) is older."""
    mtime_ns = event.get("mtime_ns")
    return started_wall is not None and isinstance(mtime_ns, int) and mtime_ns / 1e9 >= started_wall


def untested(fault: FaultRecord, last_step: int) -> str | None:
    """Why a late fault did not test its plan (``last_step``: the reference's last step), or None."""
    if not fault.steps_late or fault.landed_step is None:
        return None
    where = (
        f"planned {fault.fault}@{fault.planned_step} landed {fault.steps_late} step(s) late, after step "
        f"{fault.landed_step}"
    )
    if fault.landed_step >= last_step:
        why = "after the job's last step: the restart had nothing left to train"
    elif fault.passed_checkpoint is not None:
        why = (
            f"past the checkpoint after step {fault.passed_checkpoint}, which it was meant to precede: the restart "
            "resumed from another checkpoint than the plan's"
        )
    else:
        return None
    return (
        f"{where}, {why}; the plan was not tested. The job was not held at the planned step (it is not Python, or "
        "its steps reach the harness another way than the probe or a printed line): report steps with "
        "spotchaos.probe (or print them from Python), or pace the job so a step outlasts the harness's reaction"
    )

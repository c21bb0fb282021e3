"""Faults inside the phases a job marks (``probe.phase("eval")``): notices come during evaluation,
a save or data loading, not only between steps (goodfire-ai/spd #741: a SIGTERM save that fired 0
of 6 times in production; torchtitan #3732: a crash before the first save restarted a fine-tune
from random weights). A phase's fault is held at the phase's start, as a step's after the step.
"""

from __future__ import annotations

from ..config.jobs import JobSpec
from ..core import Core
from ..errors import SpotchaosError
from ..faults.plan import Plan, Preemption


def phase_starts(core: Core, job: JobSpec) -> dict[str, list[int]]:
    """For each phase the job declares (``phases``): the steps after which its uninterrupted run
    began it, read from the reference run, which must have begun each declared phase. A plan
    ``FAULT@S/PHASE`` at one of them lands inside the phase begun right after step S."""
    reference = core.reference(job)
    begun = [e for e in reference.attempts[0].of_rank("phase", 0) if e.get("state") == "begin"]
    starts: dict[str, list[int]] = {}
    for name in job.phases:
        steps = [e["step"] for e in begun if e.get("name") == name and isinstance(e.get("step"), int)]
        if not steps:
            raise SpotchaosError(
                f"job {job.name!r} declares phase {name!r}, but its uninterrupted run began none after a step: "
                f"does it run that phase inside its probe's phase({name!r}) after reporting a step?"
            )
        starts[name] = sorted(set(steps))
    return starts


def phase_plans(core: Core, job: JobSpec) -> list[Plan]:
    """For each phase the job declares: a SIGTERM and a SIGKILL inside the first such phase after
    its first checkpoint (a resume then has one to load), and a SIGKILL inside its very first one
    where that came before any checkpoint (the restart must start clean)."""
    saved = core.reference(job).saved_steps
    plans: list[Plan] = []
    for name, steps in phase_starts(core, job).items():
        after = [s for s in steps if saved and s >= min(saved)]
        if after:
            plans += [_inside(after[0], "sigterm", name), _inside(after[0], "sigkill", name)]
        if not saved or steps[0] < min(saved):
            plans.append(_inside(steps[0], "sigkill", name))
    return plans


def _inside(step: int, fault: str, phase: str) -> Plan:
    return Plan((Preemption(step, fault, phase=phase),))

"""What the gate cost, per job: every run it made, counted in the units a user pays in.

A scenario's record carries the runs made while it ran (``record.note_cost``): its job's
reference too, charged to the first scenario that needed it. Per job they add up to the gate's
cost: runs, starts of the job (each a cold process start today), steps trained (replays
included), and "runs' worth" (those steps over the reference's: what the gate cost in
uninterrupted runs of the job), with the seconds spent starting, training, and in the harness.
"""

from __future__ import annotations

from typing import Any

# prefix_steps: steps credited from the reference's prefix (training/reference/prefix.py), never trained; prefix_runs:
# runs that started from it; tail_steps, tail_runs: the same for a last attempt another plan ran on the same
# files (training/reference/tails.py); cached_references: references read from the reference cache, not run
COUNTS = (
    "runs",
    "starts",
    "warm_starts",
    "steps",
    "prefix_steps",
    "prefix_runs",
    "tail_steps",
    "tail_runs",
    "cached_references",
)
PARTS = ("startup_seconds", "training_seconds", "harness_seconds")  # where the seconds went: they add up
# warm_startup_seconds: of the start-up, that of the warm starts; gpu_seconds: device-seconds, each GPU an
# attempt held (leased, given by Ray, or used) for its launch to its exit: what a GPU gate is billed
SECONDS = (*PARTS, "warm_startup_seconds", "gpu_seconds")
MAX_COLD_REASONS = 8  # distinct reasons kept per scenario: enough to act on, bounded for the report


def empty() -> dict[str, Any]:
    """A cost with nothing counted yet: a scenario's before its first run, a job's before its sum."""
    return {**dict.fromkeys(COUNTS, 0), "reference_steps": None, **dict.fromkeys(SECONDS, 0.0), "cold_because": {}}


def add_cold_reasons(into: dict[str, int], reasons: dict[str, int]) -> None:
    """Count why starts were cold (a reason for each start that was not warm), bounded."""
    for reason, count in reasons.items():
        if reason in into or len(into) < MAX_COLD_REASONS:
            into[reason] = into.get(reason, 0) + int(count)


def runs_worth(cost: dict[str, Any]) -> float | None:
    """Steps trained over the reference's steps; None while the reference's are unknown."""
    reference = cost.get("reference_steps")
    return round(cost["steps"] / reference, 2) if reference else None


def per_job(scenarios: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The gate's cost of each job, summed over its scenarios (jobs without a run left out)."""
    jobs: dict[str, dict[str, Any]] = {}
    for scenario in scenarios:
        cost = scenario.get("cost") or {}
        if not cost.get("runs") and not cost.get("cached_references"):
            continue
        total = jobs.setdefault(scenario.get("job") or "?", {"scenarios": 0, **empty()})
        total["scenarios"] += 1
        for key in COUNTS:
            total[key] += int(cost.get(key) or 0)
        for key in SECONDS:
            total[key] = round(total[key] + float(cost.get(key) or 0.0), 3)
        total["reference_steps"] = total["reference_steps"] or cost.get("reference_steps")
        add_cold_reasons(total["cold_because"], cost.get("cold_because") or {})
    for total in jobs.values():
        total["runs_worth"] = runs_worth(total)
    return jobs


def _warm(cost: dict[str, Any]) -> str:
    """`` (40 warm: 0.1 s each, cold 2.9 s)``: how many starts were forked warm, and what a start cost."""
    warm, starts = int(cost.get("warm_starts") or 0), int(cost.get("starts") or 0)
    if not warm:
        return ""
    each = float(cost.get("warm_startup_seconds") or 0.0) / warm
    cold = starts - warm
    cold_each = (float(cost.get("startup_seconds") or 0.0) - each * warm) / cold if cold else None
    return f" ({warm} warm: {each:.1f} s each" + (f", cold {cold_each:.1f} s" if cold_each is not None else "") + ")"


def cost_line(job: str, cost: dict[str, Any]) -> str:
    """``gate cost of 'reference': 7.4 runs' worth: 178 steps of a 24-step job, 19 starts, ...``"""
    worth = cost.get("runs_worth")
    reference = cost.get("reference_steps")
    head = f"{worth:g} runs' worth: " if worth is not None else ""
    of = f" of a {reference}-step job" if reference else ""
    credited = int(cost.get("prefix_steps") or 0)
    prefix = (
        f" ({cost.get('prefix_runs') or 0} from the reference's checkpoints: {credited} steps credited, not trained)"
        if credited
        else ""
    )
    tails = int(cost.get("tail_steps") or 0)
    if tails:
        prefix += f" ({cost.get('tail_runs') or 0} ending on another plan's tail: {tails} steps credited, not trained)"
    cached = ", its reference read from the cache" if cost.get("cached_references") else ""
    gpu = float(cost.get("gpu_seconds") or 0.0)
    held = f", {gpu:.0f} GPU-seconds" if gpu else ""
    return (
        f"gate cost of {job!r}: {head}{cost['steps']} steps{of} in {cost['runs']} runs{prefix}{cached}, "
        f"{cost['starts']} starts"
        f"{_warm(cost)}, "
        f"{cost['startup_seconds']:.0f} s of start-up, {cost['training_seconds']:.0f} s of training, "
        f"{cost['harness_seconds']:.0f} s in the harness{held}"
    )

"""What a *completed* job costs on spot versus on demand, from measured figures.

The seed's rule: optimise the cost of finishing the job, not the GPU-hour price, and never show
an unknown cost as zero. Every price the user did not give stays ``None`` and is listed in
``unknown``; the total is then a lower bound and says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..config.prices import CostInputs
from .advisor import expected_waste

HOUR = 3600.0
GB = 1e9
MONTH = 30 * 24 * HOUR


@dataclass
class Side:
    wall_hours: float
    compute: float | None
    storage: float | None
    egress: float | None
    total_known: float
    unknown: list[str] = field(default_factory=list)


@dataclass
class CostEstimate:
    work_hours: float  # compute the job needs with no checkpoint and no preemption
    spot: Side
    on_demand: Side
    expected_restarts: float
    assumptions: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobFigures:
    """What one job's uninterrupted run measured: the inputs of the cost model besides prices."""

    step_seconds: float
    steps_run: int
    checkpoint_seconds: float
    interval_seconds: float
    restart_seconds: float
    mtbf_seconds: float
    checkpoint_bytes: int
    checkpoints_kept: int = 3

    @property
    def checkpoint_gb(self) -> float:
        return self.checkpoint_bytes / GB


def _side(label: str, wall_s: float, price: float | None, restarts: float, inputs: CostInputs, job: JobFigures) -> Side:
    unknown: list[str] = []
    compute = wall_s / HOUR * price if price is not None else None
    if compute is None:
        unknown.append(f"{label} price")
    gb_months = job.checkpoint_gb * job.checkpoints_kept * wall_s / MONTH
    storage = gb_months * inputs.storage_per_gb_month if inputs.storage_per_gb_month is not None else None
    if storage is None:
        unknown.append("storage price")
    egress = restarts * job.checkpoint_gb * inputs.egress_per_gb if inputs.egress_per_gb is not None else None
    if egress is None and restarts > 0:
        unknown.append("egress price")
    known = sum(v for v in (compute, storage, egress) if v is not None)
    return Side(wall_s / HOUR, compute, storage, egress, known, unknown)


def estimate(inputs: CostInputs, job: JobFigures) -> CostEstimate:
    """Expected wall time and cost to finish on spot (preempted every ``mtbf_seconds`` on
    average, Daly's model) and on demand (never preempted, same checkpoint interval)."""
    steps = inputs.production_steps or job.steps_run
    work = steps * job.step_seconds
    waste = expected_waste(job.interval_seconds, job.checkpoint_seconds, job.restart_seconds, job.mtbf_seconds)
    spot_wall = work / (1 - waste) if waste < 1 else float("inf")
    on_demand_wall = work * (1 + job.checkpoint_seconds / job.interval_seconds)
    restarts = spot_wall / job.mtbf_seconds
    assumptions = [
        f"{steps} steps of {job.step_seconds:.3g} s each"
        + ("" if inputs.production_steps else " (the steps this test ran; set production_steps)"),
        f"checkpoint every {job.interval_seconds:.3g} s costing {job.checkpoint_seconds:.3g} s; "
        f"restart {job.restart_seconds:.3g} s",
        f"one preemption every {job.mtbf_seconds / HOUR:.3g} h on average (Daly's model)",
        f"{job.checkpoints_kept} checkpoints of {job.checkpoint_bytes} bytes stored while the job runs",
    ]
    return CostEstimate(
        work_hours=work / HOUR,
        spot=_side("spot", spot_wall, inputs.spot_per_hour, restarts, inputs, job),
        on_demand=_side("on-demand", on_demand_wall, inputs.on_demand_per_hour, 0, inputs, job),
        expected_restarts=restarts,
        assumptions=assumptions,
    )

"""How often should a job checkpoint? The Young/Daly optimum from measured costs.

C is the blocking time of one checkpoint, R the time to restart and restore, M the mean time
between preemptions. Young (1974): tau = sqrt(2·C·M). Daly (2006) adds higher-order terms:
tau = sqrt(2·C·M)·(1 + sqrt(C/2M)/3 + (C/2M)/9) - C for C < 2M, else M. The expected waste
(the fraction of wall time not spent on useful work) is Daly's complete model:
1 - tau / (M·e^(R/M)·(e^((tau+C)/M) - 1)).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# Beyond this factor from the optimum, the interval is called "far" from it.
FAR_FACTOR = 2.0


def young_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    return math.sqrt(2 * checkpoint_seconds * mtbf_seconds)


def daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    c, m = checkpoint_seconds, mtbf_seconds
    if c >= 2 * m:
        return m
    ratio = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - c


def expected_waste(interval: float, checkpoint_seconds: float, restart_seconds: float, mtbf_seconds: float) -> float:
    """Fraction of wall time lost to checkpoints, rework and restarts (0 = none, 1 = all)."""
    m = mtbf_seconds
    wall_per_work = m * math.exp(restart_seconds / m) * math.expm1((interval + checkpoint_seconds) / m) / interval
    return 1 - 1 / wall_per_work


@dataclass
class Advice:
    checkpoint_seconds: float
    restart_seconds: float
    mtbf_seconds: float
    configured_interval: float
    young_interval: float
    daly_interval: float
    waste_configured: float
    waste_optimal: float
    assessment: str  # "ok", "too often" or "too rarely"
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def advise(
    *, checkpoint_seconds: float, restart_seconds: float, mtbf_seconds: float, configured_interval: float
) -> Advice:
    """Compare the job's interval with Daly's optimum, and say so when it is far off."""
    young = young_interval(checkpoint_seconds, mtbf_seconds)
    daly = daly_interval(checkpoint_seconds, mtbf_seconds)
    waste_now = expected_waste(configured_interval, checkpoint_seconds, restart_seconds, mtbf_seconds)
    waste_best = expected_waste(daly, checkpoint_seconds, restart_seconds, mtbf_seconds)
    if configured_interval < daly / FAR_FACTOR:
        assessment = "too often"
    elif configured_interval > daly * FAR_FACTOR:
        assessment = "too rarely"
    else:
        assessment = "ok"
    message = (
        f"checkpoints every {configured_interval:.3g} s; Daly's optimum for C={checkpoint_seconds:.3g} s, "
        f"M={mtbf_seconds:.3g} s is {daly:.3g} s (Young: {young:.3g} s); expected waste "
        f"{waste_now:.2%} now vs {waste_best:.2%} at the optimum"
    )
    if assessment != "ok":
        message = f"checkpointing {assessment}: " + message
    return Advice(
        checkpoint_seconds=checkpoint_seconds,
        restart_seconds=restart_seconds,
        mtbf_seconds=mtbf_seconds,
        configured_interval=configured_interval,
        young_interval=young,
        daly_interval=daly,
        waste_configured=waste_now,
        waste_optimal=waste_best,
        assessment=assessment,
        message=message,
    )

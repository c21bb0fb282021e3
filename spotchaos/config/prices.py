"""What a job's compute and storage cost, as the user declares it in ``[tool.spotchaos.jobs.NAME.cost]``.

Declared beside the job (so the loader checks it where it is written); ``spotchaos.budgets.cost``
turns it into the cost of a completed job. Unknown stays ``None``, never zero.
"""

from __future__ import annotations

from dataclasses import dataclass

PRICE_KEYS = ("spot_per_hour", "on_demand_per_hour", "storage_per_gb_month", "egress_per_gb")
MAX_PRICE = 10_000.0  # per hour or per GB: anything above is a typo, not a price


@dataclass(frozen=True)
class CostInputs:
    """Prices (any one currency) and the size of the production job; ``None`` means unknown."""

    spot_per_hour: float | None = None
    on_demand_per_hour: float | None = None
    storage_per_gb_month: float | None = None
    egress_per_gb: float | None = None  # paid when a restart reads its checkpoint back
    production_steps: int | None = None  # steps of the real job; default: the steps the test ran

"""What chaos a run receives, as plain data: the engine executes it, strategies generate it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .faults import PREEMPTIONS


@dataclass(frozen=True)
class Preemption:
    """Deliver ``fault`` once the attempt has reported step ``at_step`` (or a later one)."""

    at_step: int
    fault: str

    def __post_init__(self) -> None:
        if self.fault not in PREEMPTIONS:
            known = ", ".join(sorted(PREEMPTIONS))
            raise ConfigError(f"unknown preemption {self.fault!r} (known: {known})")
        if self.at_step < 0:
            raise ConfigError(f"preemption step must be >= 0, got {self.at_step}")

    def __str__(self) -> str:
        return f"{self.fault}@{self.at_step}"


@dataclass(frozen=True)
class Plan:
    """A chain of preemptions; attempt ``i`` receives ``preemptions[i]``."""

    preemptions: tuple[Preemption, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Plan:
        """``"sigterm@5,sigkill@12"`` -> Plan; the form the report's replay commands use."""
        items = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            fault, _, step = part.partition("@")
            if not step.isdigit():
                raise ConfigError(f"plan item {part!r} must look like FAULT@STEP, e.g. sigterm@5")
            items.append(Preemption(int(step), fault))
        return cls(tuple(items))

    def __str__(self) -> str:
        return ",".join(str(p) for p in self.preemptions) or "none"

    def to_dict(self) -> list[dict[str, Any]]:
        return [{"fault": p.fault, "at_step": p.at_step} for p in self.preemptions]

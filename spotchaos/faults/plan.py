"""What chaos a run receives, as plain data: the engine executes it, strategies generate it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..config.declare import PHASE_NAME
from ..errors import ConfigError
from . import CHECKPOINT_FAULTS, PREEMPTIONS, traits

MAX_OFFSET_SECONDS = 600.0  # a fault placed after a step lands within this (an attempt's patience is longer)


def _offset(where: str, part: str) -> tuple[str, float | None]:
    """``7+0.15s`` -> (``7``, 0.15): a time after the step, told from a crash point's ``+N`` by its ``s``."""
    head, plus, tail = where.rpartition("+")
    if not plus or not tail.endswith("s"):
        return where, None
    try:
        seconds = float(tail[:-1])
    except ValueError:
        raise ConfigError(f"plan item {part!r}: {tail!r} is not a time such as 0.15s") from None
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ConfigError(f"plan item {part!r}: {tail!r} is not a time such as 0.15s")
    return head, seconds


@dataclass(frozen=True)
class Preemption:
    """Deliver ``fault`` once the attempt has reported step ``at_step`` (or a later one); then,
    before the restart, apply ``damage`` to the newest checkpoint (``pick`` in [0, 1) chooses
    the file and the offset). A crash point ``crash@N`` dies before the attempt's N-th
    file-system event under its checkpoint folder; ``crash@S+N`` (``after_step`` S) before the
    N-th since the job first reported step S, on across later steps: the same moment of a save
    from step 0 or from a copy of an earlier checkpoint (training/reference/prefix.py).

    ``phase`` (``sigterm@7/eval``): the fault lands inside the first phase of that name the job
    enters after reporting step ``at_step`` (its probe's ``phase("eval")``), held at the phase's
    start, instead of between steps: real notices come during evaluation, a save, data loading.

    ``offset_seconds`` (``sigterm@7+0.15s``): the fault lands that long after the job reported
    step ``at_step``, wherever the job then is (inside the next step, between two micro-batches),
    with no hold: a notice does not wait for a step's end."""

    at_step: int
    fault: str
    damage: str | None = None
    pick: float = 0.0
    after_step: int | None = None
    phase: str | None = None
    offset_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.fault not in PREEMPTIONS:
            known = ", ".join(sorted(PREEMPTIONS))
            raise ConfigError(f"unknown preemption {self.fault!r} (known: {known})")
        if self.at_step < 0:
            raise ConfigError(f"preemption step must be >= 0, got {self.at_step}")
        if self.damage is not None and self.damage not in CHECKPOINT_FAULTS:
            known = ", ".join(CHECKPOINT_FAULTS)
            raise ConfigError(f"unknown checkpoint fault {self.damage!r} (known: {known})")
        if not 0 <= self.pick < 1:
            raise ConfigError(f"pick must be in [0, 1), got {self.pick}")
        counted = traits(self.fault).counts_from_a_step
        if self.after_step is not None and (not counted or self.after_step < 0 or self.at_step < 1):
            raise ConfigError(
                f"{self.fault}@{self.after_step}+{self.at_step}: only a crash point counts events after a step "
                "(crash@S+N: S >= 0, N >= 1)"
            )
        if self.phase is not None:
            self._check_phase()
        if self.offset_seconds is not None:
            self._check_offset()

    def _check_offset(self) -> None:
        """A time offset places a fault the harness delivers, within one attempt's patience."""
        assert self.offset_seconds is not None
        if not 0 < self.offset_seconds <= MAX_OFFSET_SECONDS:
            raise ConfigError(
                f"{self.fault}@{self.at_step}+{self.offset_seconds!r}s: the offset after the step must be more "
                f"than 0 and at most {MAX_OFFSET_SECONDS:g} s, e.g. sigterm@7+0.15s"
            )
        if self.fs_event is not None or PREEMPTIONS[self.fault].reruns or self.phase is not None:
            raise ConfigError(
                f"{self.fault}@{self.at_step}+{self.offset_seconds!r}s: only a fault the harness delivers lands at "
                "a time after a step (sigterm, sigkill, a notice), and not inside a phase as well"
            )

    def _check_phase(self) -> None:
        """A phase is a name the job reports; only a fault the harness delivers is held there."""
        assert self.phase is not None
        if not PHASE_NAME.fullmatch(self.phase):
            raise ConfigError(
                f"{self.fault}@{self.at_step}/{self.phase}: a phase is a name the job reports "
                "(letters, digits, '-', '_', up to 32), e.g. sigterm@7/eval"
            )
        if self.fs_event is not None or PREEMPTIONS[self.fault].reruns:
            raise ConfigError(
                f"{self.fault}@{self.at_step}/{self.phase}: a crash point or a rerun has no phase "
                "(a phase holds a fault the harness delivers: sigterm, sigkill, a notice)"
            )

    @property
    def fs_event(self) -> int | None:
        """For ``crash@N``, N: the job's N-th file-system event under its checkpoint directory (the
        crash point), not a training step; None for the other faults."""
        return self.at_step if traits(self.fault).armed_by_environment else None

    @property
    def crash_rank(self) -> int | None:
        """For ``crash-rankR@N``, R: the one rank armed (a torchrun job); None for the others."""
        fault = traits(self.fault)
        return fault.target if fault.armed_by_environment and fault.targeted else None

    def __str__(self) -> str:
        where = str(self.at_step) if self.after_step is None else f"{self.after_step}+{self.at_step}"
        if self.offset_seconds is not None:
            where += f"+{self.offset_seconds!r}s"
        text = f"{self.fault}@{where}" + (f"/{self.phase}" if self.phase else "")
        if self.damage:
            text += f":{self.damage}" + (f"~{self.pick!r}" if self.pick else "")
        return text


@dataclass(frozen=True)
class Plan:
    """A chain of preemptions; attempt ``i`` receives ``preemptions[i]``."""

    preemptions: tuple[Preemption, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Plan:
        """``"sigterm@5,sigkill@12:truncate-half~0.3,crash@17+2,sigterm@7/eval"`` -> Plan; the form
        replay commands use."""
        items = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            head, _, damage = part.partition(":")
            fault, _, where = head.partition("@")
            where, slash, phase = where.partition("/")
            where, offset = _offset(where, part)
            after, plus, step = where.rpartition("+")
            damage, _, pick = damage.partition("~")
            if not (step.isascii() and step.isdigit()) or (plus and not (after.isascii() and after.isdigit())):
                raise ConfigError(
                    f"plan item {part!r} must look like FAULT@STEP[/PHASE][:DAMAGE[~PICK]], FAULT@STEP+SECONDSs "
                    "or crash@STEP+EVENT, e.g. sigterm@5, sigterm@5/eval or sigterm@5+0.2s"
                )
            try:
                pick_value = float(pick) if pick else 0.0
            except ValueError:
                raise ConfigError(f"plan item {part!r}: pick {pick!r} is not a number") from None
            if slash and not phase:
                raise ConfigError(f"plan item {part!r}: no phase after '/' (e.g. sigterm@5/eval)")
            after_step = int(after) if plus else None
            items.append(Preemption(int(step), fault, damage or None, pick_value, after_step, phase or None, offset))
        return cls(tuple(items))

    def __str__(self) -> str:
        return ",".join(str(p) for p in self.preemptions) or "none"

    def group_notices_as_notices(self) -> Plan:
        """The plan with each ``sigterm-group`` written ``sigterm``: for a job that receives the two
        alike (``search.as_delivered``), so a search runs the one plan once."""
        return Plan(tuple(replace(p, fault=traits(p.fault).to_the_main_process or p.fault) for p in self.preemptions))

    def to_dict(self) -> list[dict[str, Any]]:
        return [
            {
                "fault": p.fault,
                "at_fs_event" if p.fs_event is not None else "at_step": p.at_step,
                "damage": p.damage,
                "pick": p.pick,
                **({"after_step": p.after_step} if p.after_step is not None else {}),
                **({"phase": p.phase} if p.phase is not None else {}),
                **({"offset_seconds": p.offset_seconds} if p.offset_seconds is not None else {}),
            }
            for p in self.preemptions
        ]

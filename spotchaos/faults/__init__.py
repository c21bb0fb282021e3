"""Faults: small named objects, each knowing how to do one thing to a running job.

Like Toxiproxy's toxics, a fault does not decide *when* it happens or how likely it is; plans and
hypothesis strategies decide that. The engine only asks a fault to ``apply`` itself and whether
the job is then owed a grace window.
"""

from __future__ import annotations

from typing import Protocol

from ..backends.base import Handle
from .checkpoint import CHECKPOINT_FAULTS, CheckpointSet, Damage
from .ranks import DrainNode, HangRank, KillRank, LoseNode, rank_fault
from .signals import CloudNotice, CrashPoint, HardKill, Notice, Rerun
from .slurm import SLURM_FAULTS
from .traits import NO_FAULT, Traits


class PreemptionFault(Protocol):
    """What reaches a running job: a notice, a hard kill, a crash point (storage faults are
    ``spotchaos.storage``'s, checkpoint damage ``CHECKPOINT_FAULTS``). What the engine asks of it
    besides ``apply`` is its :class:`Traits` (every fault inherits them)."""

    name: str
    graceful: bool  # True: the job may checkpoint and exit inside the grace window
    whole_group: bool
    continues: bool
    hangs: bool
    reclaims: bool
    warns: bool
    target: int | None

    def apply(self, handle: Handle) -> None: ...


class _Preemptions(dict):
    """The fixed faults by name, plus the rank faults named with their target (``kill-rank1``)."""

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) or (isinstance(name, str) and rank_fault(name) is not None)

    def __getitem__(self, name: str) -> PreemptionFault:
        if super().__contains__(name):
            return super().__getitem__(name)
        fault = rank_fault(name)
        if fault is None:
            raise KeyError(name)
        return fault

    def get(self, name: object, default: PreemptionFault | None = None) -> PreemptionFault | None:
        """As ``[]``: dict.get never calls ``__getitem__``, so without this every rank fault read
        as unknown (the step hold was never armed for ``kill-rank1``, ``lose-node1``...)."""
        try:
            return self[name]  # type: ignore[index]
        except (KeyError, TypeError):
            return default

    def __iter__(self):  # the names shown as known: the fixed ones, and the rank faults' patterns
        yield from super().__iter__()
        yield from ("kill-rankN", "hang-rankN", "lose-nodeN", "drain-nodeN")


def traits(name: str | None) -> Traits:
    """What the fault named ``name`` is, as the engine asks it (an unknown name: no fault at all)."""
    return PREEMPTIONS.get(name) or NO_FAULT if name else NO_FAULT  # type: ignore[return-value]


PREEMPTIONS: dict[str, PreemptionFault] = _Preemptions(
    {
        "sigterm": Notice(whole_group=False),
        "sigterm-group": Notice(whole_group=True),
        "sigkill": HardKill(),
        "rerun": Rerun(),  # rerun@N: N is ignored; the finished job is started again
        "crash": CrashPoint(),  # crash@N: N is a file-system event (Preemption.fs_event), not a training step
        **{fault.name: fault for fault in (CloudNotice(p) for p in ("aws", "gcp", "azure", "alibaba"))},
        **SLURM_FAULTS,  # slurm-usr1@N, slurm-usr2@N: the partition's warning, then SIGTERM, then SIGKILL
    }
)

__all__ = [
    "CHECKPOINT_FAULTS",
    "PREEMPTIONS",
    "CheckpointSet",
    "CloudNotice",
    "CrashPoint",
    "Damage",
    "DrainNode",
    "HangRank",
    "HardKill",
    "KillRank",
    "LoseNode",
    "Notice",
    "PreemptionFault",
]

"""Faults: small named objects, each knowing how to do one thing to a running job.

Like Toxiproxy's toxics, a fault does not decide *when* it happens or how likely it is; plans and
hypothesis strategies decide that. The engine only asks a fault to ``apply`` itself and whether
the job is then owed a grace window.
"""

from __future__ import annotations

from typing import Protocol

from ..backends.base import Handle
from .checkpoint import CHECKPOINT_FAULTS, CheckpointSet, Damage
from .signals import CrashPoint, HardKill, Notice


class PreemptionFault(Protocol):
    """What reaches a running job: a notice, a hard kill, a crash point (storage faults are
    ``spotchaos.storage``'s, checkpoint damage ``CHECKPOINT_FAULTS``)."""

    name: str
    graceful: bool  # True: the job may checkpoint and exit inside the grace window

    def apply(self, handle: Handle) -> None: ...


PREEMPTIONS: dict[str, PreemptionFault] = {
    "sigterm": Notice(whole_group=False),
    "sigterm-group": Notice(whole_group=True),
    "sigkill": HardKill(),
    "crash": CrashPoint(),  # crash@N: N is a file-system event (Preemption.fs_event), not a training step
}

__all__ = [
    "CHECKPOINT_FAULTS",
    "PREEMPTIONS",
    "CheckpointSet",
    "CrashPoint",
    "Damage",
    "HardKill",
    "Notice",
    "PreemptionFault",
]

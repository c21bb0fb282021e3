"""Preemption as a provider delivers it: a notice (SIGTERM) with a grace window, or no notice."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from ..backends.base import Handle
from .traits import Traits


@dataclass(frozen=True)
class Notice(Traits):
    """SIGTERM, then the grace window; the engine sends SIGKILL when the window ends.

    ``whole_group=False`` is ``docker stop`` and Kubernetes (PID 1 only); ``True`` is a VM
    shutting down under systemd or SLURM, which also reaches DataLoader workers.
    """

    whole_group: bool
    graceful: bool = field(default=True, init=False)

    @property
    def name(self) -> str:
        return "sigterm-group" if self.whole_group else "sigterm"

    @property
    def to_the_main_process(self) -> str | None:  # type: ignore[override]
        return "sigterm" if self.whole_group else None

    def apply(self, handle: Handle) -> None:
        handle.notify(signal.SIGTERM, whole_group=self.whole_group)


@dataclass(frozen=True)
class CloudNotice(Traits):
    """The reclaim notice posted on the cloud's instance metadata (served by the harness on
    127.0.0.1, see :mod:`spotchaos.faults.notices`), with no signal: many trainers poll the metadata
    instead of handling SIGTERM, and on some clouds no SIGTERM comes before the kill. The engine
    starts the metadata server for the attempt (``metadata``), posts the notice at the planned
    step, and SIGKILLs when the grace window ends."""

    metadata: str  # the provider: aws, gcp, azure, alibaba
    graceful: bool = field(default=True, init=False)

    @property
    def name(self) -> str:
        return f"{self.metadata}-notice"

    def apply(self, handle: Handle) -> None:
        pass  # posted on the attempt's metadata server by the engine, not sent to a process


@dataclass(frozen=True)
class Rerun(Traits):
    """No fault while the job runs: once it has finished (its final event and exit 0), it is
    started again on the same checkpoints, as a scheduler does that restarts a job whose node went
    away after its last save (a Kubernetes Job's retry, a spot fleet's replacement). A restart
    after the final checkpoint must train nothing and end on the same weights."""

    name: str = field(default="rerun", init=False)
    graceful: bool = field(default=False, init=False)
    reruns: bool = field(default=True, init=False)

    def apply(self, handle: Handle) -> None:
        pass  # the engine starts the next attempt once this one has finished


@dataclass(frozen=True)
class HardKill(Traits):
    """SIGKILL to every process of the job with no warning: a host lost, an OOM kill."""

    name: str = field(default="sigkill", init=False)
    graceful: bool = field(default=False, init=False)

    def apply(self, handle: Handle) -> None:
        handle.kill()


@dataclass(frozen=True)
class CrashPoint(Traits):
    """SIGKILL from inside the job at its Nth file-system event under the checkpoint directory.

    Armed through the environment before the attempt starts (see ``spotchaos/faults/crashpoint``); the
    plan's step number is the event's index. Nothing is delivered from outside.
    """

    name: str = field(default="crash", init=False)
    graceful: bool = field(default=False, init=False)
    armed_by_environment: bool = field(default=True, init=False)
    counts_from_a_step: bool = field(default=True, init=False)

    def apply(self, handle: Handle) -> None:
        pass

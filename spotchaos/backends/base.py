"""The interface between the engine and whatever runs the job."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from ..host.processes import Delivery


@dataclass(frozen=True)
class LaunchSpec:
    """One attempt of a job, fully resolved: what to run, where, with what environment."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: Path
    stdout_path: Path
    stderr_path: Path
    grace_seconds: float = 30.0  # the job's notice window (a container's stop timeout)
    writable: tuple[Path, ...] = ()  # the run's own directory: a container binds it read-write
    readable: tuple[Path, ...] = ()  # harness files the job loads (the crash-point hook): read-only
    gpus: tuple[str, ...] = ()  # the GPUs leased to the attempt: a container's device ids
    # the environment the job's interpreter may start with, shared by its attempts (env less what
    # one attempt adds): a backend that keeps a warm interpreter forks from one started so; None:
    # start cold. ``preload``: what that interpreter imports first (host/warm/pool.py)
    start_env: Mapping[str, str] | None = None
    preload: tuple[str, ...] = ()
    # NAME=value that every process of the attempt inherits: a kill or a job-wide notice finds by it
    # what left the attempt's process group (a torchrun worker in a session of its own)
    marker: str | None = None


class Handle(Protocol):
    """A running attempt. Besides the methods below, what the engine reads of every handle, with
    the answer of a plain local process group as the default (a handle subclasses this protocol to
    inherit them; one that cannot, ``host/warm``'s below this floor, spells them out)."""

    identity: Mapping[str, Any] = MappingProxyType({})  # who runs, for a later session that must end it
    placement: dict | None = None  # where it ran, for the report (a Ray node)
    start_kind: str = "cold"  # "warm", or "cold" with the reason a warm start was not possible
    delivery: Delivery | None = None  # what the last signal to the whole job reached
    delivery_note: str = ""  # what a notice met on its way in (a shell as a container's PID 1)
    notice_lag_seconds: float = 0.0  # how long a notice takes to reach the ranks (a launcher passes it on)
    notice_window_seconds: float | None = None  # a launcher's own window (KubeRay's drain); None: the job's grace
    launcher: str = "its launcher"  # for messages: what started the job's processes
    reclaim: Callable[[], None] | None = None  # a launcher whose nodes go at a window's end (Ray Train's)

    def note_rank(self, rank: int, pid: object) -> None:
        """``rank`` said it started, as process ``pid`` (a multi-rank handle finds its ranks so); else nothing."""

    def note_event(self, rank: int, step: int | None) -> None:
        """An event of ``rank`` was read (a multi-rank handle times its ranks by them); else nothing."""

    def oom_killed(self) -> bool:
        """Whether the kernel ended the job for memory (a container's limit tells; a process group cannot)."""
        return False

    def end_processes(self) -> None:
        """End the job's processes where the launcher's own end (a Ray node's) is not the harness's to make."""
        self.kill()

    @property
    def pid(self) -> int: ...

    def notify(self, signum: int, *, whole_group: bool) -> None:
        """Send ``signum`` to the main process only, or to every process of the job."""

    def kill(self) -> None:
        """SIGKILL every process of the job (a hard kill, or the end of a grace window)."""

    def poll(self) -> int | None:
        """The exit status once the main process has exited (negative: killed by that signal)."""

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the main process; ``None`` if it still runs."""

    def survivors(self) -> list[int]:
        """Processes of the job still alive (after the main process exited, say)."""

    def cleanup(self) -> None:
        """Kill and reap everything the attempt started. Idempotent."""


class Backend(Protocol):
    """What starts an attempt. ``log_latency_seconds``: how late a printed line may reach the
    attempt's log after what the job did next (Docker's log stream; 0 for a local file); ``warm``:
    the warm interpreters its attempts fork from (None: every attempt starts cold)."""

    name: str
    log_latency_seconds: float = 0.0
    warm: Any = None

    def inherited_environment(self) -> dict[str, str]:
        """The environment a job starts from, before its own variables and the contract's."""

    def start(self, spec: LaunchSpec) -> Handle: ...

"""The interface between the engine and whatever runs the job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


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


class Handle(Protocol):
    """A running attempt. It may also carry ``delivery_note``: what a notice met on its way to
    the trainer (a shell as the container's PID 1, say), recorded with the fault, and
    ``start_kind``: "warm", or "cold" with the reason a warm start was not possible."""

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
    """May also carry ``log_latency_seconds``: how late a printed line may reach the attempt's log
    after what the job did next (Docker's log stream; 0 for a local file)."""

    name: str

    def inherited_environment(self) -> dict[str, str]:
        """The environment a job starts from, before its own variables and the contract's."""

    def start(self, spec: LaunchSpec) -> Handle: ...

"""The embedded default backend: the job runs as a local process group.

Each attempt starts in a new session, so its process group holds the trainer and everything it
forks (DataLoader workers, shells, helpers). That is what makes both real forms of notice
possible: SIGTERM to the main process alone (``docker stop``, Kubernetes) or to every process
of the job (a VM shutting down under systemd, SLURM), and it is what lets cleanup be total.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from ..errors import BackendError
from .base import LaunchSpec


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: fall back to asking whether the group exists at all
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


class SubprocessHandle:
    """One attempt running as the leader of its own process group."""

    def __init__(self, process: subprocess.Popen, logs: list) -> None:
        self._process = process
        self._logs = logs
        self._cleaned = False

    @property
    def pid(self) -> int:
        return self._process.pid

    def notify(self, signum: int, *, whole_group: bool) -> None:
        try:
            if whole_group:
                os.killpg(self.pid, signum)
            else:
                self._process.send_signal(signum)
        except ProcessLookupError:
            pass  # already gone: the notice arrived too late to matter

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)

    def poll(self) -> int | None:
        return self._process.poll()

    def wait(self, timeout: float) -> int | None:
        try:
            return self._process.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            return None

    def survivors(self) -> list[int]:
        return _group_members(self.pid)

    def cleanup(self) -> None:
        if self._cleaned:
            return
        deadline = time.monotonic() + 10
        while True:
            self.kill()
            self.wait(0.2)
            if self._process.poll() is not None and not self.survivors():
                break
            if time.monotonic() > deadline:
                raise BackendError(f"processes {self.survivors()} of job group {self.pid} survived SIGKILL for 10 s")
        for log in self._logs:
            log.close()
        self._cleaned = True


class SubprocessBackend:
    """Runs each attempt as a local process group."""

    name = "subprocess"

    def inherited_environment(self) -> dict[str, str]:
        return dict(os.environ)  # the job runs under pytest's environment, as a local command would

    def start(self, spec: LaunchSpec) -> SubprocessHandle:
        stdout = open(spec.stdout_path, "wb")
        stderr = open(spec.stderr_path, "wb")
        try:
            process = subprocess.Popen(
                list(spec.argv),
                cwd=spec.cwd,
                env=spec.env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        except OSError as exc:
            stdout.close()
            stderr.close()
            raise BackendError(f"could not start {spec.argv[0]!r}: {exc.strerror or exc}") from None
        return SubprocessHandle(process, [stdout, stderr])

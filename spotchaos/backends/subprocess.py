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

from ..errors import BackendError
from ..host.processes import (
    Delivery,
    become_subreaper,
    group_members,
    kill_group_until_gone,
    own_leaders,
    signal_tree,
    start_time,
)
from ..host.warm.pool import ColdStart, WarmHandle, WarmStarts
from ..safety.safefs import create_new
from .base import Backend, Handle, LaunchSpec


class SubprocessHandle(Handle):
    """One attempt running as the leader of its own process group."""

    def __init__(
        self, process: subprocess.Popen, logs: list, start_kind: str = "cold", marker: str | None = None
    ) -> None:
        self.start_kind = start_kind
        self.marker = marker  # NAME=value every process of the attempt inherits
        self.delivery: Delivery | None = None  # what the last signal to the whole job reached
        self._process = process
        self._logs = logs
        self._cleaned = False
        # pid and start time: who this is, for a later pytest run that must end it if this one dies
        self.identity = {"pid": process.pid, "start": start_time(process.pid)}

    @property
    def pid(self) -> int:
        return self._process.pid

    def notify(self, signum: int, *, whole_group: bool) -> None:
        if whole_group:
            self.delivery = signal_tree(self.pid, signum, self.marker)
            return
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(signum)  # already gone: the notice arrived too late to matter

    def kill(self) -> None:
        self.delivery = signal_tree(self.pid, signal.SIGKILL, self.marker)

    def end_group(self) -> None:
        """SIGKILL to the process group alone: the cleanup's, which leaves a process that left the
        group to ``end_escaped`` to find, end and report as escaped."""
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
        return group_members(self.pid)

    def cleanup(self) -> None:
        if self._cleaned:
            return
        kill_group_until_gone(self)
        own_leaders.discard(self.pid)
        for log in self._logs:
            log.close()
        self._cleaned = True


class SubprocessBackend(Backend):
    """Runs each attempt as a local process group: forked from the job's warm interpreter where
    ``warm`` has one for it (the attempt's ``start_env``), else started cold."""

    name = "subprocess"

    def __init__(self, warm: WarmStarts | None = None) -> None:
        self.warm = warm

    def inherited_environment(self) -> dict[str, str]:
        return dict(os.environ)  # the job runs under pytest's environment, as a local command would

    def start(self, spec: LaunchSpec) -> SubprocessHandle:
        stdout = create_new(spec.stdout_path)
        try:
            stderr = create_new(spec.stderr_path)
        except BaseException:
            stdout.close()
            raise
        become_subreaper()  # what the job orphans comes back to the harness, not to init
        cold = "cold"
        if self.warm is not None and spec.start_env is not None:
            try:
                return self._warm(spec, stdout, stderr)
            except ColdStart as exc:
                cold = f"cold: {exc}"
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
        own_leaders.add(process.pid)
        return SubprocessHandle(process, [stdout, stderr], cold, spec.marker)

    def _warm(self, spec: LaunchSpec, stdout, stderr) -> WarmHandle:
        assert self.warm is not None and spec.start_env is not None
        handle = self.warm.start(
            spec.argv, spec.env, spec.start_env, spec.cwd, spec.preload, (stdout.fileno(), stderr.fileno())
        )
        handle.marker = spec.marker
        stdout.close()  # the attempt holds its own copies
        stderr.close()
        return handle

"""What runs on a Ray node for one attempt: an actor that starts the job there and acts on it.

The job is a plain process group started by this actor with ``subprocess.Popen``, in a session of
its own, so a notice can reach the main process or every process of the job, as on the subprocess
backend; ``PR_SET_PDEATHSIG`` ties it to the actor's worker, so a node whose processes are ended
takes its job with it, as a reclaimed VM does. The actor runs several calls at once
(``max_concurrency``): a notice is not queued behind a ``wait``.

This module is imported on every node of the cluster (spotchaos is installed there, as on the
harness's machine); what it uses of spotchaos is the standard library's alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from ...host.processes import group_members
from ...safety.safefs import create_new
from .relay import NodeFolder

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the job's process before exec: SIGKILL it when the actor's worker dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


EXIT_FILE = "ray-exit-status"  # beside the attempt's stdout: the job's exit status, written on its node


class JobAgent:
    """One attempt's job on this node."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._logs: list = []
        self._node_folder: NodeFolder | None = None  # the attempt's folder on this node, when relayed

    def _record_exit(self, folder: Path) -> None:
        """Wait for the job here, on its node, and write its exit status the moment it exits: the
        harness reads it there when an RPC to this actor fails (a loaded machine, the node going),
        instead of taking a job that exited for one its node killed."""
        process = self._process
        if process is None:
            return
        status = process.wait()
        with contextlib.suppress(OSError), create_new(folder / EXIT_FILE) as file:
            file.write(f"{status}\n".encode())

    def start(
        self, argv: list[str], env: dict[str, str], cwd: str, stdout_path: str, stderr_path: str, relay: bool = False
    ) -> dict:
        """Start the job; who it is (pid, start time) and where (node, worker pid). ``relay``: the
        node does not share the harness's files: the attempt's folder is one of this node's own,
        pulled by the harness (``relay.py``)."""
        import ray  # on the node, inside the actor: the node's own Ray

        if relay:
            self._node_folder = NodeFolder(str(Path(stdout_path).parent))
            env = self._node_folder.localize(env)
            stdout_path = self._node_folder.local_path(stdout_path)
            stderr_path = self._node_folder.local_path(stderr_path)
        self._logs = [create_new(Path(stdout_path)), create_new(Path(stderr_path))]
        gpu_ids = ray.get_gpu_ids()
        if gpu_ids:  # the GPUs Ray assigned this actor: the job sees those and no other
            env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpu_ids)}
        try:
            self._process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._logs[0],
                stderr=self._logs[1],
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            for log in self._logs:
                log.close()
            return {"error": f"could not start {argv[0]!r}: {exc.strerror or exc}"}
        pid = self._process.pid
        # its start time before anything waits for it: a job that dies at once (its node going) stays a
        # zombie, /proc/<pid> still there, until the thread below reaps it
        with open(f"/proc/{pid}/stat", "rb") as stat:
            started = int(stat.read().rsplit(b")", 1)[1].split()[19])
        threading.Thread(target=self._record_exit, args=(Path(stdout_path).parent,), daemon=True).start()
        context = ray.get_runtime_context()
        return {
            "pid": pid,
            "start": started,
            "node_id": context.get_node_id(),
            "worker_pid": os.getpid(),
            "gpus": [str(g) for g in gpu_ids],
            "folder": self._node_folder.path if self._node_folder is not None else None,
        }

    def relay_pull(self, offsets: dict[str, int]) -> dict:
        """What grew in the attempt's folder on this node since ``offsets`` (``NodeFolder.pull``)."""
        return self._node_folder.pull(offsets) if self._node_folder is not None else {"files": {}, "held": {}}

    def relay_release(self, relative: str, count: int) -> None:
        if self._node_folder is not None:
            self._node_folder.release(relative, count)

    def notify(self, signum: int, whole_group: bool) -> None:
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            if whole_group:
                os.killpg(self._process.pid, signum)
            else:
                self._process.send_signal(signum)

    def kill(self) -> None:
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)

    def poll(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def wait(self, timeout: float) -> int | None:
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            return None

    def survivors(self) -> list[int]:
        return [] if self._process is None else group_members(self._process.pid)

    def cleanup(self) -> list[int]:
        """Kill and reap the whole group; what survived 10 s of SIGKILL (empty when all went)."""
        if self._process is not None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                self.kill()
                self.wait(0.2)
                if self._process.poll() is not None and not self.survivors():
                    break
        for log in self._logs:
            log.close()
        return self.survivors()

    def forget_folder(self) -> None:
        """The harness has pulled the attempt's folder for the last time: it goes from the node."""
        if self._node_folder is not None:
            self._node_folder.close()

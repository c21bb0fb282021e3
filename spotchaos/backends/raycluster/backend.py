"""The Ray backend: each attempt on a worker node of a Ray cluster, faults the way a spot reclaim
reaches a Ray node.

An attempt is one actor of :class:`~.agent.JobAgent`, pinned to the node chosen for it
(``NodeAffinitySchedulingStrategy(soft=False)``) and asking for the job's resources (``num_cpus``,
``num_gpus``, custom ones), so Ray itself refuses a node that lacks them. The attempt after a fault
goes to another node: the faulted one is drained or gone, and among free nodes the previous
attempt's comes last. Nothing of the job runs in the harness process; the harness talks to the
actor only.

- SIGTERM (``sigterm``, ``sigterm-group``): the node drained (reason preemption, deadline = the
  grace window), then SIGTERM to the job there; the node goes once the job has ended.
- SIGKILL (``sigkill``, the grace window's end, ``lose-node``): the node removed, every process of
  it SIGKILLed; a replacement joins off the attempt's clock.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ...errors import BackendError
from ...probe import ENV_CHECKPOINT_URI
from ...safety.safefs import create_new
from ..base import Backend, Handle, LaunchSpec
from .cluster import RayCluster, RayNode
from .relay import HOLD_VARIABLES, Relay

NODE_TRIES = 3  # nodes an attempt is started on before a node dead at its start is the attempt's error


class RayHandle(Handle):
    """One attempt on one Ray node."""

    def __init__(
        self, backend: RayBackend, node: RayNode, actor: Any, started: dict, folder: Path, relay: Relay | None = None
    ) -> None:
        self._backend = backend
        self._ray = backend.cluster.ray
        self.node = node
        self._actor = actor
        self._pid = int(started["pid"])
        self.identity = {"pid": self._pid, "start": started["start"]} if backend.cluster.local else {}
        self.placement = {"backend": "ray", **node.describe(), "ray_gpus": started.get("gpus") or []}
        self._gone = False  # the node was removed: the job went with it
        self._exit: int | None = None
        self._folder = folder  # the attempt's folder: the actor writes the job's exit status there
        self._cleaned = False
        self._lock = threading.Lock()
        self.relay = relay  # the attempt's folder pulled from the node's own, where it has one
        if relay is not None:
            self.placement["node_folder"] = started.get("folder")

    @property
    def pid(self) -> int:
        return self._pid

    def _call(self, method: str, *args: Any, timeout: float = 30) -> Any:
        return self._ray.get(getattr(self._actor, method).remote(*args), timeout=timeout)

    def notify(self, signum: int, *, whole_group: bool) -> None:
        if self._gone:
            return
        note = ""
        if signum == signal.SIGTERM:  # a spot reclaim: the node drains first, then its processes hear it
            note = self._backend.cluster.drain(self.node, self._backend.grace_seconds) + "; "
        self._call("notify", int(signum), whole_group)
        # where the report says what the node went through (a fault's detail is kept for what the
        # notice met on its way in: a shell, say)
        self.placement["fault"] = f"{note}{signal.Signals(signum).name} to the job on Ray node {self.node.name}"

    def kill(self) -> None:
        """The node is gone: the VM reclaimed (no notice, or the grace window over). On the user's
        cluster the node stays: the job's processes on it are SIGKILLed, nothing more."""
        if not self._backend.cluster.local:
            with contextlib.suppress(Exception):
                self._call("kill", timeout=10)
            self.placement["fault"] = f"SIGKILL to the job on Ray node {self.node.name}; " + (
                self._backend.cluster.remove(self.node)
            )
            return
        with self._lock:
            if self._gone:
                return
            self._gone = True
        with contextlib.suppress(Exception):  # the node may be half gone already; removal ends the rest
            self._call("kill", timeout=10)
        self._last_pull()  # what the node's folder holds goes with it: what the job wrote to the end, first
        self.placement["fault"] = self._backend.cluster.remove(self.node)
        self._backend.cluster.release_node(self.node)

    def _last_pull(self) -> None:
        if self.relay is not None:
            self.relay.stop()
            self.placement["relayed_bytes"] = self.relay.relayed_bytes

    def end_processes(self) -> None:
        """SIGKILL the job's processes on the node and keep the node (the end of an attempt, not a fault)."""
        if not self._gone:
            with contextlib.suppress(Exception):
                self._call("kill", timeout=10)

    def poll(self) -> int | None:
        return self.wait(0)

    def wait(self, timeout: float) -> int | None:
        if self._exit is not None:
            return self._exit
        if self._gone:
            return self._wait_local(timeout)
        try:
            self._exit = self._call("wait", float(timeout), timeout=timeout + 30)
        except Exception:  # the actor died with its node
            return self._wait_local(timeout)
        if self._exit is not None and self.relay is not None:
            with contextlib.suppress(Exception):  # what the job wrote to its end, here before its exit is read
                self.relay.pull_once()
        return self._exit

    def _wait_local(self, timeout: float) -> int | None:
        """The actor did not answer (its node removed, or a machine too loaded for the RPC): on a
        local cluster the job's exit is seen here (its pid, by identity) and its status read from
        the file the actor wrote on the node when the job exited; a job that left no status was
        killed with its node, and is reported as SIGKILLed."""
        if not self._backend.cluster.local:
            self._exit = -signal.SIGKILL
            return self._exit
        from ...host.processes import is_running

        deadline = time.monotonic() + max(timeout, 0)
        while is_running(self._pid, self.identity.get("start")):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        written = self._status_written()
        self._exit = written if written is not None else -signal.SIGKILL
        return self._exit

    def _status_written(self) -> int | None:
        """The exit status the actor wrote on the node (``agent.EXIT_FILE``), if it did: read like
        any file of the attempt's folder (bounded, no link followed)."""
        from ...safety.safefs import UnsafeFile, read_text_bounded
        from .agent import EXIT_FILE

        try:
            text = read_text_bounded(self._folder / EXIT_FILE, 64).strip()
        except (OSError, UnsafeFile):
            return None
        return int(text) if text.lstrip("-").isdigit() else None

    def survivors(self) -> list[int]:
        if self._gone:
            from ...host.processes import group_members

            return group_members(self._pid) if self._backend.cluster.local else []
        try:
            return list(self._call("survivors"))
        except Exception:
            return []

    def cleanup(self) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        left: list[int] = []
        if not self._gone:
            try:
                left = list(self._call("cleanup", timeout=60))
                self._last_pull()
                with contextlib.suppress(Exception):
                    self._call("forget_folder", timeout=30)
            finally:
                self._ray.kill(self._actor, no_restart=True)
                if self.node.drained:  # the reclaimed VM goes once its job has ended: a new one replaces it
                    self._gone = True
                    self.placement["after"] = self._backend.cluster.remove(self.node)
                self._backend.cluster.release_node(self.node)
        else:
            from ...host.processes import end, group_members

            self._last_pull()
            if self._backend.cluster.local:
                end(group_members(self._pid))
        self._backend.last_node = self.node.node_id
        if left:
            raise BackendError(f"processes {left} of the job on Ray node {self.node.name} survived SIGKILL for 10 s")


class RayBackend(Backend):
    """Runs each attempt on a worker node of ``cluster`` with the job's resources."""

    name = "ray"

    def __init__(
        self, cluster: RayCluster, resources: dict[str, float] | None = None, grace_seconds: float = 30.0
    ) -> None:
        self.cluster = cluster
        self.needs = {k: float(v) for k, v in (resources or {}).items()}
        self.grace_seconds = grace_seconds
        self.relay = cluster.relays  # its nodes do not share the harness's files
        self.last_node: str | None = None
        self._environment = dict(os.environ)

    def inherited_environment(self) -> dict[str, str]:
        return dict(self._environment)

    def start(self, spec: LaunchSpec) -> RayHandle:
        self.grace_seconds = spec.grace_seconds
        if self.relay:
            self._check_shared(spec)
        tries = NODE_TRIES
        while True:
            node = self.cluster.take_node(self.needs, avoid=self.last_node, timeout=300)
            try:
                return self._start_on(node, spec)
            except BackendError:
                tries -= 1
                if tries == 0 or self.cluster.node_alive(node):
                    raise
                # the node died before the job started (a replacement that never became healthy on
                # a loaded machine): not the job's doing; its processes go with it, another is tried
                self.cluster.lost(node)

    def _check_shared(self, spec: LaunchSpec) -> None:
        """Checkpoints where every node sees them, or one clear error: a folder of this machine
        is not there on another host, and a job that cannot find its checkpoint starts over."""
        uri = spec.env.get(ENV_CHECKPOINT_URI, "")
        if not uri.startswith("file://"):
            return  # the harness's S3, or no checkpoint folder of the harness's
        path = Path(uri[len("file://") :])
        shared = self.cluster.shared_folder
        # as text, never resolved: a path is judged by what it says, no link of anyone's followed
        if shared is not None and Path(os.path.abspath(path)).is_relative_to(os.path.abspath(shared)):
            return
        raise BackendError(
            f"the job's checkpoints would be in {path}, a folder of this machine, and the Ray cluster's "
            "nodes do not share this machine's files: give the job storage = \"s3\" (the harness's S3), or "
            "name a folder every node mounts at the same path in [tool.spotchaos.ray] shared_folder and put "
            "the runs inside it (--spotchaos-output=<that folder>/...)"
        )

    def _start_on(self, node: RayNode, spec: LaunchSpec) -> RayHandle:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from .agent import JobAgent

        ray = self.cluster.ray
        custom = {k: v for k, v in self.needs.items() if k not in ("CPU", "GPU")}
        try:
            actor = (
                ray.remote(JobAgent)
                .options(
                    num_cpus=self.needs.get("CPU", 0),
                    num_gpus=self.needs.get("GPU", 0),
                    resources=custom or None,
                    max_concurrency=4,
                    max_restarts=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
                )
                .remote()
            )
            started = ray.get(
                actor.start.remote(
                    list(spec.argv), spec.env, str(spec.cwd), str(spec.stdout_path), str(spec.stderr_path), self.relay
                ),
                timeout=120,
            )
        except BaseException as exc:
            self.cluster.release_node(node)
            if isinstance(exc, Exception):
                raise BackendError(f"could not start the job on Ray node {node.name}: {exc}") from None
            raise
        if "error" in started:
            ray.kill(actor, no_restart=True)
            self.cluster.release_node(node)
            raise BackendError(started["error"])
        folder = spec.stdout_path.parent
        relay = None
        if self.relay:  # the harness's copies of what the job writes on its node, pulled from there
            for path in (spec.stdout_path, spec.stderr_path):
                create_new(path).close()
            holds = tuple(
                str(Path(spec.env[name]).relative_to(folder))
                for name in HOLD_VARIABLES
                if name in spec.env and Path(spec.env[name]).is_relative_to(folder)
            )
            relay = Relay(
                lambda method, *args, timeout=30: ray.get(getattr(actor, method).remote(*args), timeout=timeout),
                folder,
                holds,
            ).start()
        return RayHandle(self, node, actor, started, folder, relay)

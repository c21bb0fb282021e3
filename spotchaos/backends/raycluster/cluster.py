"""The Ray cluster the gate runs on: a local one it starts and owns, or the user's at an address.

A local cluster (``ray.cluster_utils.Cluster``: a head of no CPU and ``workers`` worker nodes) is a
context manager that owns its life, testcontainers' way: closing it shuts the cluster down, ends
every process that was part of it (a removed node's workers outlive their raylet), and removes
its temporary folder. Its daemons are children of this process in this process's group, so the
harness never takes them for what a job left behind.

Two things Ray 2.60.0 does that the loopback-only rule cannot allow, and what is done about them
(docs/ray.md): it announces the machine's routable address unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (read when ray is imported: set before), and its head
probes the cloud metadata service (169.254.169.254, metadata.google.internal) even with usage
stats off, so the cluster's processes start with ``http(s)_proxy`` on a closed loopback port.

Faults act on nodes the way a spot reclaim reaches them: :meth:`drain` is the GCS drain request an
autoscaler sends (reason preemption, a deadline), :meth:`remove` is the VM gone (every process of
the node SIGKILLed). Either starts a replacement node, joining in the background, off the
attempt's clock: a notice's at once (an autoscaler hears of the reclaim then), a kill's after it.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...errors import BackendError
from ...host.ports import free_port
from ...host.processes import descendants, start_time
from .daemons import INHERITED_TOKEN, NodeDaemons, agent_ports

DRAIN_TIMEOUT_VARIABLE = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"  # read by a node's `ray start` (Ray 2.60)
# How soon the head's GCS counts a removed node dead: Ray's defaults (a check every 3 s, dead after
# 5 failures) make a VM that is gone alive to Ray, and its Train workers with it, for about 15 s after
# every process of it was SIGKILLed; a gone raylet refuses the check at once, so 3 failures a second
# apart say it in about 3 s. A raylet that is only slow still has each check's 10 s timeout (Ray's
# default, kept): 3 missed in a row is half a minute of no answer, longer than the defaults' 15 s
# for a dead one. Read by the GCS at start (RayConfig): the head's environment only.
HEALTH_CHECK_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
# The log monitor (what hands the workers' output to the driver, ``log_to_driver``) globs
# the session's log folder for new files every 0.1 s while it holds fewer than this many, and every
# 0.5 s (LOG_NAME_UPDATE_INTERVAL_S) beyond: a session's folders fill with every worker's logs, and
# three monitors (one a node, then) took 80 CPU-seconds of the main job. 0: every 0.5 s from the start; a new
# worker's output still reaches the driver whole (read from its first line), up to 0.5 s later.
LOG_MONITOR_ENV = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"}
# A worker node takes the head's temp folder (from the GCS), so its session's logs are the head's,
# which the head's log monitor hands to the drivers: with one a node, a driver got every line of a
# worker once per node (what `ray start --help` warns of for a second node on one host)
WORKER_NODE_ARGS = ("--include-log-monitor=false",)
# every Ray process on loopback, and no HTTP off the machine (Ray's metadata probe goes to a
# closed port on 127.0.0.1 and fails)
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "no_proxy": "127.0.0.1,localhost",
    "NO_PROXY": "127.0.0.1,localhost",
}


def import_ray() -> Any:
    """``import ray`` with the loopback switch set first (Ray reads it at import)."""
    from ...extras import require

    if "ray" in sys.modules:
        return sys.modules["ray"]
    saved = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # the driver's own address: 127.0.0.1, never guessed
    try:
        return require("ray", "ray", "the Ray backend")
    finally:  # read at import: the jobs' environment stays as it was
        if saved is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = saved


def _reload_ray_auth() -> None:
    """Ray reads its authentication mode and token once per process and caches both: read again,
    from the environment as it is now."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    """``values`` in this process's environment for a while (Ray reads them as it connects); None
    unsets a variable."""
    saved = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass
class RayNode:
    """One worker node: its Ray id, a name for messages and the report, and Ray's handle on it."""

    node_id: str
    name: str
    resources: dict[str, float]
    handle: Any = None  # ray._private.node.Node on a local cluster; None on the user's
    drained: bool = False
    replaced_by: str | None = None  # the node started in its place (at its notice, or once it was gone)
    busy: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, start) of its daemons
    # (pid, start) of every process of it when its `ray start` was sent SIGTERM: what its exit may
    # leave behind (workers re-parented once it is gone), ended with the node
    terminated: list[tuple[int, int | None]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"node": self.name, "node_id": self.node_id, "resources": self.resources}


class RayCluster(abc.ABC):
    """What the backend needs of a cluster: its worker nodes, placement, drain and removal."""

    drain_timeout: float = 30.0  # what its nodes drain for on a reclaim (a local cluster sets its own)

    def __init__(self) -> None:
        self.ray: Any = None
        self.nodes: dict[str, RayNode] = {}
        self._changed = threading.Condition()
        self.local = False
        self.train_singletons_owned = False  # Ray Train's cluster-wide actor made by the harness (train.py)
        # its nodes do not share the harness's files (other hosts, or the local cluster's nodes given
        # folders of their own): each attempt's folder is relayed through its agent (relay.py)
        self.relays = False
        self.relay_setting = "auto"  # [tool.spotchaos.ray] relay: "on" or "off" overrides what the nodes show
        self.shared_folder: str | None = None  # a folder every node mounts at the same path, if declared

    def _decide_relay(self, apart: bool) -> None:
        """Relay the attempts' folders where the nodes are ``apart`` from this machine's files, or as told."""
        self.relays = {"on": True, "off": False}.get(self.relay_setting, apart)

    # -- placement -------------------------------------------------------------------------
    def take_node(self, needs: dict[str, float], avoid: str | None, timeout: float) -> RayNode:
        """A worker node with ``needs`` that runs nothing of ours and is not drained, preferring one
        other than ``avoid`` (the node the job's previous attempt ran on); waits for one, since a
        replacement may still be joining."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                fitting = [n for n in self.nodes.values() if not n.drained and self._fits(n, needs)]
                if not fitting and not self._could_fit(needs):
                    offered = "; ".join(f"{n.name}: {n.resources}" for n in self.nodes.values()) or "no worker node"
                    raise BackendError(f"no Ray worker node offers {needs} ({offered})")
                free = [n for n in fitting if n.busy == 0]
                free.sort(key=lambda n: n.node_id == avoid)
                if free:
                    free[0].busy += 1
                    return free[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackendError(f"no free Ray worker node with {needs} within {timeout:g} s")
                self._changed.wait(min(left, 1.0))

    def node_alive(self, node: RayNode) -> bool:
        """Whether the GCS still counts ``node`` alive (a node that missed its health checks is dead
        to Ray, its actors with it); True when Ray cannot say."""
        try:
            states = {n.get("NodeID"): n.get("Alive") for n in self.ray.nodes()}
        except Exception:
            return True
        return bool(states.get(node.node_id, False))

    def release_node(self, node: RayNode) -> None:
        with self._changed:
            node.busy = max(0, node.busy - 1)
            self._changed.notify_all()

    @staticmethod
    def _fits(node: RayNode, needs: dict[str, float]) -> bool:
        return all(node.resources.get(key, 0) >= amount for key, amount in needs.items() if amount)

    def _could_fit(self, needs: dict[str, float]) -> bool:
        return any(self._fits(n, needs) for n in self.nodes.values()) or self._joining()

    def _joining(self) -> bool:
        return False

    # -- faults ----------------------------------------------------------------------------
    def drain(self, node: RayNode, grace_seconds: float) -> str:
        """Ask the GCS to drain ``node`` for preemption with a deadline of the grace window, as an
        autoscaler does when the cloud reclaims the VM; what Ray answered, for the fault record."""
        from ray.core.generated import autoscaler_pb2

        client = self.ray._raylet.GcsClient(address=self.gcs_address)
        deadline_ms = time.time_ns() // 1_000_000 + int(grace_seconds * 1000)
        accepted, rejection = client.drain_node(
            node.node_id,
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "spotchaos: spot reclaim",
            deadline_ms,
        )
        with self._changed:
            node.drained = True
        return "drain accepted" if accepted else f"drain refused: {rejection}"

    @abc.abstractmethod
    def remove(self, node: RayNode) -> str:
        """The node gone (a local cluster) or kept (the user's); what happened, for the report."""

    def terminate_node(self, node: RayNode) -> str:
        """SIGTERM to the node's ``ray start`` (a KubeRay pod reclaimed): the harness's own nodes only."""
        raise BackendError(f"node {node.name} is the user's: the harness signals no `ray start` of it")

    def lost(self, node: RayNode) -> None:
        """``node`` died on its own (Ray counts it dead): never placed on again."""
        with self._changed:
            self.nodes.pop(node.node_id, None)
            self._changed.notify_all()

    @property
    @abc.abstractmethod
    def gcs_address(self) -> str:
        """The head's GCS, host:port."""

    def client_environment(self) -> dict[str, str]:
        """What a process joining the cluster as a driver needs in its environment (a Ray Train
        job's): nothing on the user's cluster, whose own settings hold."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {"local": self.local, "address": self.gcs_address, "nodes": [n.describe() for n in self.nodes.values()]}


class LocalRayCluster(RayCluster):
    """A head and ``workers`` worker nodes on this machine, each a ``ray start --block`` process of
    this one (its environment given whole: loopback only), started, replaced and ended here; the
    processes themselves are :class:`NodeDaemons`'."""

    def __init__(
        self,
        workers: int = 2,
        cpus: float = 1,
        gpus: float = 0,
        resources: dict | None = None,
        *,
        drain_timeout: float = 30.0,
        separate_folders: bool = False,
    ) -> None:
        super().__init__()
        self.local = True
        # each worker node with a temporary folder of its own (TMPDIR), none of them the harness's,
        # and the attempts' folders relayed: a cluster of hosts that share no folder, on one machine
        self.separate_folders = separate_folders
        self.workers = workers
        self.drain_timeout = drain_timeout  # each worker node's RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S
        self.cpus, self.gpus, self.resources = cpus, gpus, dict(resources or {})
        self.daemons = NodeDaemons()
        self._port = 0
        self._head: subprocess.Popen | None = None
        self._serial = 0
        self.replaced = 0
        self.replace_errors: list[str] = []
        self._replacing: list[threading.Thread] = []
        self._launching = threading.Lock()  # one replacement node starting at a time (see _replace)
        self._client_env = contextlib.ExitStack()

    def __enter__(self) -> LocalRayCluster:
        self._decide_relay(self.separate_folders)
        self.ray = import_ray()
        if self.ray.is_initialized():
            raise BackendError("this process already drives a Ray cluster (one Ray driver per process): close it first")
        self.daemons.open()
        try:
            self._port = free_port()
            self._head = self._ray_start(
                "head",
                [
                    "--head",
                    f"--port={self._port}",
                    "--num-cpus=0",
                    "--include-dashboard=false",
                    f"--temp-dir={self.daemons.ray_dir}",
                ],
                HEALTH_CHECK_ENV,
            )
            self._connect(timeout=90)
            for _ in range(self.workers):  # one after the other: two at once time out on 2 busy cores
                self._register(*self._start_worker(), timeout=120)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self._port}"

    def client_environment(self) -> dict[str, str]:
        return dict(self.daemons.auth_env)

    @property
    def temp_dir(self) -> str | None:
        """The cluster's own folder (sessions, logs, sockets); gone once it is closed."""
        return self.daemons.temp_dir

    def _ray_start(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        env = {**os.environ, **LOOPBACK_ENV, **LOG_MONITOR_ENV, **(extra_env or {})}
        return self.daemons.start(name, [*args, *agent_ports()], env)

    def _connect(self, timeout: float) -> None:
        # this client joins as the cluster's processes do, for as long as it drives the cluster (Ray's
        # gRPC threads may read the token again at any time): the variables stay until close()
        self._client_env.enter_context(_environment({**self.daemons.auth_env, INHERITED_TOKEN: None}))
        _reload_ray_auth()
        deadline = time.monotonic() + timeout
        while True:
            if self._head is not None and self._head.poll() is not None:
                tail = self.daemons.log_tail("head")
                raise BackendError(f"the local Ray head exited ({self._head.returncode}): {tail}")
            try:
                self.ray.init(address=self.gcs_address, log_to_driver=False, logging_level="ERROR")
                return
            except Exception as exc:  # the GCS is not up yet
                if time.monotonic() > deadline:
                    raise BackendError(f"the local Ray head did not answer within {timeout:g} s: {exc}") from None
                time.sleep(0.5)

    def _start_worker(self) -> tuple[str, str]:
        """Start one more worker node; it is placed on once it has joined (:meth:`_register`)."""
        name, marker = self._next_worker()
        self._launch_worker(name, marker)
        return name, marker

    def _next_worker(self) -> tuple[str, str]:
        with self._changed:  # removals in parallel plans start replacements from several threads
            self._serial += 1
            name = f"worker-{self._serial}"
        return name, f"spotchaos-{name}"  # a resource only this node has: how its Ray id is found

    def _launch_worker(self, name: str, marker: str) -> None:
        resources = json.dumps({**self.resources, marker: 1})
        own: dict[str, str] = {DRAIN_TIMEOUT_VARIABLE: f"{self.drain_timeout:g}"}
        if self.separate_folders:
            own["TMPDIR"] = self.daemons.node_folder(name)
        self._ray_start(
            name,
            [
                f"--address={self.gcs_address}",
                f"--num-cpus={self.cpus:g}",
                f"--num-gpus={self.gpus:g}",
                f"--resources={resources}",
                *WORKER_NODE_ARGS,
            ],
            own,
        )

    def _register(self, name: str, marker: str, timeout: float) -> RayNode:
        deadline = time.monotonic() + timeout
        while True:
            starter = self.daemons.starters[name]
            if starter.poll() is not None:
                raise BackendError(f"Ray node {name} exited ({starter.returncode}): {self.daemons.log_tail(name)}")
            for info in self.ray.nodes():
                if info.get("Alive") and marker in info.get("Resources", {}):
                    resources = {k: float(v) for k, v in info["Resources"].items() if not k.startswith("node:")}
                    node = RayNode(info["NodeID"], name, resources)
                    node.processes = [(starter.pid, start_time(starter.pid))]
                    with self._changed:
                        self.nodes[node.node_id] = node
                        self._changed.notify_all()
                    return node
            if time.monotonic() > deadline:
                raise BackendError(f"Ray node {name} did not join within {timeout:g} s: {self.daemons.log_tail(name)}")
            time.sleep(0.2)

    def _joining(self) -> bool:
        return any(thread.is_alive() for thread in self._replacing)

    def remove(self, node: RayNode) -> str:
        """The VM gone: every process of the node SIGKILLed at once (its raylet, its workers, the job
        they run), and a replacement node started, joining in the background."""
        with self._changed:
            if self.nodes.pop(node.node_id, None) is None:
                return f"node {node.name} already gone"
            self._changed.notify_all()
        # what its drain's SIGTERM saw below the daemon may have left the tree since: by identity
        left_tree = [pid for pid, started in node.terminated if start_time(pid) == started]
        killed = self.daemons.kill(node.name, left_tree)
        replacement = self._start_replacement(node)  # the one its notice started, if it had one
        return f"node {node.name} removed: {killed} process(es) on it SIGKILLed; {replacement} replaces it"

    def drain(self, node: RayNode, grace_seconds: float) -> str:
        """The GCS drain, and the node's replacement started now, joining during the window (an
        autoscaler hears of a reclaim at its notice): no restart waits for a node to start after it."""
        answer = super().drain(node, grace_seconds)
        return f"{answer}; {self._start_replacement(node)} starting in its place"

    def _start_replacement(self, node: RayNode) -> str:
        """The name of the node that replaces ``node``: started now in the background, once a node."""
        with self._changed:
            if node.replaced_by is not None:
                return node.replaced_by
            name, marker = self._next_worker()
            node.replaced_by = name
        thread = threading.Thread(target=self._replace, args=(name, marker), name=f"spotchaos-ray-{name}", daemon=True)
        self._replacing.append(thread)
        thread.start()
        return name

    def lost(self, node: RayNode) -> None:
        """A node of ours that died on its own: what is left of it ended, a replacement started."""
        self.remove(node)

    def terminate_node(self, node: RayNode) -> str:
        """SIGTERM to the node's own ``ray start --block``, as the kubelet sends a reclaimed KubeRay
        pod's PID 1: Ray 2.60's handler drains the node for preemption (deadline: its drain timeout)
        and waits until it is idle or the deadline, then ends every process of it and exits 1. No
        process of the job is signalled; what is left at the deadline is :meth:`remove`'s."""
        starter = self.daemons.starters.get(node.name)
        if starter is None or starter.poll() is not None:
            return f"node {node.name}'s ray start had already exited"
        node.terminated = [(pid, start_time(pid)) for pid in descendants(starter.pid)]
        starter.send_signal(signal.SIGTERM)
        with self._changed:
            node.drained = True
        return (
            f"ray start of node {node.name} (pid {starter.pid}) sent SIGTERM: it drains for {self.drain_timeout:g} s; "
            f"{self._start_replacement(node)} starting in its place"
        )

    def _replace(self, name: str, marker: str) -> None:
        """Start and register a replacement, one at a time: two ``ray start`` at once on one
        machine may pick the same socket name under the cluster's folder (Ray numbers them by the
        files it finds), and the second raylet aborts (bind: Address already in use)."""
        try:
            with self._launching:
                self._launch_worker(name, marker)
                self._register(name, marker, timeout=180)
            self.replaced += 1
        except Exception as exc:  # said by the next placement that finds no node
            self.replace_errors.append(f"{type(exc).__name__}: {exc}")
        with self._changed:
            self._changed.notify_all()

    def close(self) -> None:
        """Shut the cluster down and make sure of it: no process of it left, its folder gone."""
        for thread in self._replacing:
            thread.join(timeout=180)
        if self.ray is not None:
            with contextlib.suppress(Exception):
                self.ray.shutdown()
        self._client_env.close()  # this process's environment as it was
        left = self.daemons.end()
        self.nodes.clear()
        if left:
            raise BackendError(f"Ray processes survived the cluster's shutdown: {', '.join(left)}")


class RemoteRayCluster(RayCluster):
    """The user's cluster at ``address``: its worker nodes are placed on and drained, never removed
    (the harness cannot end a VM it does not own): a kill ends the job's processes on the node."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address
        self._gcs = ""

    def __enter__(self) -> RemoteRayCluster:
        self.ray = import_ray()
        if self.ray.is_initialized():
            raise BackendError("this process already drives a Ray cluster (one Ray driver per process): close it first")
        self.ray.init(address=self.address, log_to_driver=False, logging_level="ERROR")
        self._gcs = self.ray.get_runtime_context().gcs_address
        hosts = {str(info.get("NodeManagerAddress", "")) for info in self.ray.nodes() if info.get("Alive")}
        # nodes on other hosts share none of this machine's folders, unless told: relayed
        self._decide_relay(not hosts <= {"127.0.0.1", "localhost", self._gcs.rsplit(":", 1)[0]})
        for info in self.ray.nodes():
            if info.get("Alive") and info["Resources"].get("CPU", 0) > 0:
                node_id = info["NodeID"]
                resources = {k: float(v) for k, v in info["Resources"].items() if not k.startswith("node:")}
                self.nodes[node_id] = RayNode(node_id, f"node-{node_id[:8]}", resources)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.ray.shutdown()

    @property
    def gcs_address(self) -> str:
        return self._gcs

    def drain(self, node: RayNode, grace_seconds: float) -> str:
        return f"node {node.name} not drained (the user's cluster: the harness changes no node of it)"

    def remove(self, node: RayNode) -> str:
        return f"node {node.name} kept (the user's cluster: the harness removes no node of it)"


def cluster_for(settings: Any, address: str | None) -> RayCluster:
    """The session's cluster, not yet open: the user's (``address``, else ``[tool.spotchaos.ray]
    address``), or a local one of a head and the worker nodes ``settings`` (RaySettings) asks for."""
    from ...config.jobs import RaySettings

    ray = settings or RaySettings()
    address = address or ray.address
    if address:
        cluster: RayCluster = RemoteRayCluster(address)
    else:
        cluster = LocalRayCluster(
            ray.workers,
            ray.cpus_per_worker,
            ray.gpus_per_worker,
            dict(ray.resources_per_worker),
            drain_timeout=ray.drain_timeout_seconds,
            separate_folders=ray.separate_node_folders,
        )
    cluster.shared_folder = ray.shared_folder
    cluster.relay_setting = ray.relay
    return cluster

"""Ray Train jobs (``launcher = "ray-train"``): the driver a user writes runs here, its workers on
the session's Ray cluster, and the faults reach them where a spot reclaim does.

The driver is a local process group (the subprocess backend): ``sigkill`` ends it, and Ray ends
the run's controller and workers with their owner, as when the machine running the driver goes.
It connects to the cluster through ``RAY_ADDRESS``; the probe's variables reach its workers the way
``ray job submit`` hands a driver its job's runtime environment (``RAY_JOB_CONFIG_JSON_ENV_VAR``,
which ``ray.init`` merges with the driver's own), so the user's script needs no line for the gate.
The workers report their ranks (Ray Train sets ``RANK``); the rank-level faults then reach the
Train workers themselves: ``kill-rank<r>`` SIGKILLs one, ``lose-node<r>`` removes the Ray node that
runs rank ``r`` (a local cluster starts a replacement). Ray Train answers both by restarting its
worker group from the latest reported checkpoint (``FailureConfig``), inside the same attempt, which
the engine splits into an attempt of its own, as for torchrun's group restarts.
"""

from __future__ import annotations

import json
import signal
from dataclasses import replace
from typing import Any

from ...backends.base import Backend, LaunchSpec
from ...backends.raycluster.cluster import LOOPBACK_ENV, RayCluster, RayNode
from ...backends.raycluster.daemons import with_auth
from ...backends.subprocess import SubprocessBackend
from ...config.jobs import JobSpec
from ...errors import JobError
from ...host.processes import descendants
from ..trajectory import RunRecord
from .ranked import LaunchedNode, RankedHandle

JOB_CONFIG_VARIABLE = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # how `ray job submit` gives a driver its runtime_env
WORKER_PREFIXES = ("SPOTCHAOS_",)  # what the Train workers need of the attempt's environment


def worker_environment(env: dict[str, str]) -> dict[str, str]:
    """The variables of the attempt that its Train workers must see: the probe's contract."""
    return {k: v for k, v in env.items() if k.startswith(WORKER_PREFIXES) or k == "PYTHONUNBUFFERED"}


def driver_environment(env: dict[str, str], cluster: RayCluster) -> dict[str, str]:
    """The driver's environment: the cluster to join (as the cluster's own processes do), loopback
    only, and the job's runtime_env."""
    job_config = {"runtime_env": {"env_vars": worker_environment(env)}}
    joining = {"RAY_ADDRESS": cluster.gcs_address, JOB_CONFIG_VARIABLE: json.dumps(job_config)}
    return {**with_auth({**env, **LOOPBACK_ENV}, cluster.client_environment()), **joining}


class RayTrainBackend(Backend):
    """Starts a Ray Train driver for each attempt, against ``cluster``."""

    name = "ray-train"

    def __init__(self, cluster: RayCluster, driver: Backend | None = None) -> None:
        self.cluster = cluster
        self.driver = driver or SubprocessBackend()

    @property
    def warm(self) -> Any:
        """The warm interpreters the driver forks from (its ``SubprocessBackend``'s), or None."""
        return self.driver.warm

    def inherited_environment(self) -> dict[str, str]:
        return self.driver.inherited_environment()

    def start(self, spec: LaunchSpec) -> RayTrainHandle:
        raise JobError('a Ray Train driver is started by its job (launcher = "ray-train"): start_job')

    def start_job(self, job: JobSpec, spec: LaunchSpec, run_id: str) -> RayTrainHandle:
        own_cluster_singletons(self.cluster)
        return RayTrainHandle(self, job, spec, run_id)


def own_cluster_singletons(cluster: RayCluster) -> None:
    """Make Ray Train's cluster-wide actor from the harness's own driver, before any job does.

    The first run that schedules its workers creates a detached ``AutoscalingCoordinator`` actor
    (ray.data's, in Ray 2.60.0; ``max_restarts=-1``) with the runtime environment of the job that
    made it: that attempt's ``SPOTCHAOS_*`` variables (its run's marker, its events file) would live
    on in it for the cluster's life, and Ray starts it again whenever it is killed. Made here first, it carries
    the harness's environment, none of a job's."""
    if cluster.train_singletons_owned:
        return
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError:  # another Ray: nothing of the kind to make
        return
    get_or_create_autoscaling_coordinator()
    cluster.train_singletons_owned = True


class RayTrainHandle(RankedHandle):
    """One attempt of a Ray Train job: its driver here, its workers wherever Ray placed them."""

    launcher = "Ray Train"
    # how long a drain takes to reach the loop: Train V2's PreemptionWatcher polls every 5 s
    notice_lag_seconds = 6.0

    def __init__(self, backend: RayTrainBackend, job: JobSpec, spec: LaunchSpec, run_id: str) -> None:
        super().__init__(job, run_id)
        self.cluster = backend.cluster
        env = driver_environment(spec.env, self.cluster)
        # a warm driver's interpreter starts joined already (the cluster's address, its loopback
        # settings and authentication, which Ray reads once per process): only the attempt's own
        # variables differ between its forks
        start_env = None if spec.start_env is None else driver_environment(spec.start_env, self.cluster)
        driver = backend.driver.start(replace(spec, env=env, start_env=start_env))
        self.nodes.append(LaunchedNode(0, driver))
        self.identity = {**driver.identity}
        self.removed: list[str] = []
        self.drained: list[RayNode] = []  # by a notice, until its deadline
        self.rank_nodes: dict[int, list[str]] = {}

    @property
    def start_kind(self) -> str:
        """The driver's start: "warm" where it forked from the job's warm interpreter; its Train
        workers are Ray's processes, which Ray starts either way."""
        return self.nodes[0].handle.start_kind

    def notify(self, signum: int, *, whole_group: bool) -> None:
        """A notice reaches a Ray Train job as a spot reclaim does: every node that runs one of its
        ranks drained for preemption with the grace window as its deadline, no signal sent. Train
        V2's PreemptionWatcher sees the drain (it polls every 5 s) and hands it to the loop as
        ``ray.train.get_preemption_info()``; the controller keeps the group running until the
        deadline, when :meth:`reclaim` takes the nodes, and restarts it from the latest checkpoint.
        A signal to the driver would be no cloud's notice: the driver does not run on the VMs
        reclaimed. ``whole_group`` changes nothing (a drain reaches the whole node)."""
        if not self.cluster.local:
            raise JobError(
                f"job {self.job.name!r}: a notice ({signal.Signals(signum).name}) to a Ray Train job drains its "
                "workers' nodes, which only a local cluster of the harness's may have done to it; on the user's "
                "cluster plan sigkill (the driver and its run gone) or kill-rank<r> (one Train worker)"
            )
        self._drain(sorted(self.ranks))

    def drain_node(self, index: int) -> None:
        """``drain-node<r>``: the node that runs rank ``r`` drained for preemption, alone, with the
        grace window as its deadline (one spot VM reclaimed); removed at the deadline. The ranks on
        other nodes hear of it only from the loop's own agreement (``get_preemption_info()`` names
        the drained ranks, on every rank)."""
        if not self.cluster.local:
            raise JobError(
                f"job {self.job.name!r}: drain-node{index} drains a node, which only a local cluster of the "
                "harness's may have done to it; on the user's cluster plan kill-rank<r> (one Train worker)"
            )
        self._drain([index])

    @property
    def notice_window_seconds(self) -> float:
        """The window a notice gives: the grace window, which the drain's deadline is; under
        ``notice = "kuberay"`` the nodes' own drain timeout (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S),
        which is what a reclaimed KubeRay pod's ``ray start`` drains for, whatever the cloud gives."""
        if self.job.kuberay_notice:
            return float(self.cluster.drain_timeout)
        return float(self.job.grace_seconds or 30.0)

    def _drain(self, ranks: list[int]) -> None:
        """Every node running one of ``ranks`` drained for preemption: by the GCS with the grace
        window as deadline, or (``notice = "kuberay"``) by its own ``ray start`` on SIGTERM."""
        grace = self.notice_window_seconds
        hosting: dict[str, tuple[RayNode, list[int]]] = {}
        for rank in ranks:
            node = self.node_of_rank(rank)
            hosting.setdefault(node.node_id, (node, []))[1].append(rank)
        notes = []
        for node, on_it in hosting.values():
            kuberay = self.job.kuberay_notice
            answer = self.cluster.terminate_node(node) if kuberay else self.cluster.drain(node, grace)
            self.drained.append(node)
            notes.append(f"Ray node {node.name} (rank {', '.join(map(str, on_it))}) drained: {answer}")
        how = "KubeRay's drain timeout" if self.job.kuberay_notice else "preemption"
        self.delivery_note = f"{'; '.join(notes)}; deadline in {grace:g} s ({how})"

    def reclaim(self) -> None:
        """The drain's deadline: the drained nodes go, every process of them at once, as the cloud
        takes the VMs back (a local cluster starts their replacements). The driver runs on: Ray
        Train restarts the group, which the engine splits into an attempt of its own."""
        for node in self.drained:
            self.cluster.remove(node)
            self.removed.append(node.name)
        self.drained = []

    def cleanup(self) -> None:
        """The attempt's processes ended, and a node still drained goes too (a run that finished
        inside the window): a reclaimed VM never serves the next attempt."""
        try:
            super().cleanup()
        finally:
            self.reclaim()

    def note_rank(self, rank: int, pid: object) -> None:
        super().note_rank(rank, pid)
        process = self.ranks.get(rank)
        node = self._node_running(process.pid) if process is not None and process.pid == pid else None
        ran_on = self.rank_nodes.setdefault(rank, [])
        if node is not None and node.name not in ran_on[-1:]:
            ran_on.append(node.name)  # where the report says it ran, group run by group run

    def _node_running(self, pid: int) -> RayNode | None:
        """The worker node whose process tree holds ``pid`` (a local cluster's nodes are process
        trees of this machine; the user's are not, and hold nothing here)."""
        for node in list(self.cluster.nodes.values()):
            if any(pid in descendants(root) for root, _ in node.processes):
                return node
        return None

    def node_of_rank(self, rank: int) -> RayNode:
        process = self._live_rank(rank)
        node = self._node_running(process.pid)
        if node is None:
            raise JobError(
                f"job {self.job.name!r}: rank {rank} (pid {process.pid}) runs on no worker node of the cluster"
            )
        return node

    def lose_node(self, index: int) -> None:
        """``lose-node<r>``: the node that runs rank ``r`` removed, every process of it at once."""
        if not self.cluster.local:
            raise JobError(
                f"job {self.job.name!r}: lose-node{index} removes a node, which only a local cluster of the "
                "harness's may have done to it; on the user's cluster kill-rank reaches one worker"
            )
        node = self.node_of_rank(index)
        what = self.cluster.remove(node)
        self.removed.append(node.name)
        self.delivery_note = f"Ray node {node.name} (rank {index}'s) lost: {what}"

    @property
    def placement(self) -> dict | None:
        """The nodes each rank's worker ran on, in order (a group restart may move it), and which
        nodes were removed."""
        ranks = {str(rank): list(names) for rank, names in sorted(self.rank_nodes.items())}
        return {"backend": "ray-train", "ranks": ranks, "removed": list(self.removed)}


LOST_SILENTLY = "work was lost silently"
UNREGISTERED = (
    "; hint: Ray Train restarted from an earlier checkpoint than the job called durable: ray.train.report "
    "returns once the folder is in storage, but the controller registers the checkpoint at its next poll of "
    "the workers (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s), and only a registered one is restored; call it "
    "durable once the run's checkpoint_manager_snapshot.json names it (docs/ray.md)"
)
NODES_TAKEN = "before the grace window's end took the group's nodes"
UNHEARD = (
    "; hint: Ray Train hands a drain to the loop as ray.train.get_preemption_info(): ask it every step (every "
    "rank: it is a barrier) and report a checkpoint when it is not None (docs/ray.md)"
)


def _hint(failure: str) -> str:
    """What Ray Train's own behaviour adds to a failure, if anything."""
    if failure.endswith(LOST_SILENTLY):
        return UNREGISTERED
    return UNHEARD if NODES_TAKEN in failure else ""


def explain(failures: list[str], run: RunRecord) -> list[str]:
    """A verdict's failures with what they mean for a Ray Train job, where Ray Train's own
    behaviour is the likely cause; a run that a notice ended as finished, said first."""
    hinted = [failure + _hint(failure) for failure in failures]
    ended = next((a for a in run.attempts if a.fault is not None and a.fault.grace_seconds and a.exit_code == 0), None)
    if ended is None or ended.final is not None:
        return hinted
    last = ended.steps[-1].step if ended.steps else None
    return [
        f"the run ended as finished after step {last}, {ended.fault.exit_seconds or 0:.1f} s after the drain "
        f"notice of attempt {ended.index} (at step {ended.fault.observed_step}): the train function returned, and Ray "
        "Train takes a train function that returns for a finished run (fit() raised nothing, the driver exited "
        "0); on ray.train.get_preemption_info() report a checkpoint and train on: the controller restarts the "
        "group from it at the deadline",
        *hinted,
    ]

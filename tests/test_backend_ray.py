"""The Ray backend on a real Ray cluster on this machine: a head and two worker nodes of one CPU
(``ray start`` processes on 127.0.0.1), the reference trainer's attempts placed on them, a node
drained for preemption, a node removed, the next attempt on another node, and nothing of the
cluster left once it closes. The built-in scenarios on it are the main job's (scenarios/test_ray.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from spotchaos.backends.raycluster import LocalRayCluster
from spotchaos.config import ConfigError, job_from_mapping, load_settings
from spotchaos.errors import SpotchaosError
from spotchaos.families.preemption import ChaosFailure
from spotchaos.leftovers import LIVE_DIR_VARIABLE, LiveJobs
from spotchaos.processes import become_subreaper
from spotchaos.record import ScenarioRecord
from spotchaos.runner import ChaosRunner

from .helpers import ROOT, is_alive, trainer_job

SETTINGS = load_settings(ROOT / "pyproject.toml")
RAY_JOB = next(job for job in SETTINGS.jobs if job.name == "reference-ray")


@pytest.fixture(scope="module")
def ray_runner(tmp_path_factory):
    """One session, so one local cluster (started with the first Ray job) for the module."""
    with ChaosRunner(ROOT, workdir=tmp_path_factory.mktemp("ray-runs")) as runner:
        yield runner


def test_a_notice_drains_the_node_a_kill_removes_it_and_each_restart_runs_elsewhere(ray_runner):
    record = ScenarioRecord("ray", RAY_JOB.name, None)
    ray_runner.check(RAY_JOB, "sigterm@7,sigkill@15", record)  # bit-exact, or ChaosFailure
    run = record.runs[-1]
    nodes = [placement["node_id"] for placement in run["nodes"]]
    assert len(nodes) == 3 and nodes[0] != nodes[1] and nodes[1] != nodes[2], run["nodes"]
    assert [fault["fault"] for fault in run["faults"]] == ["sigterm", "sigkill"]
    drained, killed = run["nodes"][0], run["nodes"][1]
    assert drained["fault"] == f"drain accepted; SIGTERM to the job on Ray node {drained['node']}", drained
    assert drained["after"].startswith(f"node {drained['node']} removed"), drained  # the VM went with its job
    assert killed["fault"].startswith(f"node {killed['node']} removed"), killed
    cluster = ray_runner.ray_cluster()
    alive = {node.node_id for node in cluster.nodes.values()}
    assert not alive & {nodes[0], nodes[1]}  # the drained node and the removed one are gone, replaced
    assert cluster.replaced >= 2 and not cluster.replace_errors, cluster.replace_errors


@pytest.mark.parametrize(
    ("broken", "plan", "defect"),
    [
        pytest.param(
            trainer_job("broken_no_optimizer_restore"), "sigterm@7", r"the optimizer state differs", id="optimizer"
        ),
        pytest.param(trainer_job("broken_no_rng_restore"), "sigkill@10", r"(loss|rng) diverged at step", id="rng"),
        pytest.param(
            trainer_job("broken_ignores_sigterm", "--step-seconds", "0.25", grace_seconds=1.5),
            "sigterm@3",
            r"grace window exceeded: the job did not exit within 1.5 s of sigterm",
            id="ignores-sigterm",
        ),
    ],
)
def test_a_broken_trainer_fails_on_ray_with_the_message_it_gets_as_a_subprocess(ray_runner, broken, plan, defect):
    """The same defect named in the same words (numbers aside: a step observed, a run's folder)."""
    messages = []
    for job in (replace(broken, backend="ray"), broken):
        with pytest.raises(ChaosFailure) as failure:
            ray_runner.check(job, plan)
        messages.append(str(failure.value))
    on_ray, as_subprocess = messages
    assert re.search(defect, on_ray), on_ray
    assert re.sub(r"\d+", "N", on_ray) == re.sub(r"\d+", "N", as_subprocess), (on_ray, as_subprocess)


def test_a_job_asking_for_what_no_node_has_is_one_clear_error(ray_runner):
    greedy = replace(RAY_JOB, name="greedy", ray_resources=(("num_gpus", 8.0),))
    with pytest.raises(SpotchaosError, match=r"no Ray worker node offers \{'CPU': 1\.0, 'GPU': 8\.0\}"):
        ray_runner.check(greedy, "sigterm@7")


OPEN_AND_CLOSE = """
import json, os, sys
from spotchaos.backends.raycluster import LocalRayCluster
from spotchaos.processes import become_subreaper, children
become_subreaper()
shared_before = os.path.exists("/tmp/ray")
def tree(pid):
    found, todo = [], [pid]
    while todo:
        current = todo.pop(); found.append(current); todo.extend(children(current))
    return found
with LocalRayCluster(workers=1) as cluster:
    daemons = children(os.getpid())
    print(json.dumps({"daemons": len(daemons), "pids": [p for d in daemons for p in tree(d)],
                      "temp": cluster.temp_dir, "nodes": len(cluster.nodes)}), flush=True)
print(json.dumps({"shared_tmp": os.path.exists("/tmp/ray") and not shared_before}))
"""


def test_nothing_of_a_local_cluster_is_left_once_it_closes():
    """In a process of its own (one Ray driver per process): every process of the cluster gone once
    it closes, its folder removed, nothing written to the machine's shared /tmp/ray."""
    become_subreaper()  # what the cluster's process might orphan would come here, and be seen alive
    done = subprocess.run([sys.executable, "-c", OPEN_AND_CLOSE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    opened, closed = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert opened["daemons"] == 2 and opened["nodes"] == 1 and len(opened["pids"]) > 6, opened  # head, worker, theirs
    assert not [pid for pid in opened["pids"] if is_alive(pid)], "Ray processes survived the close"
    assert not Path(opened["temp"]).exists() and not closed["shared_tmp"]


DIE_WITH_CLUSTER_OPEN = """
import json, os, signal
from spotchaos.backends.raycluster import LocalRayCluster
from spotchaos.processes import children
def tree(pid):
    found, todo = [], [pid]
    while todo:
        current = todo.pop(); found.append(current); todo.extend(children(current))
    return found
cluster = LocalRayCluster(workers=1).__enter__()
print(json.dumps({"pids": [p for d in children(os.getpid()) for p in tree(d)], "temp": cluster.temp_dir}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # pytest killed with the cluster open: nothing closes it
"""


def test_a_cluster_left_by_a_killed_session_is_ended_by_the_next(tmp_path):
    become_subreaper()
    env = {**os.environ, LIVE_DIR_VARIABLE: str(tmp_path / "live")}
    died = subprocess.run([sys.executable, "-c", DIE_WITH_CLUSTER_OPEN], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip
    assert died.returncode == -9, died.stderr[-3000:]
    opened = json.loads(died.stdout.splitlines()[-1])
    assert [pid for pid in opened["pids"] if is_alive(pid)], "the cluster should outlive its killed session"
    ended = LiveJobs(tmp_path / "live").reap()  # what the next session does first
    assert any("ray-cluster-" in line for line in ended) and any(opened["temp"] in line for line in ended), ended
    deadline = time.monotonic() + 10
    while [pid for pid in opened["pids"] if is_alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in opened["pids"] if is_alive(pid)] and not Path(opened["temp"]).exists()


def test_a_second_cluster_in_one_process_is_one_clear_error(ray_runner):
    ray_runner.ray_cluster()  # the module's, open
    with pytest.raises(SpotchaosError, match="already drives a Ray cluster"), LocalRayCluster(workers=1):
        pass


@pytest.mark.unit
@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"backend": "k8s"}, r"backend: must be one of subprocess, ray, got 'k8s'"),
        ({"backend": "ray", "image": "train:1"}, r"a Ray job runs in its nodes' own environment"),
        ({"backend": "ray", "ray_resources": {"num_gpus": -1}}, r"ray_resources: must be a table of amounts"),
        ({"backend": "ray", "ray_resources": ["num_cpus"]}, r"ray_resources: must be a table of amounts"),
    ],
)
def test_bad_ray_job_settings_name_the_key(table, message):
    with pytest.raises(ConfigError, match=message):
        job_from_mapping("j", {"command": ["python", "train.py"], **table}, "pyproject.toml")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("workers = 0", r"\[tool.spotchaos.ray\].workers: must be a whole number of worker nodes from 1 to 16"),
        ("nodes = 2", r"\[tool.spotchaos.ray\].nodes: unknown key"),
        ("address = ''", r"\[tool.spotchaos.ray\].address: must be a Ray address"),
    ],
)
def test_bad_ray_cluster_settings_name_the_key(tmp_path, table, message):
    (tmp_path / "pyproject.toml").write_text(f"[tool.spotchaos.ray]\n{table}\n")
    with pytest.raises(ConfigError, match=message):
        load_settings(tmp_path / "pyproject.toml")


@pytest.mark.unit
def test_a_ray_job_asks_a_node_for_a_cpu_its_gpus_and_its_custom_resources():
    job = job_from_mapping(
        "j", {"command": ["python", "t.py"], "backend": "ray", "gpus": 1, "ray_resources": {"spot": 1}}, "p"
    )
    assert job.ray_needs() == {"CPU": 1.0, "GPU": 1.0, "spot": 1.0}
    assert replace(job, backend="subprocess").on_backend("ray").backend == "ray"

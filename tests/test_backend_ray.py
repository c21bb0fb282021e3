"""The Ray backend on a real Ray cluster on this machine: a head and two worker nodes of one CPU and
one declared GPU (``ray start`` processes on 127.0.0.1), the reference trainer's attempts placed on them, a node
drained for preemption, a node removed, the next attempt on another node, and nothing of the
cluster left once it closes. The built-in scenarios on it are the main job's (scenarios/test_ray.py)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from spotchaos.backends.base import LaunchSpec
from spotchaos.backends.raycluster import LocalRayCluster, RayBackend
from spotchaos.backends.raycluster.agent import EXIT_FILE
from spotchaos.backends.raycluster.cluster import LOOPBACK_ENV
from spotchaos.config.jobs import ConfigError, JobSpec, job_from_mapping, load_settings
from spotchaos.errors import SpotchaosError
from spotchaos.families.preemption import ChaosFailure
from spotchaos.faults.plan import Plan
from spotchaos.host.leftovers import LIVE_DIR_VARIABLE, MARKER_VARIABLE, LiveJobs
from spotchaos.host.processes import become_subreaper, carrying, descendants, end
from spotchaos.record import ScenarioRecord
from spotchaos.session import Session
from spotchaos.training.multirank.ray_train import driver_environment

from .helpers import FIXTURES, ROOT, is_alive, run_pytest, trainer_job

SETTINGS = load_settings(ROOT / "pyproject.toml")
RAY_JOB = next(job for job in SETTINGS.jobs if job.name == "reference-ray")
NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.fixture(scope="module")
def ray_runner(tmp_path_factory):
    """One session on one local cluster for the module (one Ray driver per process): a head and two
    worker nodes of one CPU and one GPU each, the GPU declared (Ray hands it out; no device needed)."""
    runs = tmp_path_factory.mktemp("ray-runs")
    with LocalRayCluster(workers=2, cpus=1, gpus=1) as cluster, Session(ROOT, workdir=runs) as runner:
        runner.use_ray_cluster(cluster)
        yield runner


def test_a_notice_drains_the_node_a_kill_removes_it_and_each_restart_runs_elsewhere(ray_runner):
    with ScenarioRecord("ray", RAY_JOB.name, None) as record:
        ray_runner.check(RAY_JOB, "sigterm@7,sigkill@15")  # bit-exact, or ChaosFailure
    run = record.runs[-1]
    nodes = [placement["node_id"] for placement in run["nodes"]]
    assert len(nodes) == 3 and nodes[0] != nodes[1] and nodes[1] != nodes[2], run["nodes"]
    assert [fault["fault"] for fault in run["faults"]] == ["sigterm", "sigkill"]
    drained, killed = run["nodes"][0], run["nodes"][1]
    # the replacement starts at the notice (an autoscaler hears of the reclaim then), and is the one
    # node that replaces it once the VM has gone with its job: never a second
    notice = re.fullmatch(
        rf"drain accepted; (worker-\d+) starting in its place; SIGTERM to the job on Ray node {drained['node']}",
        drained["fault"],
    )
    assert notice, drained
    assert drained["after"].startswith(f"node {drained['node']} removed"), drained
    assert drained["after"].endswith(f"; {notice.group(1)} replaces it"), drained
    assert killed["fault"].startswith(f"node {killed['node']} removed"), killed
    cluster = ray_runner.ray_cluster()
    alive = {node.node_id for node in cluster.nodes.values()}
    assert not alive & {nodes[0], nodes[1]}  # the drained node and the removed one are gone, replaced
    assert cluster.replaced >= 2 and not cluster.replace_errors, cluster.replace_errors


def test_a_crash_point_inside_a_save_kills_the_job_on_its_node_and_the_resume_is_exact(ray_runner):
    """The crash point is armed in the job's own process on the Ray node (the attempt's variables
    reach it through the node's agent, the SIGKILL it deals itself is read back from there): it
    lands before the planned event of a save, and the next attempt, on another node, resumes from
    what that save left. The built-in scenario's search of every such point is the reference job's
    (spotchaos/scenarios/test_checkpoint_damage.py): the same hook in the same trainer."""
    rename = next(b for b in ray_runner.save_boundaries(RAY_JOB) if b["event"] == "os.rename")
    with ScenarioRecord("ray-crash", RAY_JOB.name, None) as record:
        assert ray_runner.check(RAY_JOB, Plan.parse(f"crash@{rename['index']}")).passed
    run = record.runs[-1]
    (fault,) = run["faults"]
    assert fault["fault"] == "crash" and fault["detail"].startswith("before os.rename "), fault
    nodes = [placement["node_id"] for placement in run["nodes"]]
    assert len(nodes) == 2 and nodes[0] != nodes[1], run["nodes"]


@pytest.mark.parametrize(
    ("broken", "plan", "defect"),
    [
        pytest.param(
            trainer_job("broken_no_optimizer_restore"), "sigterm@7", r"the optimizer state differs", id="optimizer"
        ),
        pytest.param(
            trainer_job("broken_ignores_sigterm", "--step-seconds", "0.25", grace_seconds=1.5),
            "sigterm@3",
            r"grace window exceeded: the job did not exit within 1.5 s of sigterm",
            id="ignores-sigterm",
            marks=pytest.mark.full,  # CI names one defect on Ray; a second is the full run's (docs/ci.md)
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


def test_a_gpu_job_sees_the_gpu_ray_gave_its_attempt_on_each_node(ray_runner, tmp_path):
    witness = tmp_path / "witness"
    witness.mkdir()
    command = ("python", str(FIXTURES / "gpu_witness_trainer.py"), "--steps", "12", "--checkpoint-every", "3")
    job = JobSpec(name="ray-gpu", command=command, gpus=1, backend="ray", grace_seconds=10,
                  env=(("GPU_WITNESS_DIR", str(witness)),))  # fmt: skip
    with ScenarioRecord("ray-gpu", job.name, None) as record:
        ray_runner.check(job, "sigkill@5")
    attempts = [json.loads(line) for line in (witness / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) >= 3 and all(a["devices"] == ["0"] for a in attempts), attempts  # the reference, then 2
    nodes = record.runs[-1]["nodes"]
    assert [n["ray_gpus"] for n in nodes] == [["0"], ["0"]] and nodes[0]["node_id"] != nodes[1]["node_id"], nodes
    assert all(n["resources"]["GPU"] == 1.0 for n in nodes), nodes


def test_a_jobs_exit_is_read_from_its_node_when_the_actor_no_longer_answers(ray_runner, tmp_path):
    """Under load (or with its node going) an RPC to the attempt's actor fails: the job's exit
    status is then the one the actor wrote on the node when the job exited, not a SIGKILL."""
    backend = RayBackend(ray_runner.ray_cluster(), {"CPU": 1.0}, 10.0)
    argv = (sys.executable, "-c", "import sys; sys.exit(3)")
    spec = LaunchSpec(argv, backend.inherited_environment(), tmp_path, tmp_path / "stdout", tmp_path / "stderr")
    handle = backend.start(spec)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / EXIT_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / EXIT_FILE).read_text() == "3\n"
        backend.cluster.ray.kill(handle._actor, no_restart=True)  # every call to it fails from now on
        assert handle.wait(10) == 3
    finally:
        with contextlib.suppress(Exception):  # the actor is gone: the node is released all the same
            handle.cleanup()


def test_a_node_dead_before_its_job_started_is_replaced_and_the_job_starts_on_another(ray_runner, tmp_path):
    """A node that dies on its own (a replacement that never became healthy on a loaded machine)
    fails the actor's start; that is no failure of the job: the node is counted lost (what is left
    of it ended, a replacement started) and the job starts on another node."""
    cluster = ray_runner.ray_cluster()
    dead, other = list(cluster.nodes.values())[:2]
    starter = cluster.daemons.starters[dead.name]
    end([*descendants(starter.pid), starter.pid])  # behind the cluster's back: it still lists the node
    other.busy += 1  # the dead node is the one free to take
    backend = RayBackend(cluster, {"CPU": 1.0}, 10.0)
    argv = (sys.executable, "-c", "import sys; sys.exit(3)")
    spec = LaunchSpec(argv, backend.inherited_environment(), tmp_path, tmp_path / "stdout", tmp_path / "stderr")
    threading.Timer(5.0, cluster.release_node, (other,)).start()  # free again once the first try is made
    handle = backend.start(spec)
    try:
        assert handle.wait(60) == 3
        assert handle.placement["node_id"] != dead.node_id and dead.node_id not in cluster.nodes
    finally:
        handle.cleanup()


def test_a_job_asking_for_what_no_node_has_is_one_clear_error(ray_runner):
    greedy = replace(RAY_JOB, name="greedy", ray_resources=(("num_gpus", 8.0),))
    with pytest.raises(SpotchaosError, match=r"no Ray worker node offers \{'CPU': 1\.0, 'GPU': 8\.0\}"):
        ray_runner.check(greedy, "sigterm@7")


OPEN_AND_CLOSE = """
import json, os, sys
from spotchaos.backends.base import LaunchSpec
from spotchaos.backends.raycluster import LocalRayCluster, RayBackend
from spotchaos.backends.raycluster.agent import EXIT_FILE
from spotchaos.processes import become_subreaper, children, descendants
become_subreaper()
shared_before = os.path.exists("/tmp/ray")
with LocalRayCluster(workers=1) as cluster:
    daemons = children(os.getpid())
    print(json.dumps({"daemons": len(daemons), "pids": [p for d in daemons for p in descendants(d)],
                      "temp": cluster.temp_dir, "nodes": len(cluster.nodes),
                      "gcs": int(cluster.gcs_address.rsplit(":", 1)[1])}), flush=True)
print(json.dumps({"shared_tmp": os.path.exists("/tmp/ray") and not shared_before}))
"""


def test_nothing_of_a_local_cluster_is_left_once_it_closes(tmp_path):
    """In a process of its own (one Ray driver per process): every process of the cluster gone once
    it closes, its folder removed, its head's port closed, nothing written to the machine's shared /tmp/ray.
    Its home holds the token an earlier local ``ray.init()`` leaves (~/.ray/auth_token), with which Ray
    2.60 turns on token authentication for ``ray start``: the cluster starts all the same, and the
    token is left as it was."""
    become_subreaper()  # what the cluster's process might orphan would come here, and be seen alive
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("f" * 64)
    env = {**os.environ, "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", OPEN_AND_CLOSE], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    opened, closed = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert opened["daemons"] == 2 and opened["nodes"] == 1 and len(opened["pids"]) > 6, opened  # head, worker, theirs
    assert not [pid for pid in opened["pids"] if is_alive(pid)], "Ray processes survived the close"
    assert not Path(opened["temp"]).exists() and not closed["shared_tmp"]
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", opened["gcs"]), timeout=5):
        pass  # the head's port is closed
    assert token.read_text() == "f" * 64


DIE_WITH_CLUSTER_OPEN = """
import json, os, signal
from spotchaos.backends.base import LaunchSpec
from spotchaos.backends.raycluster import LocalRayCluster, RayBackend
from spotchaos.backends.raycluster.agent import EXIT_FILE
from spotchaos.processes import children, descendants
cluster = LocalRayCluster(workers=1).__enter__()
pids = [p for d in children(os.getpid()) for p in descendants(d)]
print(json.dumps({"pids": pids, "temp": cluster.temp_dir}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # pytest killed with the cluster open: nothing closes it
"""


INTRUDER = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")

@ray.remote(num_cpus=0)
def plant(path):
    open(path, "w").write("ran as the session's user")

ray.get(plant.remote(sys.argv[2]), timeout=60)
print("TASK RAN")
"""


def _until_refused(process: subprocess.Popen, seconds: float) -> str:
    """What a driver said until the GCS refused it or it ended (Ray's client retries a refused GCS
    for minutes, saying so every second), then the driver ended."""
    said: list[str] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and process.poll() is None:
            ready, _, _ = select.select([process.stdout], [], [], 0.5)
            line = process.stdout.readline() if ready else ""
            said.append(line)
            if "InvalidAuthToken" in line or "Unauthenticated" in line:
                break
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        rest, _ = process.communicate()
    return "".join(said) + rest


def _a_python_that_imports_ray(user: str | None, env: dict, cwd: Path) -> str:
    """This venv's interpreter may live where ``nobody`` cannot go (pyenv under /root): then the
    system's, of the same version, with this venv's packages on its path."""
    candidates = [sys.executable, "/usr/bin/python3", f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"]
    for python in candidates:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            probe = subprocess.run(
                [python, "-c", "import ray"], user=user, env=env, cwd=str(cwd), capture_output=True, timeout=120
            )
            if probe.returncode == 0:
                return python
    raise AssertionError(f"no interpreter {user or 'this user'} can run imports this venv's Ray: {candidates}")


def test_another_local_user_cannot_run_a_task_on_the_sessions_cluster(ray_runner, tmp_path):
    """The cluster listens on a loopback every local user shares: without the session's token (a
    file of its private folder) a driver of another user is refused, and nothing of theirs runs.
    As root (CI) the driver runs as ``nobody``; otherwise as this user without the token."""
    cluster = ray_runner.ray_cluster()
    token = Path(cluster.client_environment()["RAY_AUTH_TOKEN_PATH"])
    assert token.stat().st_mode & 0o777 == 0o600 and token.parent.stat().st_mode & 0o777 == 0o700
    home = tmp_path / "nobody"
    home.mkdir()
    if os.getuid() == 0:
        os.chown(home, NOBODY, -1)
    planted = tmp_path / "planted"  # a task that ran would write it, as the cluster's user
    tmp_path.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home), "RAY_TMPDIR": str(home)}
    env.update(LOOPBACK_ENV)  # the intruder's Ray on loopback too (else it dials the machine's own address)
    import ray

    env["PYTHONPATH"] = str(Path(ray.__file__).parent.parent)  # this venv's Ray, readable by anyone
    user = "nobody" if os.getuid() == 0 else None
    python = _a_python_that_imports_ray(user, env, home)
    intruder = subprocess.Popen(
        [python, "-c", INTRUDER, cluster.gcs_address, str(planted)],
        user=user,
        env=env,
        cwd=str(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    said = _until_refused(intruder, seconds=60)
    assert "TASK RAN" not in said, said[-3000:]
    assert "InvalidAuthToken" in said or "Unauthenticated" in said, said[-3000:]  # for want of the token
    assert not planted.exists()


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


HOLD_A_CLUSTER = """
import json, sys
from spotchaos.backends.base import LaunchSpec
from spotchaos.backends.raycluster import LocalRayCluster, RayBackend
from spotchaos.backends.raycluster.agent import EXIT_FILE
with LocalRayCluster(workers=1) as cluster:
    print(json.dumps({"address": cluster.gcs_address, "nodes": sorted(cluster.nodes)}), flush=True)
    sys.stdin.read()  # until the test is done with it
    alive = sorted(n["NodeID"] for n in cluster.ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))
    print(json.dumps({"alive": alive}), flush=True)
"""
USERS_SCENARIO = """
import pytest
pytestmark = pytest.mark.spotchaos
def test_a_notice_on_the_users_cluster(spotchaos, spotchaos_job):
    spotchaos.check(spotchaos_job, "sigterm@7")
def test_a_kill_on_the_users_cluster(spotchaos, spotchaos_job):
    spotchaos.check(spotchaos_job, "sigkill@9")
"""


@pytest.mark.full  # CI: the same backend on the local cluster
def test_on_a_users_cluster_by_address_attempts_run_on_its_nodes_and_none_is_changed(tmp_path):
    """--spotchaos-ray-address: a session of its own (one Ray driver per process) on a cluster the
    test holds open in another process, as a user's would be: the plans pass on its worker node, a
    notice is SIGTERM (no drain), a kill ends the job and keeps the node, which is still there after."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_A_CLUSTER], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        opened = json.loads(holder.stdout.readline())
        project = tmp_path / "project"
        project.mkdir()
        command = ["python", str(FIXTURES / "reference_trainer.py"), "--steps", "16", "--checkpoint-every", "4"]
        (project / "pyproject.toml").write_text(
            f'[tool.spotchaos.jobs.mine]\ncommand = {json.dumps(command)}\nbackend = "ray"\ngrace_seconds = 10\n'
        )
        (project / "test_mine.py").write_text(USERS_SCENARIO)
        run = run_pytest(project, "--spotchaos", f"--spotchaos-ray-address={opened['address']}")
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
        holder.stdin.close()
        closed = json.loads(holder.stdout.readline())
    finally:  # the holder closes its cluster once its stdin closes, whatever happened here
        if not holder.stdin.closed:
            holder.stdin.close()
        try:
            holder.wait(timeout=120)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
    assert closed["alive"] == opened["nodes"]  # its one worker node: never drained away, never removed
    report = json.loads((project / "spotchaos-report" / "report.json").read_text())
    runs = [r for scenario in report["scenarios"] for r in scenario["runs"]]
    placed = [n for r in runs for n in r["nodes"]]
    assert {n["node_id"] for n in placed} == set(opened["nodes"]), placed
    faults = [n.get("fault", "") for n in placed]
    assert any("not drained (the user's cluster" in f for f in faults), (faults, [r["plan"] for r in runs])
    assert any("kept (the user's cluster" in f for f in faults), (faults, [r["plan"] for r in runs])


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


def test_the_clusters_nodes_run_with_a_quick_health_check_and_one_calmer_log_monitor(ray_runner):
    """One log monitor, the head's, which globs the session's log folder every 0.5 s, not 0.1 s (the
    worker nodes share that folder: a monitor each sent every line three times), and the head's GCS
    calls a node dead after 3 missed checks a second apart: read from the processes' own
    environments (what the kernel says they started with)."""
    cluster = ray_runner.ray_cluster()
    ours = carrying(f"{MARKER_VARIABLE}={cluster.daemons.marker}")
    monitors = [pid for pid in ours if "log_monitor.py" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(monitors) == 1, monitors  # the head's; the cluster has len(cluster.nodes) worker nodes
    assert len(cluster.nodes) == 2
    assert environment_of(monitors[0])["RAY_LOG_MONITOR_MANY_FILES_THRESHOLD"] == "0"
    (gcs,) = [pid for pid in ours if "gcs_server" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert environment_of(gcs)["RAY_health_check_failure_threshold"] == "3"


def test_a_line_a_task_prints_on_a_worker_node_reaches_the_driver_once(ray_runner):
    """What a Ray Train job's workers print reaches its driver (``log_to_driver``) once, however
    many nodes the cluster has: with a log monitor a node, Ray folded the copies into one line
    saying "[repeated 5x across cluster]"."""
    cluster = ray_runner.ray_cluster()
    script = (
        "import ray\n"
        "ray.init(log_to_driver=True)\n"
        "@ray.remote(num_cpus=1)\n"
        "def say(i):\n"
        "    print('a line from task', i, flush=True)\n"
        "print(ray.get([say.remote(i) for i in range(2)]))\n"
        "import time; time.sleep(4)\n"  # the monitor reads the workers' logs every 0.5 s; a loaded machine, later
    )
    env = driver_environment(dict(os.environ), cluster)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-2000:]
    assert output.count("a line from task 0") == 1 and output.count("a line from task 1") == 1, output[-2000:]
    assert "repeated" not in output, output[-2000:]


def environment_of(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)

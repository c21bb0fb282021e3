"""The Docker backend against a real daemon: the built-in scenarios in containers, the broken
entrypoint, bad input, and no container left behind on any exit path (Ctrl-C included).

Without a daemon these tests are skipped on a user's machine, with how to start one; in CI
(``CI`` set) they fail instead, so a broken setup never passes as "skipped".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotchaos.backends.docker import LABEL_OWNER, LABEL_SESSION, DockerSession, DockerUnavailable
from spotchaos.backends.testimage import IMAGE, SHELL_IMAGE, build
from spotchaos.config.container import ContainerSpec, Mount
from spotchaos.config.jobs import JobSpec
from spotchaos.errors import BackendError, JobError
from spotchaos.faults.checkpoint import UnsafeCheckpoint
from spotchaos.faults.plan import Plan
from spotchaos.session import Session

from .helpers import ROOT, hostile_pickle_job, run_pytest, sigint_as_from_a_terminal


@pytest.fixture(scope="module")
def docker_session():
    try:
        session = DockerSession()
    except DockerUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Docker tests: {exc}")
        pytest.skip(f"no Docker daemon: {exc}")
    build(session.client)
    yield session
    session.close()


def _ours_left(session: DockerSession, pid: int | None = None) -> list[str]:
    """Containers this pytest process (or the pytest ``pid``) started that are still there: another
    xdist worker's containers, running a test of its own at the same time, are not this test's to judge."""
    owner = f":{pid or os.getpid()}"
    return [c.name for c in session.ours() if c.labels.get(LABEL_OWNER, "").endswith(owner)]


def container_job(name: str = "dock", *args: str, image: str = IMAGE, grace: float = 10, **container) -> JobSpec:
    command = ("python", "fixtures/reference_trainer.py", "--steps", "12", "--checkpoint-every", "3", *args)
    return JobSpec(name=name, command=command, grace_seconds=grace, container=ContainerSpec(image=image, **container))


def test_builtin_scenarios_pass_in_containers_with_dataloader_workers(docker_session, tmp_path):
    """Every scenario in scenarios/, on the reference trainer with num_workers 2, each attempt a
    container stopped with docker stop (or killed): bit-exact across container restarts."""
    result = run_pytest(
        ROOT,
        "--spotchaos",
        "scenarios",
        f"--spotchaos-image={IMAGE}",
        "--spotchaos-job=reference-workers",
        "--spotchaos-examples=1",
        f"--spotchaos-output={tmp_path}",
        "--spotchaos-require-docker",
        "-k",
        # a notice, a hard kill, a damaged checkpoint, a budget: what a container changes (docker stop,
        # docker kill, its own filesystem, its clock); the rest of scenarios/ is the same in a container
        "notice_then_resume or hard_kill or damaged_newest or overhead",
    )
    failed = [line for line in result.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert result.returncode == 0, "\n".join(failed) + "\n" + result.stdout[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["scenarios"] >= 4 and report["summary"]["failed"] == 0
    (image,) = report["environment"]["containers"]
    assert image["image"] == IMAGE and image["id"].startswith("sha256:")
    assert all(job["container"]["image"] == IMAGE for job in report["jobs"])
    faults = {f["fault"] for s in report["scenarios"] for r in s["runs"] for f in r["faults"]}
    assert {"sigterm", "sigkill"} <= faults
    assert _ours_left(docker_session) == []


def test_shell_entrypoint_that_swallows_sigterm_is_caught(docker_session, tmp_path):
    runner = Session(ROOT, workdir=tmp_path)
    job = container_job("shell-pid1", "--steps", "16", "--step-seconds", "0.25", image=SHELL_IMAGE, grace=2)
    try:
        record, verdict = runner.run(job, Plan.parse("sigterm@3"))
    finally:
        runner.close()
    assert not verdict.passed
    (failure,) = [f for f in verdict.failures if "signal" in f]
    assert "the signal never reached the trainer" in failure
    assert "PID 1 in the container is the shell '/bin/sh -c" in failure and "exec" in failure
    assert record.attempts[0].exit_code == -9  # docker stop's SIGKILL at the end of the grace period
    assert _ours_left(docker_session) == []


def test_same_trainer_as_pid1_gets_the_notice(docker_session, tmp_path):
    """The control for the test above: the exec-form image delivers SIGTERM to the trainer."""
    runner = Session(ROOT, workdir=tmp_path)
    try:
        record, verdict = runner.run(container_job("pid1", "--step-seconds", "0.05", grace=5), Plan.parse("sigterm@3"))
    finally:
        runner.close()
    assert verdict.passed, verdict.message()
    assert record.attempts[0].of_kind("notice") and record.attempts[0].exit_code == 0


def test_missing_image_is_one_clear_message(docker_session, tmp_path):
    runner = Session(ROOT, workdir=tmp_path)
    with pytest.raises(BackendError, match=r"image 'spotchaos-no-such-image:1' is not present locally.*never pulls"):
        runner.reference(container_job(image="spotchaos-no-such-image:1"))
    runner.close()


def test_bad_mount_is_one_clear_message_and_starts_nothing(docker_session, tmp_path):
    runner = Session(ROOT, workdir=tmp_path)
    job = container_job(mounts=(Mount("/no/such/host/dir", "/data", True),))
    with pytest.raises(BackendError, match=r"mounts: host path /no/such/host/dir does not exist"):
        runner.reference(job)
    runner.close()
    assert _ours_left(docker_session) == []


def test_container_that_exits_at_once_is_one_clear_message(docker_session, tmp_path):
    runner = Session(ROOT, workdir=tmp_path)
    job = JobSpec(
        name="exits",
        command=("python", "-c", "import sys; print('bad config: no data dir', file=sys.stderr); sys.exit(3)"),
        container=ContainerSpec(image=IMAGE),
    )
    with pytest.raises(JobError, match=r"(?s)exited with status 3 .*bad config: no data dir"):
        runner.reference(job)
    runner.close()
    assert _ours_left(docker_session) == []


def test_containers_of_a_dead_session_are_reaped(docker_session):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    # Created, never started: what a harness killed between create and start leaves behind.
    orphan = docker_session.client.containers.create(
        IMAGE,
        command=["python", "-c", "pass"],
        labels={LABEL_SESSION: "dead-session", LABEL_OWNER: f"{socket.gethostname()}:{dead.pid}"},
        network_mode="none",
    )
    alive = docker_session.client.containers.create(
        IMAGE,
        command=["python", "-c", "pass"],
        labels={LABEL_SESSION: "live-session", LABEL_OWNER: f"{socket.gethostname()}:{os.getpid()}"},
        network_mode="none",
    )
    try:
        DockerSession()  # reaps on start (another xdist worker's new session may have been first)
        names = [c.name for c in docker_session.ours()]
        assert orphan.name not in names and alive.name in names  # only the dead owner's container goes
    finally:
        for container in (orphan, alive):
            with contextlib.suppress(Exception):
                container.remove(force=True)


def test_ctrl_c_in_the_middle_of_a_container_scenario_leaves_no_container(docker_session, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    # The project directory is what a container sees of the host (bound read-only): the trainer lives there.
    shutil.copy(ROOT / "fixtures" / "reference_trainer.py", project)
    command = ["python", "reference_trainer.py", "--steps", "400", "--step-seconds", "0.1"]
    (project / "pyproject.toml").write_text(
        f'[tool.spotchaos.jobs.slow]\ncommand = {json.dumps(command)}\nimage = "{IMAGE}"\n'
    )
    (project / "test_s.py").write_text(
        "def test_resume(spotchaos, spotchaos_job):\n    spotchaos.check(spotchaos_job, 'sigterm@300')\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--spotchaos", "-p", "no:cacheprovider"],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=sigint_as_from_a_terminal,
    )
    deadline = time.monotonic() + 90
    events = project / "spotchaos-report" / "runs"
    while not any(p.stat().st_size > 400 for p in events.glob("*/*/attempt-0/events.jsonl")):
        assert time.monotonic() < deadline and process.poll() is None, process.stdout.read().decode()
        time.sleep(0.1)
    child = f":{process.pid}"
    assert any(c.status == "running" and c.labels.get(LABEL_OWNER, "").endswith(child) for c in docker_session.ours())
    os.kill(process.pid, signal.SIGINT)
    out = process.communicate(timeout=90)[0].decode()
    assert process.returncode == pytest.ExitCode.INTERRUPTED, out
    assert _ours_left(docker_session, process.pid) == [], out


def test_without_a_daemon_container_scenarios_skip_with_how_to_start_one(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    command = ["python", str(ROOT / "fixtures/reference_trainer.py")]
    (project / "pyproject.toml").write_text(
        f'[tool.spotchaos]\noutput = "out"\n[tool.spotchaos.jobs.boxed]\ncommand = {json.dumps(command)}\n'
        f'image = "{IMAGE}"\n'
    )
    (project / "test_s.py").write_text(
        "def test_resume(spotchaos, spotchaos_job):\n    spotchaos.check(spotchaos_job, 'sigterm@3')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"

    def run(*args: str) -> subprocess.CompletedProcess:
        return run_pytest(project, "--spotchaos", "-rs", *args, timeout=120, env=env)

    skipped = run()
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout
    assert "no Docker daemon answers at unix://" in skipped.stdout and "dockerd --bridge=none" in skipped.stdout
    required = run("--spotchaos-require-docker")
    assert required.returncode == 1 and "1 failed" in required.stdout, required.stdout
    assert "DockerUnavailable: no Docker daemon answers" in required.stdout
    env["CI"] = "true"
    in_ci = run()
    assert in_ci.returncode == 1 and "1 failed" in in_ci.stdout, in_ci.stdout


def test_gpu_job_without_a_gpu_skips_or_fails_when_required(docker_session, tmp_path):
    # The session below sees no nvidia-smi (the GPU probe), so this runs the same on a GPU machine.
    path = os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if not (Path(d) / "nvidia-smi").exists()
    )
    env = {**os.environ, "PATH": path}
    project = tmp_path / "project"
    project.mkdir()
    command = ["python", str(ROOT / "fixtures/reference_trainer.py")]
    (project / "pyproject.toml").write_text(
        f'[tool.spotchaos.jobs.gpu]\ncommand = {json.dumps(command)}\nimage = "{IMAGE}"\n'
        "[tool.spotchaos.jobs.gpu.container]\ngpus = 1\n"
    )
    (project / "test_s.py").write_text(
        "def test_resume(spotchaos, spotchaos_job):\n    spotchaos.check(spotchaos_job, 'sigterm@3')\n"
    )
    skipped = run_pytest(project, "--spotchaos", "-rs", timeout=120, env=env)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout
    assert "asks for GPUs (1) and this machine has no NVIDIA GPU" in skipped.stdout
    required = run_pytest(project, "--spotchaos", "-rs", "--spotchaos-require-gpu", timeout=120, env=env)
    assert required.returncode == 1 and "GpuUnavailable" in required.stdout, required.stdout


def test_container_options_reach_the_container(docker_session, tmp_path):
    """Environment, user, shm size, memory, CPUs, network none, a read-only mount and the workdir."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "hello.txt").write_text("from the host")
    probe = (
        "import json, os, shutil, socket;"
        "print(json.dumps({'uid': os.getuid(), 'env': os.environ.get('ONLY_IN_CONTAINER'),"
        " 'shm': shutil.disk_usage('/dev/shm').total, 'data': open('/data/hello.txt').read(),"
        " 'cwd': os.getcwd(), 'ifaces': sorted(n for _, n in socket.if_nameindex()),"
        " 'mem': open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read().strip()"
        " if os.path.exists('/sys/fs/cgroup/memory/memory.limit_in_bytes')"
        " else open('/sys/fs/cgroup/memory.max').read().strip()}))"
    )
    from spotchaos.backends import LaunchSpec
    from spotchaos.backends.docker import DockerBackend

    spec = ContainerSpec(
        image=IMAGE,
        env=(("ONLY_IN_CONTAINER", "yes"),),
        user="65534:65534",
        shm_size="256m",
        memory="1g",
        cpus=1,
        network="none",
        working_dir="/tmp",
        mounts=(Mount(str(data), "/data", True),),
    )
    launch = LaunchSpec(
        argv=("python", "-c", probe),
        env={},
        cwd=ROOT,
        stdout_path=tmp_path / "out.log",
        stderr_path=tmp_path / "err.log",
        writable=(tmp_path,),
    )
    handle = DockerBackend(docker_session, spec).start(launch)
    try:
        assert handle.wait(60) == 0, (tmp_path / "err.log").read_text()
    finally:
        handle.cleanup()
    seen = json.loads(Path(tmp_path / "out.log").read_text())
    assert seen["uid"] == 65534 and seen["env"] == "yes" and seen["data"] == "from the host"
    assert seen["shm"] == 256 * 2**20 and seen["cwd"] == "/tmp" and seen["ifaces"] == ["lo"]
    assert seen["mem"] == str(2**30)
    assert _ours_left(docker_session) == []


def test_a_container_cannot_make_the_harness_damage_a_host_file_it_cannot_see(docker_session, tmp_path):
    """Inside its container the job links its checkpoint file to a host path it cannot see (the
    link dangles there); the harness, which damages checkpoints on the host, must not follow it."""
    victim = tmp_path / "host-only" / "model.pt"  # not mounted in the container
    victim.parent.mkdir()
    victim.write_bytes(b"precious host data\n" * 64)
    before = victim.read_bytes()
    command = ("python", "fixtures/hostile_links.py", "--victim", str(victim), "--link", "model")
    job = JobSpec(name="hostile-box", command=command, grace_seconds=5, container=ContainerSpec(image=IMAGE))
    runner = Session(ROOT, workdir=tmp_path / "runs")
    try:
        with pytest.raises(UnsafeCheckpoint, match=r"model.pt, a symbolic link .* refuses this checkpoint"):
            runner.check(job, Plan.parse("sigkill@3:truncate-zero"))
    finally:
        runner.close()
    assert victim.read_bytes() == before
    assert _ours_left(docker_session) == []


def test_a_pickle_that_needs_a_full_unpickle_is_read_inside_the_jobs_container(docker_session, tmp_path):
    """The script's checkpoint runs code when unpickled (it appends the loading process's pid to a
    marker in the run's own directory): the harness reads it in a container of the job's image,
    so every pid there is a container's (never pytest's), and the marker is reachable only there."""
    job = hostile_pickle_job("pickle-box", "{checkpoint_dir}/marker", steps=5, container=ContainerSpec(image=IMAGE))
    runner = Session(ROOT, workdir=tmp_path / "runs", keep_passing=True)
    try:
        runner.check(job, Plan.parse("sigkill@1"))
    finally:
        runner.close()
    markers = list((tmp_path / "runs").rglob("marker"))
    loaders = [pid for marker in markers for pid in marker.read_text().split()]
    assert len(loaders) >= 2, "the checkpoint was never read in full: the test proves nothing"
    assert str(os.getpid()) not in loaders
    assert _ours_left(docker_session) == []


def test_a_service_in_a_container_drains_and_its_replacement_gets_the_types_memory(docker_session, runner):
    """The service scenarios on Docker: the notice from GCP's metadata served on 127.0.0.1 (host
    network), the replacement in a container limited to the fallback type's memory by the kernel."""
    from dataclasses import replace

    from spotchaos.config.jobs import load_settings
    from spotchaos.families.serving import DrainFailure

    spec = load_settings(ROOT / "pyproject.toml").service("model-fallback")
    spec = replace(spec, container=ContainerSpec(image=IMAGE), channel="gcp")
    figures = runner.check_drain(spec)
    assert figures["backend"] == "docker" and figures["failed"] == 0 and not figures["killed"], figures
    assert "preempted" in figures["channel_note"] and "after it was posted" in figures["channel_note"], figures
    assert figures["replacement"]["instance_type"] == "g4dn.xlarge-spot" and figures["replacement"]["ttfr_seconds"]
    too_big = replace(spec, command=("python", "fixtures/broken_serve_too_big.py", "--port", "{port}"))
    with pytest.raises(DrainFailure) as failure:
        runner.check_drain(too_big)
    text = str(failure.value)
    assert "the replacement never served: service 'model-fallback' on g4dn.xlarge-spot, memory 1g" in text, text
    assert "killed it for memory (over the 1g of g4dn.xlarge-spot)" in text, text
    assert _ours_left(docker_session) == []


@pytest.mark.parametrize("name", ["model-stream", "model-aws"])
def test_the_built_in_services_pass_in_containers(docker_session, runner, name):
    """Built-in service scenarios on Docker too (model-fallback: the test above), as
    ``--spotchaos-image`` runs them: a streaming service and AWS's metadata notice here; the main
    job drains every declared service (``pytest --spotchaos scenarios`` with the built-in scenarios),
    and the rest differ from these in what they serve, not in how a container runs them."""
    from spotchaos.config.jobs import load_settings

    spec = load_settings(ROOT / "pyproject.toml").service(name).in_image(IMAGE)
    figures = runner.check_drain(spec)
    assert figures["backend"] == "docker" and figures["failed"] == 0 and not figures["killed"], figures
    assert _ours_left(docker_session) == []

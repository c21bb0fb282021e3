"""GPU leases: distinct devices for concurrent attempts, across processes, freed by a dead holder.

The lease logic does not look at the devices themselves, so these run on CPU machines with a
declared device list; ``scripts/gpu-check`` runs the end-to-end lease test on a real GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from spotchaos.config.jobs import JobSpec
from spotchaos.errors import ConfigError, SpotchaosError
from spotchaos.host.gpu_leases import GpuPool, GpuUnavailable, NoGpuFree, parse_devices
from spotchaos.session import Session

from .helpers import FIXTURES, ROOT, run_pytest

HOLD = """
import json, os, sys, time
from pathlib import Path
from spotchaos.gpu_leases import GpuPool
pool = GpuPool(["0", "1"], Path(sys.argv[1]))
lease = pool.lease(int(sys.argv[2]), {"job": "other", "attempt": 3}, timeout=5)
print(json.dumps(lease.devices), flush=True)
time.sleep(60)
"""


def holder(tmp_path, count: int) -> tuple[subprocess.Popen, list[str]]:
    """Another process (another pytest worker, say) holding ``count`` devices until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), str(count)], stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


@pytest.mark.unit
def test_concurrent_leases_get_distinct_devices_and_a_released_one_is_free_again(tmp_path):
    pool = GpuPool(["0", "1", "2"], tmp_path)
    first = pool.lease(2, {"job": "a", "attempt": 0}, timeout=1)
    second = pool.lease(1, {"job": "b", "attempt": 0}, timeout=1)
    assert sorted(first.devices + second.devices) == ["0", "1", "2"]
    with pytest.raises(NoGpuFree, match=r"no 1 GPU\(s\) free for 0.2 s .*held by pid \d+ \(job 'a', attempt 0\)"):
        pool.lease(1, {"job": "c", "attempt": 0}, timeout=0.2)
    first.release()
    first.release()  # idempotent
    with pool.lease(2, {"job": "c", "attempt": 1}, timeout=1) as third:
        assert sorted(third.devices) == sorted(d for d in ("0", "1", "2") if d not in second.devices)
    assert third.released_wall is not None and third.describe()["devices"] == list(third.devices)


def test_a_device_held_by_another_process_is_never_handed_out_and_a_killed_holder_frees_it(tmp_path):
    proc, taken = holder(tmp_path, 1)
    try:
        pool = GpuPool(["0", "1"], tmp_path)
        with pool.lease(1, {"job": "mine", "attempt": 0}, timeout=1) as lease:
            assert lease.devices != tuple(taken)
        with pytest.raises(NoGpuFree, match=rf"GPU {taken[0]} held by pid {proc.pid} \(job 'other', attempt 3\)"):
            pool.lease(2, {"job": "mine", "attempt": 1}, timeout=0.3)
        os.kill(proc.pid, signal.SIGKILL)  # a SIGKILLed pytest: nothing released it by hand
        proc.wait()
        with pool.lease(2, {"job": "mine", "attempt": 2}, timeout=1) as both:
            assert sorted(both.devices) == ["0", "1"]
    finally:
        proc.kill()
        proc.wait()


def test_waiting_attempts_get_the_devices_as_they_free_up_and_never_share_one(tmp_path):
    """Six processes, two devices, each holding one for a moment: every lease waited its turn."""
    witness = tmp_path / "witness"
    witness.mkdir()
    code = textwrap.dedent(
        f"""
        import fcntl, os, sys, time
        from pathlib import Path
        from spotchaos.gpu_leases import GpuPool
        pool = GpuPool(["0", "1"], Path({str(tmp_path / "leases")!r}))
        with pool.lease(1, {{"job": sys.argv[1], "attempt": 0}}, timeout=30) as lease:
            fd = os.open(os.path.join({str(witness)!r}, lease.devices[0]), os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by another lease holder: shared
            except BlockingIOError:
                print("SHARED", lease.devices[0], flush=True)
            time.sleep(0.3)
            print("held", lease.devices[0], round(lease.waited_seconds, 2), flush=True)
            os.close(fd)  # the witness goes before the lease does
        """
    )
    argv = [sys.executable, "-c", code]
    procs = [subprocess.Popen([*argv, str(i)], stdout=subprocess.PIPE, text=True) for i in range(6)]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    lines = [line.split() for out in outputs for line in out.splitlines()]
    assert not [line for line in lines if line[0] == "SHARED"], outputs
    assert len(lines) == 6 and {line[1] for line in lines} <= {"0", "1"}, outputs
    assert max(float(line[2]) for line in lines) >= 0.25, outputs  # some waited for a device to free up


@pytest.mark.unit
def test_asking_for_more_gpus_than_exist_is_one_clear_error_at_once(tmp_path):
    pool = GpuPool(["0", "1"], tmp_path)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"asks for 3 GPU\(s\) and this machine has 2 \(0, 1\), from \[tool"):
        pool.lease(3, {"job": "big", "attempt": 0}, timeout=30)
    assert time.monotonic() - started < 1


@pytest.mark.unit
def test_a_declared_device_list_is_checked_and_the_variable_wins(tmp_path, monkeypatch):
    assert parse_devices(["0", 1, "GPU-5e1f2c3d"], "gpus") == ("0", "1", "GPU-5e1f2c3d")
    assert parse_devices("0, 1", "SPOTCHAOS_GPUS") == ("0", "1")
    for bad, message in ((["0", "0"], "listed twice"), (["../x"], "is not a GPU id"), (3, "must be a list")):
        with pytest.raises(ConfigError, match=message):
            parse_devices(bad, "gpus")
    monkeypatch.setenv("SPOTCHAOS_GPUS", "4,5")
    pool = GpuPool(["0"], tmp_path)
    assert pool.devices == ("4", "5") and pool.source == "SPOTCHAOS_GPUS"
    with pytest.raises(ConfigError, match="gpus: must be a count of GPUs from 1 to 64"):
        JobSpec(name="j", command=("python", "t.py"), gpus=0)


@pytest.mark.unit
def test_a_link_planted_where_a_lock_file_goes_is_refused_and_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    leases = tmp_path / "leases"
    leases.mkdir(mode=0o700)
    (leases / "0.lock").symlink_to(victim)
    with pytest.raises(SpotchaosError, match=r"cannot lease GPU 0: .*0.lock: .*never through a link"):
        GpuPool(["0"], leases).lease(1, {"job": "j", "attempt": 0}, timeout=1)
    assert victim.read_text() == "keep"


def test_a_lease_is_not_inherited_by_the_job_it_was_taken_for(tmp_path):
    """The lock's descriptor is close-on-exec: a job still running after its attempt's lease was
    released (an orphan on its way out) holds no device."""
    pool = GpuPool(["0"], tmp_path)
    with pool.lease(1, {"job": "j", "attempt": 0}, timeout=1):
        job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pool.lease(1, {"job": "j", "attempt": 1}, timeout=0.5) as again:
            assert again.devices == ("0",)
    finally:
        job.kill()
        job.wait()


@pytest.mark.full  # CI: concurrent and waiting leases across processes
def test_with_two_declared_gpus_and_two_workers_no_two_running_attempts_share_a_device(tmp_path):
    """The whole gate under ``pytest -n 2`` on a job with ``gpus = 1`` and two declared GPUs: every
    attempt (the references and every plan's) saw exactly one device as CUDA_VISIBLE_DEVICES, none
    saw a device another running attempt held (its own witness lock says), attempts did run side
    by side, and the report says where each attempt ran."""
    witness = tmp_path / "witness"
    witness.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    # on the CPU: the declared devices need not exist (a one-GPU machine has no "1": an attempt handed it
    # would train on the CPU beside a reference trained on the GPU, and differ); the leases are the point
    command = ["python", str(FIXTURES / "gpu_witness_trainer.py"), "--steps", "12", "--checkpoint-every", "3"]
    command += ["--device", "cpu"]
    (project / "pyproject.toml").write_text(
        f"""
[tool.spotchaos]
gpus = ["0", "1"]
[tool.spotchaos.jobs.leased]
command = {json.dumps(command)}
gpus = 1
grace_seconds = 10
env = {{ GPU_WITNESS_DIR = {json.dumps(str(witness))}, GPU_WITNESS_ALL = "0,1" }}
"""
    )
    env = {**os.environ, "SPOTCHAOS_LEASE_DIR": str(tmp_path / "leases")}
    env.pop("SPOTCHAOS_GPUS", None)
    modules = ["spotchaos.scenarios.test_preemption"]
    run = run_pytest(project, "-n", "2", "--spotchaos", "--spotchaos-examples=1", "--pyargs", *modules, env=env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    attempts = [json.loads(line) for line in (witness / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) >= 8, attempts
    assert all(len(a["devices"]) == 1 and a["devices"][0] in ("0", "1") for a in attempts), attempts
    assert not [a for a in attempts if a["shared"]], attempts  # no device was held by two at once
    assert any(a["others_busy"] for a in attempts), attempts  # and two did run side by side
    report = json.loads((project / "spotchaos-report" / "report.json").read_text())
    leases = [g for s in report["scenarios"] for r in s["runs"] for g in r.get("gpus", [])]
    assert leases and all(len(g["devices"]) == 1 and g["released"] >= g["acquired"] for g in leases), leases


def test_a_job_that_needs_gpus_on_a_machine_without_any_is_named_before_anything_starts(tmp_path, monkeypatch):
    """No device at all: GpuUnavailable (a scenario skips, saying so, unless --spotchaos-require-gpu);
    more than there are: one ConfigError. Neither starts the job."""
    marker = tmp_path / "started"
    job = JobSpec(name="needs-gpus", command=("python", "-c", f"open({str(marker)!r}, 'w')"), gpus=2)
    monkeypatch.setenv("SPOTCHAOS_GPUS", "")
    none = pytest.raises(GpuUnavailable, match=r"gpus: the job asks for GPUs \(2\) and this machine has none")
    with Session(ROOT, workdir=tmp_path / "none") as runner, none:
        runner.reference(job)
    monkeypatch.setenv("SPOTCHAOS_GPUS", "0")
    fewer = pytest.raises(ConfigError, match=r"asks for 2 GPU\(s\) and this machine has 1 \(0\), from SPOTCHAOS_GPUS")
    with Session(ROOT, workdir=tmp_path / "one") as runner, fewer:
        runner.reference(job)
    assert not marker.exists()

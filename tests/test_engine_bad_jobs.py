"""A job that never starts, hangs, crashes, writes garbage or never finishes: one clear
message each, and no process of its group survives."""

from __future__ import annotations

import sys

import pytest

from spotchaos.config.jobs import JobSpec
from spotchaos.errors import JobError
from spotchaos.faults.plan import Plan
from spotchaos.training.engine.run import EngineOptions, run_job

from .helpers import ROOT, is_alive, read_pids

PRELUDE = """
import os, subprocess, sys, time
from spotchaos.probe import Probe
here = os.path.dirname(os.path.abspath(__file__))
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join(here, "pids"), "w") as f:
    f.write(f"{os.getpid()} {helper.pid}")
probe = Probe.from_env()
"""


def run(tmp_path, command, **timeouts):
    job = JobSpec(name="bad", command=command, **timeouts)
    return run_job(job, Plan(), tmp_path / "run", EngineOptions(root=ROOT))


def assert_group_gone(tmp_path):
    pids = read_pids(tmp_path / "pids")
    assert pids and not any(is_alive(pid) for pid in pids), "a process of the job survived"


@pytest.mark.parametrize(
    ("body", "timeouts", "message"),
    [
        ("time.sleep(60)", {"start_timeout_seconds": 1.5}, r"job 'bad' never started: no event within 1.5 s"),
        (
            "probe.start(); probe.step(0, 1.0); time.sleep(60)",
            {"event_timeout_seconds": 1.5},
            r"job 'bad' hangs: no event for 1.5 s after step 0",
        ),
        (
            "probe.start(); probe.step(0, 1.0); raise SystemExit('disk on fire')",
            {},
            r"exited with status 1 in attempt 0 after step 0, without any preemption due(.|\n)*disk on fire",
        ),
        (
            "probe.start(); probe.emit('step', step=0, loss=0.5)",
            {},
            r"line 2: 'step' event needs field 'loss' of type str",
        ),
        (
            "probe.start(); open(os.environ['SPOTCHAOS_EVENTS'], 'a').write('step 1 loss 0.3\\n'); time.sleep(60)",
            {},
            r"line 2: not a JSON event: 'step 1 loss 0.3'",
        ),
        (
            "probe.start(); probe.step(0, 1.0)",
            {},
            r"exited 0 in attempt 0 after step 0 without a 'final' event",
        ),
        (
            "probe.start(); os.write(os.open(os.environ['SPOTCHAOS_EVENTS'], os.O_WRONLY | os.O_APPEND),"
            ' b\'{"event": "st\')',
            {},
            r"left an unfinished event line",
        ),
    ],
    ids=["never-starts", "hangs", "crashes", "bad-field", "garbage", "no-final", "torn-line"],
)
def test_bad_job_gives_one_clear_message_and_leaves_nothing_running(tmp_path, script, body, timeouts, message):
    with pytest.raises(JobError, match=message):
        run(tmp_path, script(PRELUDE + body), **timeouts)
    assert_group_gone(tmp_path)


def test_a_job_that_never_started_names_a_torch_extension_build_lock_it_may_wait_on(tmp_path):
    """torch's C++ extension build (DeepSpeed's CPU op) killed midway leaves a ``lock`` that every
    later start waits on forever, before its first event: a job that never started says so."""
    extensions = tmp_path / "extensions"
    (extensions / "py311_cpu" / "deepspeed_shm_comm").mkdir(parents=True)
    job = JobSpec(name="bad", command=(sys.executable, "-c", "import time; time.sleep(60)"), start_timeout_seconds=1.5,
                  env=(("TORCH_EXTENSIONS_DIR", str(extensions)),))  # fmt: skip
    with pytest.raises(JobError) as error:
        run_job(job, Plan(), tmp_path / "run", EngineOptions(root=ROOT))
    assert "build lock" not in str(error.value)  # none there: nothing said
    (extensions / "py311_cpu" / "deepspeed_shm_comm" / "lock").touch()
    with pytest.raises(JobError, match=r"never started: no event within 1\.5 s") as error:
        run_job(job, Plan(), tmp_path / "run2", EngineOptions(root=ROOT))
    lock = extensions / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    assert f"A torch extension build lock is there: {lock} (0 min old)" in str(error.value), str(error.value)
    assert lock.exists()  # named, never removed: the harness cannot tell it from a build that runs


def test_missing_working_directory_is_named(tmp_path):
    job = JobSpec(name="bad", command=("python", "x.py"), cwd="does/not/exist")
    with pytest.raises(JobError, match=r"JobSpec\(name='bad'\).cwd: directory .*does/not/exist does not exist"):
        run_job(job, Plan(), tmp_path / "run", EngineOptions(root=ROOT))


def test_harness_checkpoint_location_is_a_fresh_directory_of_its_own(tmp_path, script):
    body = """
probe.start()
uri = os.environ["SPOTCHAOS_CHECKPOINT_URI"]
probe.emit("saw", uri=uri, entries=os.listdir(uri[len("file://"):]))
probe.step(0, 1.0)
probe.final({}, step=0)
"""
    record = run(tmp_path, script(PRELUDE + body))
    (saw,) = record.attempts[0].of_kind("saw")
    assert saw["uri"] == (tmp_path / "run" / "checkpoints").resolve().as_uri()
    assert saw["entries"] == []


def test_the_start_up_lasts_until_the_first_step_not_the_start_event(tmp_path, script):
    """An integration says "start" when its callback is made, before the model and data are built
    and a checkpoint is restored: all of that is start-up, not training."""
    body = """
probe.start()
time.sleep(1.0)  # building the model, reading a checkpoint
probe.step(0, 1.0)
probe.final({}, step=0)
"""
    record = run(tmp_path, script(PRELUDE + body))
    (attempt,) = record.attempts
    assert attempt.start_seconds is not None and attempt.start_seconds >= 1.0, attempt.start_seconds

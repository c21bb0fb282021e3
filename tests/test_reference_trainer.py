"""The bundled reference trainer, preempted for real: it must resume bit-exact every way."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import crc32c
import pytest

from spotchaos.faults.plan import Plan
from spotchaos.training.engine.options import CRASHPOINT_DIR
from spotchaos.training.events import EventReader

from .helpers import REFERENCE_TRAINER, trainer_job

WORKERS0 = trainer_job(name="ref0")
WORKERS2 = trainer_job("reference_trainer", "--num-workers", "2", name="ref2")
PACED = trainer_job(
    "reference_trainer", "--step-seconds", "0.1", name="ref0-paced"
)  # the metadata is polled every 0.2 s


def test_worker_processes_do_not_change_the_trajectory(runner):
    """num_workers 2 gives the same batches, losses and weights as num_workers 0."""
    a, b = runner.reference(WORKERS0), runner.reference(WORKERS2)
    assert [(s.step, s.loss, s.fingerprints) for s in a.steps] == [(s.step, s.loss, s.fingerprints) for s in b.steps]
    assert a.final["digests"] == b.final["digests"]
    assert len(a.steps) == 16


FULL = pytest.mark.full  # the full run's (pytest --spotchaos without -m): docs/ci.md


@pytest.mark.parametrize(
    ("job", "plan"),
    [
        pytest.param(WORKERS0, "sigterm@3", marks=FULL),  # CI: the same faults with loader workers
        (WORKERS2, "sigterm@6"),
        (WORKERS2, "sigterm-group@5"),
        pytest.param(WORKERS0, "sigkill@6", marks=FULL),
        (WORKERS2, "sigkill@9"),
        (WORKERS2, "sigterm-group@2,sigkill@7,sigterm@12"),
        (PACED, "aws-notice@2,gcp-notice@6,azure-notice@9,alibaba-notice@12"),
    ],
)
def test_preempt_and_resume_is_bit_exact(runner, job, plan):
    verdict = runner.check(job, Plan.parse(plan))
    assert verdict.passed and not verdict.missing_steps
    for grace in verdict.grace:
        assert grace.ok and grace.checkpoint_step is not None and grace.checkpoint_step >= grace.signal_step
    if "sigkill" in plan:
        assert verdict.lost_steps > 0  # a hard kill replays from the last periodic checkpoint
    if "-notice" in plan:  # read from the instance metadata, no signal: the trainer says so with signal 0
        assert len(verdict.grace) == 4 and verdict.lost_steps == 0


def run_trainer(tmp_path, events_name, *args, env=None):
    """Run the reference trainer on tmp_path/ckpt; its stderr is kept beside the events."""
    env = {**os.environ, **(env or {}), "SPOTCHAOS_EVENTS": str(tmp_path / events_name)}
    command = [sys.executable, str(REFERENCE_TRAINER), "--checkpoint-dir", str(tmp_path / "ckpt"), *args]
    with open(tmp_path / f"{events_name}.stderr", "wb") as stderr:
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=stderr, timeout=120)
    return EventReader(tmp_path / events_name).read_new()


def test_checkpoints_are_atomic_verified_rotated_and_pointed_at(tmp_path):
    events = run_trainer(tmp_path, "a.jsonl", "--steps", "21", "--checkpoint-every", "4", "--keep", "2")
    root = tmp_path / "ckpt"
    names = sorted(p.name for p in root.iterdir())
    assert names == ["ckpt-00000016", "ckpt-00000020", "latest"]  # keep 2; no temporary left over
    assert (root / "latest").read_text().strip() == "ckpt-00000020"
    manifest = json.loads((root / "ckpt-00000020" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.pt", "optimizer.pt", "trainer.pt"}
    for name, entry in manifest["files"].items():
        data = (root / "ckpt-00000020" / name).read_bytes()
        assert f"{crc32c.crc32c(data):08x}" == entry["crc32c"] and len(data) == entry["bytes"]
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    assert [e["step"] for e in checkpoints] == [3, 7, 11, 15, 19]
    assert all(e["reason"] == "periodic" and e["bytes"] > 0 for e in checkpoints)


def test_damaged_newest_checkpoint_rolls_back_to_the_previous_one(tmp_path):
    """Flip one bit in the newest checkpoint: the next start skips it, says so, and ends the same."""
    (tmp_path / "clean").mkdir()
    clean = run_trainer(tmp_path / "clean", "clean.jsonl", "--steps", "12")
    first = run_trainer(tmp_path, "first.jsonl", "--steps", "10")  # checkpoints after steps 3 and 7
    newest = tmp_path / "ckpt" / "ckpt-00000008" / "model.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x10
    newest.write_bytes(bytes(data))
    second = run_trainer(tmp_path, "second.jsonl", "--steps", "12")
    kinds = [e["event"] for e in second]
    assert kinds[:3] == ["start", "rollback", "resume"]
    assert "crc32c does not match" in second[1]["reason"] and second[1]["skipped_uri"].endswith("ckpt-00000008")
    assert second[2]["from_step"] == 3
    steps = [e["step"] for e in second if e["event"] == "step"]
    assert steps == list(range(4, 12))
    clean_losses = {e["step"]: e["loss"] for e in clean if e["event"] == "step"}
    assert all(e["loss"] == clean_losses[e["step"]] for e in second if e["event"] == "step")
    assert second[-1]["digests"] == clean[-1]["digests"]
    assert first[-1]["event"] == "final"


def test_a_crash_while_a_rotated_checkpoint_is_unlinked_in_the_background_is_cleaned_up(tmp_path):
    """Rotation renames the old checkpoint to .old-* and unlinks it in a helper thread: a SIGKILL
    there leaves it behind, and the next start removes it, says so, and resumes from the newest."""
    root = tmp_path / "ckpt"
    crash_env = {
        "PYTHONPATH": os.pathsep.join([str(CRASHPOINT_DIR), os.environ.get("PYTHONPATH", "")]),
        "SPOTCHAOS_CRASH_ROOT": str(root),
        "SPOTCHAOS_CRASH_LOG": str(tmp_path / "fs.jsonl"),
    }
    args = ("--steps", "9", "--checkpoint-every", "3", "--keep", "1")
    run_trainer(tmp_path, "log.jsonl", *args, env=crash_env)
    logged = [json.loads(line) for line in (tmp_path / "fs.jsonl").read_text().splitlines()]
    (unlink,) = [e for e in logged if e["event"] == "shutil.rmtree" and "/.old-ckpt-00000003-" in e["path"]]
    shutil.rmtree(root)

    with pytest.raises(subprocess.CalledProcessError) as killed:
        run_trainer(tmp_path, "crash.jsonl", *args, env={**crash_env, "SPOTCHAOS_CRASH_AT": str(unlink["index"])})
    assert killed.value.returncode == -signal.SIGKILL
    left = sorted(p.name for p in root.iterdir())
    assert left[0].startswith(".old-ckpt-00000003-") and left[1:] == ["ckpt-00000006", "latest"], left

    restart = run_trainer(tmp_path, "restart.jsonl", *args)
    assert [e["from_step"] for e in restart if e["event"] == "resume"] == [5]
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-00000006", "latest"]
    assert "a checkpoint on its way out" in (tmp_path / "restart.jsonl.stderr").read_text()

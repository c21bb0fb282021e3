"""The bundled reference trainer, preempted for real: it must resume bit-exact every way."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import crc32c
import pytest

from spotchaos.events import EventReader
from spotchaos.plan import Plan

from .helpers import REFERENCE_TRAINER, trainer_job

WORKERS0 = trainer_job(name="ref0")
WORKERS2 = trainer_job("reference_trainer", "--num-workers", "2", name="ref2")


def test_worker_processes_do_not_change_the_trajectory(runner):
    """num_workers 2 gives the same batches, losses and weights as num_workers 0."""
    a, b = runner.reference(WORKERS0), runner.reference(WORKERS2)
    assert [(s.step, s.loss, s.fingerprints) for s in a.steps] == [(s.step, s.loss, s.fingerprints) for s in b.steps]
    assert a.final["digests"] == b.final["digests"]
    assert len(a.steps) == 16


@pytest.mark.parametrize(
    ("job", "plan"),
    [
        (WORKERS0, "sigterm@3"),
        (WORKERS2, "sigterm@6"),
        (WORKERS2, "sigterm-group@5"),
        (WORKERS0, "sigkill@6"),
        (WORKERS2, "sigkill@9"),
        (WORKERS2, "sigterm-group@2,sigkill@7,sigterm@12"),
    ],
)
def test_preempt_and_resume_is_bit_exact(runner, job, plan):
    verdict = runner.check(job, Plan.parse(plan))
    assert verdict.passed and not verdict.missing_steps
    for grace in verdict.grace:
        assert grace.ok and grace.checkpoint_step is not None and grace.checkpoint_step >= grace.signal_step
    if "sigkill" in plan:
        assert verdict.lost_steps > 0  # a hard kill replays from the last periodic checkpoint


def run_trainer(tmp_path, events_name, *args):
    env = {**os.environ, "SPOTCHAOS_EVENTS": str(tmp_path / events_name)}
    command = [sys.executable, str(REFERENCE_TRAINER), "--checkpoint-dir", str(tmp_path / "ckpt"), *args]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
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

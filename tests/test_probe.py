"""The trainer-side probe: bits survive, lines are whole, and it stays import-light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from spotchaos import probe
from spotchaos.training.events import EventReader


def test_loss_hex_round_trips_every_bit():
    value = torch.tensor(0.1, dtype=torch.float32)
    text = probe.loss_to_hex(value)
    assert float.fromhex(text) == value.item()
    assert probe.loss_to_hex(1 / 3) == (1 / 3).hex()


def test_tensor_digest_sees_dtype_shape_and_one_flipped_bit():
    t = torch.arange(6, dtype=torch.float32)
    base = probe.tensor_digest(t)
    assert base == probe.tensor_digest(t.clone())
    assert base != probe.tensor_digest(t.double())
    assert base != probe.tensor_digest(t.reshape(2, 3))
    flipped = t.clone()
    flipped.view(torch.int32)[3] ^= 1
    assert base != probe.tensor_digest(flipped)


def test_tensor_digest_handles_bfloat16_and_empty_tensors():
    assert len(probe.tensor_digest(torch.ones(3, dtype=torch.bfloat16))) == 64
    assert probe.tensor_digest(torch.empty(0)) != probe.tensor_digest(torch.empty(0, 2))


def test_probe_writes_events_the_reader_accepts(tmp_path):
    path = tmp_path / "events.jsonl"
    p = probe.Probe(str(path), run_id="r1", attempt=2)
    p.start(trainer="t")
    p.step(0, 1.5, seconds=0.01, fingerprints={"lr": 0.1, "batch": [1, 2, 3]})
    p.checkpoint(0, seconds=0.2, nbytes=100, uri="file:///x")
    p.resume(0, "file:///x")
    p.rollback("file:///y", "sha256 mismatch")
    p.final({"w": torch.ones(2)}, step=0)
    p.close()
    events = EventReader(path).read_new()
    assert [e["event"] for e in events] == ["start", "step", "checkpoint", "resume", "rollback", "final"]
    step = events[1]
    assert step["loss"] == (1.5).hex() and step["fp"]["lr"] == (0.1).hex()
    assert step["fp"]["batch"] == probe.fingerprint([1, 2, 3])
    assert events[0]["run_id"] == "r1" and events[0]["schema"] == probe.EVENT_SCHEMA_VERSION
    assert events[-1]["digests"]["w"] == probe.tensor_digest(torch.ones(2))


def test_probe_without_events_file_is_a_no_op(monkeypatch, tmp_path):
    monkeypatch.delenv(probe.ENV_EVENTS, raising=False)
    p = probe.Probe.from_env()
    assert not p.enabled
    p.step(0, 1.0)  # must not raise
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_dir_from_env_reads_file_uris(monkeypatch):
    monkeypatch.setenv(probe.ENV_CHECKPOINT_URI, "file:///tmp/a%20b")
    assert probe.checkpoint_dir_from_env() == "/tmp/a b"
    monkeypatch.setenv(probe.ENV_CHECKPOINT_URI, "s3://bucket/prefix")
    assert probe.checkpoint_dir_from_env("fallback") == "fallback"


def test_probe_imports_nothing_else_of_spotchaos_nor_heavy_libraries():
    code = (
        "import sys, spotchaos.probe;"
        "mods = [m for m in sys.modules if m.startswith('spotchaos.') or m in "
        "('torch','pytest','hypothesis','docker','boto3','numpy')];"
        "print(','.join(sorted(mods)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "spotchaos.probe"


@pytest.mark.parametrize("count", [200])
def test_concurrent_writers_never_interleave_lines(tmp_path, count):
    """Two processes appending at once (a trainer and its helper) still give whole lines."""
    path = tmp_path / "events.jsonl"
    code = (
        "import sys; from spotchaos.probe import Probe; p = Probe(sys.argv[1]);"
        f"[p.step(i, float(i), fingerprints={{'pad': 'x' * 3000}}) for i in range({count})]"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)]) for _ in range(2)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    lines = path.read_text().splitlines()
    assert len(lines) == 2 * count
    assert all(json.loads(line)["event"] == "step" for line in lines)

"""Reading events: incremental, whole lines only, and a clear message for garbage."""

from __future__ import annotations

import pytest

from spotchaos.errors import JobError
from spotchaos.training.events import EventReader, validate_event

pytestmark = pytest.mark.unit  # starts no process: part of the fast loop (pytest -m unit)


def test_reader_returns_only_completed_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    reader = EventReader(path)
    assert reader.read_new() == []  # no file yet
    path.write_text('{"event":"start"}\n{"event":"step","step":0,')
    assert [e["event"] for e in reader.read_new()] == ["start"]
    assert reader.torn_tail.startswith(b'{"event":"step"')
    with open(path, "a") as f:
        f.write('"loss":"0x1.0p+0"}\n')
    (step,) = reader.read_new()
    assert step["step"] == 0 and reader.torn_tail == b""
    assert len(reader.events) == 2


def test_non_json_line_names_file_line_and_content(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"event":"start"}\nloss=0.5 at step 3\n')
    with pytest.raises(JobError, match=r"events.jsonl line 2: not a JSON event: 'loss=0.5 at step 3'"):
        EventReader(path).read_new()


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ([1, 2], "JSON object with a string field 'event'"),
        ({"event": "step", "loss": "0x1p+0"}, "needs field 'step' of type int"),
        ({"event": "step", "step": True, "loss": "0x1p+0"}, "needs field 'step' of type int"),
        ({"event": "step", "step": 1, "loss": 0.5}, "needs field 'loss' of type str"),
        ({"event": "step", "step": 1, "loss": "0.5x"}, "not a float.hex string"),
        ({"event": "final", "step": 1}, "needs field 'digests' of type dict"),
        ({"event": "checkpoint", "step": 1, "seconds": "1", "bytes": 1, "uri": "u"}, "'seconds' of type int or float"),
        ({"event": "step", "step": 1, "loss": "0x1p+0", "rank": [0, 1]}, r"'rank' must be an integer, got \[0, 1\]"),
        ({"event": "step", "step": 1, "loss": "0x1p+0", "rank": {"r": 0}}, "'rank' must be an integer"),
        ({"event": "step", "step": 1, "loss": "0x1p+0", "rank": -1}, "'rank' must be from 0 to"),
    ],
)
def test_contract_violations_are_named(record, message):
    with pytest.raises(JobError, match=message):
        validate_event(record, "events.jsonl line 1")


def test_unknown_event_kinds_and_extra_fields_are_kept():
    record = {"event": "gpu_memory", "bytes": 1}
    assert validate_event(record, "x") is record

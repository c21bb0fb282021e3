"""Reading the trainer's events file as it grows, and rejecting what breaks the contract.

The harness tails the file while the job runs (to deliver a preemption at a step), so the
reader is incremental and only ever consumes whole lines: a line is complete once its newline
is there. Validation is strict on the fields the verdict relies on and lenient on everything
else, so trainers may add fields and event kinds of their own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import JobError

Event = dict[str, Any]

_REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "start": {},
    "step": {"step": int, "loss": str},
    "checkpoint": {"step": int, "seconds": (int, float), "bytes": int, "uri": str},
    "resume": {"from_step": int, "uri": str},
    "rollback": {"skipped_uri": str, "reason": str},
    "checkpoint_failed": {"step": int, "seconds": (int, float), "reason": str},
    "final": {"step": int, "digests": dict},
}

MAX_LINE_SHOWN = 160


def validate_event(record: Any, where: str) -> Event:
    """Return ``record`` if it is a contract event, else raise :class:`JobError` naming ``where``."""
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        raise JobError(f"{where}: an event must be a JSON object with a string field 'event'")
    kind = record["event"]
    for field, expected in _REQUIRED.get(kind, {}).items():
        value = record.get(field)
        if not isinstance(value, expected) or isinstance(value, bool):
            raise JobError(f"{where}: '{kind}' event needs field '{field}' of type {_type_name(expected)}")
    if kind == "step":
        try:
            float.fromhex(record["loss"])
        except ValueError:
            raise JobError(
                f"{where}: 'step' event has loss {record['loss']!r}, which is not a float.hex string"
            ) from None
    return record


def _type_name(expected: type | tuple[type, ...]) -> str:
    if isinstance(expected, tuple):
        return " or ".join(t.__name__ for t in expected)
    return expected.__name__


class EventReader:
    """Incremental reader of one attempt's JSON-lines events file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = None  # opened once the trainer has created the file, then kept: polls are hot
        self._pending = b""
        self._line_number = 0
        self.events: list[Event] = []

    def read_new(self) -> list[Event]:
        """Parse every line completed since the last call."""
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except FileNotFoundError:
                return []
        chunk = self._file.read()
        if not chunk:
            return []
        data = self._pending + chunk
        *lines, self._pending = data.split(b"\n")
        new = [self._parse(line) for line in lines if line.strip()]
        self.events.extend(new)
        return new

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def torn_tail(self) -> bytes:
        """Bytes after the last newline: a line the writer never finished."""
        return self._pending

    def _parse(self, raw: bytes) -> Event:
        self._line_number += 1
        where = f"{self.path.name} line {self._line_number}"
        try:
            record = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            shown = raw[:MAX_LINE_SHOWN].decode("utf-8", "replace")
            raise JobError(f"{where}: not a JSON event: {shown!r}") from None
        return validate_event(record, where)

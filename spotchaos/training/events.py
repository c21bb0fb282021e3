"""Reading the trainer's events file as it grows, and rejecting what breaks the contract.

The harness tails the file while the job runs (to deliver a preemption at a step), so the
reader is incremental and only ever consumes whole lines: a line is complete once its newline
is there. Validation is strict on the fields the verdict relies on and lenient on everything
else, so trainers may add fields and event kinds of their own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import JobError
from ..safety.safefs import open_regular

Event = dict[str, Any]

_REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "start": {},
    "step": {"step": int, "loss": str},
    "checkpoint": {"step": int, "seconds": (int, float), "bytes": int, "uri": str},
    "resume": {"from_step": int, "uri": str},
    "rollback": {"skipped_uri": str, "reason": str},
    "removed": {"uri": str},
    "checkpoint_failed": {"step": int, "seconds": (int, float), "reason": str},
    "final": {"step": int, "digests": dict},
    "phase": {"name": str, "state": str},  # probe.phase(NAME): "begin" and "end"; its step may be None
}

MAX_LINE_SHOWN = 160
MAX_DEPTH = 32  # nesting of an event's JSON: the contract's deepest is 3
MAX_INT = 2**63  # every integer of an event: a 4000-digit one would overflow the report's arithmetic
MAX_STEP = 2**53  # steps are counted in floats by the plots
MAX_SECONDS = 1e9  # about 30 years
MAX_LINE_BYTES = 1 << 20  # an event or a log line longer than this is refused: a job's garbage never fills memory
READ_BYTES = 4 << 20  # read at most this much per poll, so a flood cannot stall the timeouts


def validate_event(record: Any, where: str) -> Event:
    """Return ``record`` if it is a contract event, else raise :class:`JobError` naming ``where``."""
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        raise JobError(f"{where}: an event must be a JSON object with a string field 'event'")
    kind = record["event"]
    _check_numbers(record, kind, where)
    for field, expected in _REQUIRED.get(kind, {}).items():
        value = record.get(field)
        if not isinstance(value, expected) or isinstance(value, bool):
            raise JobError(f"{where}: '{kind}' event needs field '{field}' of type {_type_name(expected)}")
    _check_shapes(record, kind, where)
    if kind == "step":
        try:
            float.fromhex(record["loss"])
        except ValueError:
            raise JobError(
                f"{where}: 'step' event has loss {record['loss']!r}, which is not a float.hex string"
            ) from None
    return record


_SCALAR = (str, int, float, bool, type(None))
_COUNTS = {"step": MAX_STEP, "from_step": MAX_STEP, "bytes": MAX_INT, "rank": 1 << 20}


def _check_numbers(record: dict[str, Any], kind: str, where: str) -> None:
    """Every number of an event in range, and its nesting shallow, before anything computes with
    them: the job wrote them, and a 4000-digit integer or a NaN duration would crash the report."""
    stack: list[tuple[Any, str, int]] = [(record, "", 0)]
    while stack:
        value, name, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise JobError(f"{where}: '{kind}' event is nested deeper than {MAX_DEPTH} levels (at {name or 'the top'})")
        if isinstance(value, dict):
            stack += [(v, f"{name}.{k}" if name else str(k), depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, f"{name}[{i}]", depth + 1) for i, v in enumerate(value)]
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INT:
            raise JobError(f"{where}: '{kind}' event field '{name}' holds an integer of {len(str(abs(value)))} digits")
    for field, limit in _COUNTS.items():
        value = record.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value < limit:
            raise JobError(f"{where}: '{kind}' event field '{field}' must be from 0 to {limit - 1}, got {value}")
    limits = [("seconds", record.get("seconds"), MAX_SECONDS)]
    memory = record.get("memory")
    if isinstance(memory, dict):
        limits += [(f"memory.{k}", v, float(MAX_INT)) for k, v in memory.items()]
    for field, value, limit in limits:
        if isinstance(value, int | float) and not isinstance(value, bool) and not 0 <= value < limit:
            raise JobError(f"{where}: '{kind}' event field '{field}' must be from 0 to {limit:g}, got {value!r}")


def _check_shapes(record: dict[str, Any], kind: str, where: str) -> None:
    """The nested fields the verdict and the report read, checked before anything reads them: a
    job's malformed event is its own error, never a crash of the harness (read as a pass)."""
    fp = record.get("fp")
    if fp is not None and not (isinstance(fp, dict) and all(isinstance(v, _SCALAR) for v in fp.values())):
        raise JobError(f"{where}: '{kind}' event field 'fp' must map names to strings or numbers, got {_shown(fp)}")
    memory = record.get("memory")
    if memory is not None and not (
        isinstance(memory, dict) and all(isinstance(v, int | float | type(None)) for v in memory.values())
    ):
        raise JobError(f"{where}: '{kind}' event field 'memory' must map names to numbers, got {_shown(memory)}")
    if kind == "final" and not all(isinstance(v, str) for v in record["digests"].values()):
        raise JobError(f"{where}: 'final' event field 'digests' must map tensor names to digest strings")
    rank = record.get("rank")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        # the rank verdict groups events by it (a list is unhashable): the job's error, not the harness's crash
        raise JobError(f"{where}: '{kind}' event field 'rank' must be an integer, got {_shown(rank)}")
    seconds = record.get("seconds")
    if seconds is not None and (not isinstance(seconds, int | float) or isinstance(seconds, bool)):
        raise JobError(f"{where}: '{kind}' event field 'seconds' must be a number, got {_shown(seconds)}")


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(expected: type | tuple[type, ...]) -> str:
    if isinstance(expected, tuple):
        return " or ".join(t.__name__ for t in expected)
    return expected.__name__


class LineReader:
    """Whole lines appended to a file the job writes, read incrementally and defensively.

    The file is opened only if it is a regular file reached without a link (a FIFO would block
    ``open`` past every timeout, a link to ``/dev/zero`` would never end), then kept open: polls
    are hot. Each poll reads a bounded amount, and a line longer than ``MAX_LINE_BYTES`` is an
    error naming the file, so whatever the job writes, the engine's timeouts keep firing.
    """

    def __init__(self, path: Path, what: str = "events file", latency: float = 0.0) -> None:
        self.path = path
        self.what = what
        # how late a line may reach the file after what the job did next (a file it saved): a
        # container's output comes through the daemon's log stream, a loaded machine's late
        self.latency = latency
        self._file = None
        self.pending = b""  # bytes after the last newline: a line not finished yet

    def _open(self) -> int:
        return open_regular(self.path)

    def read_lines(self) -> list[bytes]:
        if self._file is None:
            try:
                self._file = os.fdopen(self._open(), "rb")
            except FileNotFoundError:
                return []
        chunk = self._file.read(READ_BYTES)
        if not chunk:
            return []
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        if len(self.pending) > MAX_LINE_BYTES or any(len(line) > MAX_LINE_BYTES for line in lines):
            raise JobError(
                f"{self.path.name}: a line of the job's {self.what} is longer than {MAX_LINE_BYTES} bytes: "
                "refused (is something other than the trainer writing to it?)"
            )
        return lines

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class EventReader:
    """Incremental reader of one attempt's JSON-lines events file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lines = LineReader(path)
        self._line_number = 0
        self.events: list[Event] = []

    def read_new(self) -> list[Event]:
        """Parse every line completed since the last call."""
        new = [self._parse(line) for line in self._lines.read_lines() if line.strip()]
        self.events.extend(new)
        return new

    def close(self) -> None:
        self._lines.close()

    @property
    def torn_tail(self) -> bytes:
        """Bytes after the last newline: a line the writer never finished."""
        return self._lines.pending

    def _parse(self, raw: bytes) -> Event:
        self._line_number += 1
        where = f"{self.path.name} line {self._line_number}"
        try:
            record = json.loads(raw)
        except RecursionError:
            raise JobError(f"{where}: an event nested deeper than Python can parse: refused") from None
        except (UnicodeDecodeError, ValueError):
            shown = raw[:MAX_LINE_SHOWN].decode("utf-8", "replace")
            raise JobError(f"{where}: not a JSON event: {shown!r}") from None
        return validate_event(record, where)

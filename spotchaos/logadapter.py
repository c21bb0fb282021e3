"""Gate a training script that knows nothing of spotchaos: its printed log becomes the events.

Declared per job in ``[tool.spotchaos.jobs.NAME.log]``: a regular expression with named groups
``step`` and ``loss`` matched against stdout (or stderr), a glob for its checkpoint files, and
where its final weights are. The harness then reads what the script prints the way it reads the
probe's events: each matching line is a step, each new or rewritten checkpoint file is a
checkpoint, and a clean exit reads the final weights for the per-tensor digest comparison.
Checkpoint files are read without running the job's code in the harness
(:mod:`spotchaos.checkpoint_reader`), and links among them are never followed.

Printed losses carry only the digits the script prints, so the verdict says how many digits it
compared; a bit-exact claim needs the probe or the weights digest.
"""

from __future__ import annotations

import math
import os
import re
import stat
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint_reader import ConfinedLoad, NeedsFullUnpickle, read_checkpoint
from .errors import ConfigError, JobError
from .events import Event, LineReader

STREAMS = ("stdout", "stderr")
SCAN_SECONDS = 0.02  # checkpoint files are looked for at most this often (the engine polls every 3 ms)
DEFAULT_PATTERN = r"step (?P<step>\d+)\D+?loss[:= ]+(?P<loss>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"


@dataclass(frozen=True)
class LogSpec:
    pattern: str = DEFAULT_PATTERN
    stream: str = "stdout"
    checkpoints: str | None = None  # glob under the run's checkpoint directory, e.g. "*.pt"
    final_weights: str | None = None  # path under the checkpoint directory, e.g. "ckpt.pt"
    final_key: str | None = None  # the key holding the state dict ("model"); None: the file is one
    # The key in a checkpoint holding the number of steps completed. Without it a checkpoint is
    # credited to the last step printed before the file was seen, which a fast script may already
    # have passed; with it the harness loads the file and knows.
    checkpoint_step_key: str | None = None
    where: str = "log"

    def __post_init__(self) -> None:
        try:
            compiled = re.compile(self.pattern)
        except re.error as exc:
            raise ConfigError(f"{self.where}.pattern: {self.pattern!r} is not a regular expression: {exc}") from None
        missing = [g for g in ("step", "loss") if g not in compiled.groupindex]
        if missing:
            raise ConfigError(
                f"{self.where}.pattern: {self.pattern!r} has no named group {' or '.join(repr(g) for g in missing)}: "
                "write (?P<step>\\d+) and (?P<loss>[-0-9.e+]+) where the step and the loss are printed"
            )
        if self.stream not in STREAMS:
            raise ConfigError(f"{self.where}.stream: must be stdout or stderr, got {self.stream!r}")
        for key in ("checkpoints", "final_weights"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or value.startswith("/") or ".." in value):
                raise ConfigError(f"{self.where}.{key}: must be a path under the checkpoint directory, got {value!r}")

    @property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)

    def describe(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "stream": self.stream,
            "checkpoints": self.checkpoints,
            "final_weights": self.final_weights,
            "final_key": self.final_key,
            "checkpoint_step_key": self.checkpoint_step_key,
        }


def log_from_mapping(table: Any, where: str) -> LogSpec:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    known = {"pattern", "stream", "checkpoints", "final_weights", "final_key", "checkpoint_step_key"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    for key, value in table.items():
        if not isinstance(value, str):
            raise ConfigError(f"{where}.{key}: must be a string, got {value!r}")
    return LogSpec(**table, where=where)


def significant_digits(text: str) -> int:
    """Digits of a printed number that carry information: '0.012300' -> 5, '1.5e-03' -> 2."""
    mantissa = re.split(r"[eE]", text.strip().lstrip("+-"))[0]
    digits = mantissa.replace(".", "").lstrip("0")
    return max(1, len(digits)) if digits else 1


class LogEventReader:
    """Turns a script's output and checkpoint files into contract events, incrementally.

    Same surface as :class:`spotchaos.events.EventReader` (``read_new``, ``events``,
    ``torn_tail``, ``close``), plus ``finish`` for the final weights once the script exits 0.
    """

    def __init__(
        self, log_path: Path, spec: LogSpec, checkpoint_dir: Path, job: str, confined: ConfinedLoad | None = None
    ) -> None:
        self.path = log_path
        self.confined = confined  # reads a checkpoint that needs a full unpickle, in the job's confinement
        self.spec = spec
        self.checkpoint_dir = checkpoint_dir
        self.job = job
        self.events: list[Event] = []
        self._regex = spec.regex
        self._lines = LineReader(log_path, f"{spec.stream} log")
        self._seen_files: dict[Path, tuple[int, int]] = {}
        self._unreadable: dict[Path, tuple[int, int]] = {}  # not whole yet at this (mtime, size): not read again
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotchaos-confined-read")
        self._pending: list[tuple[Path, int, Future]] = []  # checkpoints being read in the job's confinement
        self._scanned_at = 0.0
        self._last_step: int | None = None
        self._started = False
        self.digits: int | None = None  # the fewest significant digits any compared loss had
        self.torn_tail = b""  # printed text has no torn events: a half line is just not a step yet

    def read_new(self) -> list[Event]:
        new: list[Event] = []
        for raw in self._lines.read_lines():
            new.extend(self._line(raw.decode("utf-8", "replace")))
        new.extend(self._new_checkpoints())
        self.events.extend(new)
        return new

    def _event(self, kind: str, **fields: Any) -> Event:
        return {"event": kind, "t": time.time(), "rank": 0, **fields}

    def _line(self, line: str) -> list[Event]:
        found = self._regex.search(line)
        if found is None:
            return []
        step_text, loss_text = found.group("step"), found.group("loss")
        try:
            step = int(step_text)
        except (TypeError, ValueError):
            raise JobError(
                f"job {self.job!r}: {self.spec.where}.pattern matched {line.strip()!r} but its step group "
                f"{step_text!r} is not an integer"
            ) from None
        try:
            loss = float(loss_text)
        except (TypeError, ValueError):
            raise JobError(
                f"job {self.job!r}: {self.spec.where}.pattern matched {line.strip()!r} but its loss group "
                f"{loss_text!r} does not parse as a number"
            ) from None
        events = []
        if not self._started:
            self._started = True
            events.append(self._event("start", schema=1, source="log"))
        if math.isfinite(loss):
            digits = significant_digits(loss_text)
            self.digits = digits if self.digits is None else min(self.digits, digits)
        self._last_step = step
        events.append(self._event("step", step=step, loss=loss.hex(), printed=loss_text))
        return events

    def _new_checkpoints(self) -> list[Event]:
        """A checkpoint file that appeared or changed since the last poll, after a printed step."""
        if self.spec.checkpoints is None or self._last_step is None:
            return []
        now = time.monotonic()
        if now - self._scanned_at < SCAN_SECONDS:
            return []  # a directory listing per poll would cost more than the job's own I/O
        self._scanned_at = now
        events = self._confined_results()
        for path in sorted(self.checkpoint_dir.glob(self.spec.checkpoints)):
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            signature = (info.st_mtime_ns, info.st_size)
            if not stat.S_ISREG(info.st_mode) or signature in (self._seen_files.get(path), self._unreadable.get(path)):
                continue  # a link is never followed: its target, if it is a checkpoint, counts itself
            if self.spec.checkpoint_step_key is None:
                self._seen_files[path] = signature
                events.append(self._checkpoint(path, self._last_step, info.st_size))
                continue
            try:
                summary = read_checkpoint(path, self.spec.checkpoint_step_key, None, None, self.checkpoint_dir)
            except NeedsFullUnpickle:
                if self.confined is None:
                    self._unreadable[path] = signature
                    continue
                # read in the job's confinement, in the background: a helper process's start-up
                # (seconds, with torch) must not stall the engine's polls, its faults and timeouts
                self._seen_files[path] = signature
                future = self._pool.submit(self.confined, path, self.spec.checkpoint_step_key, None)
                self._pending.append((path, info.st_size, future))
                continue
            except Exception:  # torn, still being written, a link in its path: look again once it changes
                self._unreadable[path] = signature
                continue
            if summary.get("step") is None:
                self._unreadable[path] = signature
                continue
            self._seen_files[path] = signature
            events.append(self._checkpoint(path, summary["step"] - 1, info.st_size))
        return events

    def _checkpoint(self, path: Path, step: int, size: int) -> Event:
        return self._event(
            "checkpoint",
            step=step,
            seconds=0.0,  # a script without the probe does not say how long it blocked
            bytes=size,
            uri=path.absolute().as_uri(),  # never resolved: resolving follows links
            reason="observed",
        )

    def _confined_results(self, wait: bool = False) -> list[Event]:
        """Checkpoint events for the background reads that have finished (all of them, with ``wait``)."""
        events, still = [], []
        for path, size, future in self._pending:
            if not (wait or future.done()):
                still.append((path, size, future))
                continue
            try:
                step = future.result().get("step")
            except Exception:  # torn, or the helper failed: not a checkpoint
                step = None
            if step is not None:
                events.append(self._checkpoint(path, step - 1, size))
        self._pending = still
        return events

    def finish(self, exit_code: int | None) -> None:
        """After a clean exit: the final event, with the weights' digests when they are configured."""
        if exit_code != 0:
            return
        digests: dict[str, str] = {}
        stored = None
        if self.spec.final_weights is not None:
            path = self.checkpoint_dir / self.spec.final_weights
            digests, stored = final_state(path, self.spec, self.job, self.confined, self.checkpoint_dir)
        # A restart with nothing left to train prints no step: its final step is the last one the
        # final checkpoint holds (steps completed - 1), so the verdict sees where it resumed.
        step = self._last_step
        if step is None:
            step = stored - 1 if stored is not None else -1
        self.events.append(self._event("final", step=step, digests=digests))

    def close(self) -> None:
        """The attempt is over: one last look for a checkpoint written just before the exit, and
        the results of every background read."""
        self._scanned_at = 0.0
        self.events.extend(self._new_checkpoints())
        self.events.extend(self._confined_results(wait=True))
        self._pool.shutdown(wait=True)
        self._lines.close()


def final_state(
    path: Path, spec: LogSpec, job: str, confined: ConfinedLoad | None = None, root: Path | None = None
) -> tuple[dict[str, str], int | None]:
    """Per-tensor digests of the state dict in ``path`` (under ``spec.final_key``, if given), and the
    steps completed it stores (``checkpoint_step_key``; None without one), read in one load."""
    where = f"job {job!r}: {spec.where}.final_weights"
    try:
        summary = read_checkpoint(
            path, spec.checkpoint_step_key, spec.final_key, confined, path.parent if root is None else root
        )
    except FileNotFoundError:
        raise JobError(f"{where}: {path} does not exist after a clean exit") from None
    except JobError as exc:
        raise JobError(f"{where}: {exc}") from None
    except Exception as exc:
        raise JobError(f"{where}: cannot load {path}: {exc}") from None
    if summary.get("digests") is None:
        if spec.final_key is not None:
            keys = ", ".join(map(repr, summary.get("keys") or [])) or summary.get("holds") or "not a dict"
            raise JobError(f"job {job!r}: {spec.where}.final_key {spec.final_key!r} is not in {path.name} ({keys})")
        raise JobError(
            f"job {job!r}: {path.name} holds a {summary.get('holds') or 'value'}, not a state dict: set final_key"
        )
    return summary["digests"], summary.get("step")

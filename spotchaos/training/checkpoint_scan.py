"""Checkpoint files of an unmodified script, found as they appear: the log adapter's second source.

A file matching the job's checkpoint glob that appeared or changed since the last look, whole
(every companion the script writes last is there) and reached without a link, becomes a
checkpoint event; its step is the last step printed, or the step key it stores, read without
running the job's code here (weights-only, else in the job's confinement, in the background so
a helper's start-up never stalls the engine's polls).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..config.logspec import LogSpec
from ..errors import ConfigError, JobError
from .events import Event
from .state.checkpoint_reader import ConfinedLoad, NeedsFullUnpickle, read_checkpoint

SCAN_SECONDS = 0.02  # checkpoint files are looked for at most this often (the engine polls every 3 ms)


def event(kind: str, **fields: Any) -> Event:
    """A contract event as the log adapter makes it (rank 0, now)."""
    return {"event": kind, "t": time.time(), "rank": 0, **fields}


class CheckpointScan:
    """The checkpoint files of one attempt, as they appear (see the module's docstring)."""

    def __init__(self, spec: LogSpec, checkpoint_dir: Path, confined: ConfinedLoad | None) -> None:
        self.spec = spec
        self.checkpoint_dir = checkpoint_dir
        self.confined = confined  # reads a checkpoint that needs a full unpickle, in the job's confinement
        self._seen_files: dict[Path, tuple[int, int]] = {}
        self._unreadable: dict[Path, tuple[int, int]] = {}  # not whole yet at this (mtime, size): not read again
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotchaos-confined-read")
        self._pending: list[tuple[Path, os.stat_result, tuple[int | None, float], Future]] = []
        self._scanned_at = 0.0

    def look_now(self) -> None:
        """The next scan happens whenever it is asked for, however recent the last one."""
        self._scanned_at = 0.0

    def complete(self, path: Path) -> bool:
        """Every companion file the script writes before it trusts the checkpoint is there (a
        regular file, reached without a link)."""
        for companion in self.spec.companions(path):
            try:
                if not stat.S_ISREG(os.lstat(companion).st_mode):
                    return False
            except OSError:
                return False
        return True

    def new(self, last_step: int | None, key_offset: int | None) -> list[Event]:
        """A checkpoint file that appeared or changed since the last look, after a printed step
        (``last_step``, 0-based); a stored step key counts ``key_offset`` from the step it holds."""
        if self.spec.checkpoints is None or last_step is None:
            return []
        now = time.monotonic()
        if now - self._scanned_at < SCAN_SECONDS:
            return []  # a directory listing per poll would cost more than the job's own I/O
        self._scanned_at = now
        events = self.confined_results(key_offset)
        for path in sorted(self.checkpoint_dir.glob(self.spec.checkpoints)):
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(info.st_mode):
                raise ConfigError(_folder_glob(self.spec.checkpoints, path.name, self.spec.where))
            signature = (info.st_mtime_ns, info.st_size)
            if not stat.S_ISREG(info.st_mode) or signature in (self._seen_files.get(path), self._unreadable.get(path)):
                continue  # a link is never followed: its target, if it is a checkpoint, counts itself
            if not self.complete(path):
                continue  # not durable until the script's own marker of a whole checkpoint is written
            found = self._read(path, info, signature, last_step, key_offset)
            if found is not None:
                events.append(found)
        return events

    def _read(
        self,
        path: Path,
        info: os.stat_result,
        signature: tuple[int, int],
        last_step: int,
        key_offset: int | None,
    ) -> Event | None:
        """One new file: its checkpoint event now, later (read in the background), or never (torn)."""
        if self.spec.checkpoint_step_key is None:
            self._seen_files[path] = signature
            return checkpoint_event(path, last_step, info.st_size)
        try:
            summary = read_checkpoint(path, self.spec.checkpoint_step_key, None, None, self.checkpoint_dir)
        except NeedsFullUnpickle:
            if self.confined is None:
                self._unreadable[path] = signature
                return None
            # read in the job's confinement, in the background: a helper process's start-up
            # (seconds, with torch) must not stall the engine's polls, its faults and timeouts
            self._seen_files[path] = signature
            future = self._pool.submit(self.confined, path, self.spec.checkpoint_step_key, None)
            self._pending.append((path, info, (last_step, time.time()), future))
            return None
        except Exception:  # torn, still being written, a link in its path: look again once it changes
            self._unreadable[path] = signature
            return None
        if summary.get("step") is None:
            self._unreadable[path] = signature
            return None
        self._seen_files[path] = signature
        return stored_checkpoint(path, summary["step"], info, (last_step, time.time()), key_offset)

    def confined_results(self, key_offset: int | None, wait: bool = False) -> list[Event]:
        """Checkpoint events for the background reads that have finished (all of them, with ``wait``)."""
        events, still = [], []
        for path, info, seen_after, future in self._pending:
            if not (wait or future.done()):
                still.append((path, info, seen_after, future))
                continue
            try:
                step = future.result().get("step")
            except Exception:  # torn, or the helper failed: not a checkpoint
                step = None
            if step is not None:
                events.append(stored_checkpoint(path, step, info, seen_after, key_offset))
        self._pending = still
        return events

    def final_path(self, job: str) -> Path | None:
        """The final weights' file: ``final_weights`` itself, or the newest complete file its glob
        matches (a script that names checkpoints by step), links never among them."""
        name = self.spec.final_weights
        if name is None:
            return None
        if not any(c in name for c in "*?["):
            return self.checkpoint_dir / name
        found = []
        for path in self.checkpoint_dir.glob(name):
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode) and self.complete(path):
                    found.append((info.st_mtime_ns, path.name, path))
        if not found:
            raise JobError(
                f"job {job!r}: {self.spec.where}.final_weights: no complete file matches {name!r} after a clean exit"
            )
        return max(found)[2]

    def close(self, last_step: int | None, key_offset: int | None) -> list[Event]:
        """The attempt is over: one last look for a checkpoint written just before the exit, and
        the results of every background read."""
        self._scanned_at = 0.0
        events = self.new(last_step, key_offset)
        events.extend(self.confined_results(key_offset, wait=True))
        self._pool.shutdown(wait=True)
        return events


def stored_checkpoint(
    path: Path, stored: int, info: os.stat_result, found: tuple[int | None, float], key_offset: int | None
) -> Event:
    """The checkpoint event of a file whose step key was read (``stored``, the raw key)."""
    made = checkpoint_event(path, stored - (key_offset or 0), info.st_size)
    made["stored"] = stored  # the raw key: the uninterrupted run learns the convention from it
    # the version of the file whose key was read: a copy kept for the state diff must be this
    # one, not a later save the script wrote over it before the copy (state_diff.keep)
    made["mtime_ns"] = info.st_mtime_ns
    made["seen_after"], made["found_at"] = found  # the last step line read when the file was found, and when
    return made


def checkpoint_event(path: Path, step: int, size: int) -> Event:
    return event(
        "checkpoint",
        step=step,
        seconds=0.0,  # a script without the probe does not say how long it blocked
        bytes=size,
        uri=path.absolute().as_uri(),  # never resolved: resolving follows links
        reason="observed",
    )


def _folder_glob(pattern: str, folder: str, where: str) -> str:
    """The one message for a checkpoint glob that matches folders: tracking nothing would pass
    every scenario without testing one."""
    return (
        f"{where}.checkpoints = {pattern!r} matches the folder {folder}/: the log adapter reads checkpoint files. "
        f"Name a file inside each and the file the job writes last in it, e.g. checkpoints = "
        f"'{pattern}/model.safetensors' and checkpoint_complete = 'random_states_0.pkl' (accelerate's save_state), "
        "or gate a Trainer, Lightning or accelerate job with its integration (docs/frameworks.md)"
    )

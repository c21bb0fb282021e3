"""A resumed tail run once: two plans whose last restart begins on the same files run the same
computation, so the second takes the first's events instead of training them again.

Why it is sound: a plan's last attempt (no fault left in it) is the job's resume command started
on its checkpoint folder. Where the job's whole world is that folder (the jobs that take the
reference's prefixes: one process, no container, no S3, nothing written outside the folder, as
the reference's trace showed, ``Prefixes.live``), what that attempt computes is fixed by the job
(its whole dataclass), the attempt's number (its ``SPOTCHAOS_ATTEMPT``, and the hash seed of the
warm interpreter it forks from), the variables the harness adds, and the folder's bytes. A key of
all of those, the folder hashed file by file, names one computation; a second plan that reaches
the same key would train exactly what the first did.

Why it still never decides: it is a shortcut like a warm start or a copy (``shortcuts.TAIL``). A
plan that fails through a reused tail is judged again on the slow path (cold, from step 0); the
audit (``--spotchaos-audit``) runs passes through it again there; the job stops taking tails when
it stops taking copies (a failed plan, a disagreement). Only a tail that finished cleanly (its
final event, exit 0, nothing left running) is kept; a folder holding a link or a special file, or
over ``DIGEST_BYTES``, gives no key, and that plan trains its tail.

What a replay leaves in the run: the tail's checkpoint folder as it ended (copied), its kept
checkpoints (linked: the state diff compares them), and its attempt with ``start_kind = "tail"``,
the addresses in its events moved into this run's folder and its times moved to now (its
durations kept). Its steps are credited on the gate's cost, not trained.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...safety.safefs import UnsafeFile, copy_contents, open_beneath
from ..state.kept import kept_dir
from ..trajectory import Attempt
from .prefix import moved_uri

DIGEST_BYTES = 1 << 30  # a folder above this is hashed by no one: that plan trains its tail


def folder_digest(top: Path, limit: int = DIGEST_BYTES) -> str | None:
    """The bytes below ``top``, every name and file content: equal digests, equal folders. None
    where it cannot be told (a link, a special file, more than ``limit`` bytes)."""
    h = hashlib.sha256()
    total = 0
    for folder, dirs, files in os.walk(top, followlinks=False):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, top)
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode):
                h.update(b"d\0" + relative.encode() + b"\0")
                continue
            if not stat.S_ISREG(info.st_mode):
                return None  # a link or a special file: its meaning is not its bytes
            total += info.st_size
            if total > limit:
                return None
            h.update(b"f\0" + relative.encode() + b"\0" + str(info.st_size).encode() + b"\0")
            try:
                fd = open_beneath(top, relative)
            except (UnsafeFile, OSError):
                return None
            with os.fdopen(fd, "rb") as file:
                for block in iter(lambda: file.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Tail:
    """A finished last attempt, kept: its record, where it ran, and the store's copies."""

    attempt: Attempt
    plan: str
    ran_in: Path  # the checkpoint folder it ran on: the addresses its events name
    checkpoints: Path  # the store's copy of that folder as the attempt left it
    kept: Path  # the store's links to its kept checkpoints (a<index>-*)

    def describe(self) -> str:
        return f"plan {self.plan}'s attempt {self.attempt.index}"


class Tails:
    """One session's kept tails, by key (see the module's docstring), below a folder it owns."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._tails: dict[str, Tail] = {}
        self._count = 0
        self._lock = threading.Lock()

    @staticmethod
    def key(job_key: str, index: int, checkpoints: Path, environment: tuple[Any, ...]) -> str | None:
        """What fixes a last attempt's computation: the job, the attempt's number, what the harness
        adds to its environment, and its folder's bytes (None: the folder cannot be told)."""
        digest = folder_digest(checkpoints)
        if digest is None:
            return None
        parts = (job_key, str(index), repr(environment), digest)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def find(self, key: str) -> Tail | None:
        with self._lock:
            return self._tails.get(key)

    def keep(self, key: str, attempt: Attempt, plan: str, workdir: Path) -> None:
        """Keep ``attempt`` (the last of a run in ``workdir``) under ``key`` if it finished cleanly
        and its folder copies whole; a key already kept stays as it is (plans beside each other)."""
        clean = attempt.final is not None and attempt.exit_code == 0 and attempt.fault is None
        if not clean or attempt.orphans or attempt.escaped or attempt.failed_restart or self.find(key) is not None:
            return
        with self._lock:
            self._count += 1
            store = self.folder / f"{self._count:04d}"
        try:
            self.folder.mkdir(mode=0o700, exist_ok=True)
            store.mkdir()
            (store / "checkpoints").mkdir()
            copy_contents(workdir / "checkpoints", store / "checkpoints")
            (store / "kept").mkdir()
            _link_kept(kept_dir(workdir), store / "kept", attempt.index)
        except (OSError, UnsafeFile):
            shutil.rmtree(store, ignore_errors=True)
            return
        tail = Tail(copy.deepcopy(attempt), plan, workdir / "checkpoints", store / "checkpoints", store / "kept")
        with self._lock:
            self._tails.setdefault(key, tail)

    def replay(self, tail: Tail, workdir: Path) -> Attempt:
        """The run in ``workdir`` as if its last attempt had run: the tail's folder copied over the
        run's (which held the same bytes when it started), its kept checkpoints linked, its attempt."""
        checkpoints = workdir / "checkpoints"
        shutil.rmtree(checkpoints)  # the harness's own folder; a link inside is removed, never followed
        checkpoints.mkdir()
        copy_contents(tail.checkpoints, checkpoints)
        if kept_dir(workdir).is_dir():
            _link_kept(tail.kept, kept_dir(workdir), tail.attempt.index)
        return _moved(tail, checkpoints)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _link_kept(source: Path, target: Path, index: int) -> None:
    """Link the kept checkpoints of attempt ``index`` (``a<index>-*`` folders of regular files)."""
    if not source.is_dir():
        return
    for entry in sorted(source.iterdir()):
        if not entry.name.startswith(f"a{index}-") or entry.is_symlink() or not entry.is_dir():
            continue
        for folder, _, files in os.walk(entry, followlinks=False):
            into = target / entry.name / os.path.relpath(folder, entry)
            into.mkdir(parents=True, exist_ok=True)
            for name in files:
                if os.path.islink(os.path.join(folder, name)):
                    raise UnsafeFile(f"{os.path.join(folder, name)}: a link among kept checkpoints")
                os.link(os.path.join(folder, name), into / name, follow_symlinks=False)


def _moved(tail: Tail, checkpoints: Path) -> Attempt:
    """The tail's attempt in this run: its addresses moved into ``checkpoints``, its times to now."""
    attempt = copy.deepcopy(tail.attempt)
    shift = time.time() - attempt.started_wall
    attempt.started_wall += shift
    for event in attempt.events:
        if isinstance(event.get("t"), int | float):
            event["t"] += shift
        for name, value in list(event.items()):
            if (name == "uri" or name.endswith("_uri")) and isinstance(value, str):  # resume's, rollback's skipped_uri
                event[name] = moved_uri(value, tail.ran_in, checkpoints)
    attempt.start_kind = "tail"
    attempt.trained_in = str(tail.ran_in.parent)  # its checkpoints name that run's folder (a Trainer's output_dir)
    return attempt

"""The reference kept across sessions: a second ``pytest --spotchaos`` on an unchanged job reads
its uninterrupted run (events, kept checkpoints, the snapshots plans start from) from the user's
cache folder instead of training it again.

Why it can be trusted: an entry is keyed by the job's fingerprint, everything that shapes its
trajectory that the harness can see (the job's table and its environment's values, the script and
the files it names with the Python files beside the script, the installed packages, spotchaos's own
sources, Python, the machine and its GPUs); what the harness cannot see (a data file the job opens
by a name it builds itself) is caught by the runs: every job runs a plan from step 0 a session, and a
run that fails while its job's reference came from the cache makes the session train the
reference again and compare. A difference says *the cached reference of 'job' no longer matches
the job (step 3 differs): recomputed*, the run is judged again against the new one, and the entry
is rewritten: a stale cache is never a failure of the job.

What the cache folder may hold is the harness's alone: made 0700 and proven private
(``safefs.private_dir``), every entry reached and read through fds without following a link, one
written in a temporary folder and renamed into place (two sessions writing the same entry: the
first rename wins). An entry that is unreadable, from another format or fingerprint, or a link, is
ignored and rewritten, never followed; the newest ``KEEP_PER_JOB`` entries of a job are kept.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import __version__
from ...config.jobs import JobSpec
from ...config.placeholders import working_folder
from ...host.gpu import nvidia_smi
from ...host.machine import cpu_model, packages_digest
from ...safety.redact import leaking_files
from ...safety.safefs import (
    Folder,
    NotPrivate,
    UnsafeFile,
    copy_contents,
    copy_file,
    listing,
    private_dir,
    read_bounded,
    regular_files,
)
from ..engine.options import FS_EVENTS, FS_READS
from ..state.kept import kept_dir
from ..trajectory import RunRecord
from .prefix import Snapshots, open_snapshots
from .prefix import why_not as why_no_prefix

log = logging.getLogger("spotchaos")

FORMAT = 1  # an entry of another format is ignored and rewritten
ENTRY = "entry.json"
ENTRY_BYTES = 64 << 20  # an entry.json larger than this is not read
KEEP_PER_JOB = 2  # entries of one job name kept: the newest (a branch switched back and forth)
HASH_WHOLE_BYTES = 1 << 30  # a named file larger than this is fingerprinted by its size and mtime
BESIDE_THE_SCRIPT = 256  # Python files beside the script fingerprinted (the modules it imports)


def default_folder(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CACHE_HOME/spotchaos/references``, else ``~/.cache/spotchaos/references``."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "spotchaos" / "references"


def why_not(job: JobSpec) -> str | None:
    """Why ``job``'s reference is never cached; None when it may be."""
    if not job.cache_reference:
        return "cache_reference = false"
    if job.exactness != "bit":
        return "envelope mode (its reference leaves its final tensors in its own folder)"
    return why_no_prefix(job)  # the same jobs: one local process the probe holds, checkpoints on local disk


@functools.cache
def _sources_digest() -> str:
    """spotchaos's own Python sources: the probe writes the events, the engine holds the steps."""
    package = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _file_digest(path: Path) -> str | None:
    """A named file's content hash (no link followed); None where it is no regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # a folder opens read-only too; only a file object refuses it
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as file:
        if info.st_size > HASH_WHOLE_BYTES:
            return f"size {info.st_size} mtime {info.st_mtime_ns}"
        return hashlib.file_digest(file, "sha256").hexdigest()


def _named_files(job: JobSpec, cwd: Path) -> dict[str, str]:
    """The files the job's command lines and environment name, and the Python files beside its script."""
    words: Iterable[str] = [
        *job.command,
        *(job.resume_command or ()),
        *job.resume_args,
        *(value for _, value in job.env),
    ]
    found: dict[str, str] = {}
    for word in words:
        for part in {word, word.partition("=")[2]} - {""}:
            path = cwd / part
            if part not in found and (digest := _file_digest(path)) is not None:
                found[part] = digest
                if path.suffix == ".py":
                    beside = sorted(path.parent.glob("*.py"))[:BESIDE_THE_SCRIPT]
                    for sibling in beside:
                        name = os.path.relpath(sibling, cwd)
                        if name not in found and (digest := _file_digest(sibling)) is not None:
                            found[name] = digest
    return found


def fingerprint(job: JobSpec, root: Path) -> str:
    """What shapes ``job``'s uninterrupted run, as far as the harness can see it, in one hash."""
    cwd = working_folder(job.cwd, root)
    packages, _ = packages_digest()
    shaping = {
        "format": FORMAT,
        "job": job.describe(),
        "env": hashlib.sha256(json.dumps(sorted(job.env)).encode()).hexdigest(),  # values, never written plainly
        "files": _named_files(job, cwd),
        "python": [sys.executable, sys.version],
        "packages": packages,
        "spotchaos": [__version__, _sources_digest()],
        "machine": [os.uname().machine, cpu_model()],
        "gpus": [
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            nvidia_smi("--query-gpu=name", "--format=csv,noheader") if job.gpu_request is not None else None,
        ],
    }
    return hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _entry_name(job: JobSpec, digest: str) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', job.name)[:64]}-{digest}"


def _moved(value: Any, old: str, new: str) -> Any:
    """Every path (and file URI) below the old reference's folder, moved below the new one."""
    if isinstance(value, dict):
        return {k: _moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, old, new) for v in value]
    if isinstance(value, str):
        for before, after in ((old, new), (Path(old).as_uri(), Path(new).as_uri())):
            if value == before or value.startswith(before + "/"):
                return after + value[len(before) :]
    return value


@dataclass
class Cached:
    """A reference read from the cache, the snapshots it came with (None: the session takes no
    prefix), and where it was read from."""

    record: RunRecord
    snapshots: Snapshots | None
    said: str


def reference_difference(cached: RunRecord, fresh: RunRecord) -> str | None:
    """Where a freshly trained reference departs from the cached one, in a few words; None: nowhere."""
    for old, new in zip(cached.steps, fresh.steps, strict=False):
        if (old.step, old.loss, old.fingerprints) != (new.step, new.loss, new.fingerprints):
            return f"step {new.step} differs"
    if len(cached.steps) != len(fresh.steps):
        return f"it trains {len(fresh.steps)} steps, not {len(cached.steps)}"

    def saved(run: RunRecord) -> list[int]:
        return [e["step"] for a in run.attempts for e in a.of_kind("checkpoint")]

    if saved(cached) != saved(fresh):
        return f"it checkpoints after steps {saved(fresh)}, not {saved(cached)}"
    if (cached.final or {}).get("digests") != (fresh.final or {}).get("digests"):
        return "its final weights differ"
    kept = _kept_listing(cached), _kept_listing(fresh)
    if kept[0] != kept[1]:
        first = sorted(set(kept[0]) ^ set(kept[1]))[0]
        return f"its kept checkpoints differ ({first[0]})"
    return None


def _kept_listing(run: RunRecord) -> list[tuple[str, str | None]]:
    """Each kept checkpoint file of a reference and its digest (an entry added to each changes
    them; a size may not: torch's archive pads its records). Read only when a plan failed against
    a cached reference, and a difference costs a reference run, never a verdict."""
    folder = kept_dir(run.workdir)
    if not folder.is_dir() or folder.is_symlink():
        return []
    return [(name, _file_digest(folder / name)) for name, size, _, _ in listing(folder) if size]


class ReferenceCache:
    """The references of one user's jobs, kept in ``folder`` across sessions. ``fresh``: every
    reference of this session is trained again and its entry rewritten (--spotchaos-fresh-reference)."""

    def __init__(self, folder: Path | str, *, fresh: bool = False) -> None:
        self.folder = Path(folder)
        self.fresh = fresh
        self.off: str | None = None  # why the cache could not be used at all this session
        self._fingerprints: dict[tuple[str, str], str] = {}  # (job, root) -> its fingerprint, taken once

    def fingerprint(self, job: JobSpec, root: Path) -> str:
        """The job's fingerprint as it was when the session first asked (before its reference ran):
        hashing its files and asking for its GPUs once, and the entry stored under what was trained."""
        key = (repr(job), str(root))
        if key not in self._fingerprints:
            self._fingerprints[key] = fingerprint(job, root)
        return self._fingerprints[key]

    def _open(self) -> Folder | None:
        if self.off is not None:
            return None
        try:
            return Folder.open(private_dir(self.folder))
        except (NotPrivate, UnsafeFile, OSError) as exc:
            self.off = f"the reference cache {self.folder} cannot be used: {exc}"
            log.warning("spotchaos: %s", self.off)
            return None

    def load(self, job: JobSpec, root: Path, workdir: Path, *, with_snapshots: bool) -> Cached | str:
        """``job``'s cached reference, its files copied to ``workdir`` (new) and beside it (its
        snapshots too, ``with_snapshots``); else why there is none, in a few words (the entry is
        then written anew after the run)."""
        if (why := why_not(job)) is not None:
            return f"not cached: {why}"
        if self.fresh:
            return "not read: --spotchaos-fresh-reference"
        top = self._open()
        if top is None:
            return f"not read: {self.off}"
        digest = self.fingerprint(job, root)
        with top:
            try:
                entry = top.folder(_entry_name(job, digest))
            except FileNotFoundError:
                return "not in the cache (first run of this job as it is now)"
            except (UnsafeFile, OSError) as exc:
                return f"ignored: {exc}"
            with entry:
                try:
                    data = _read_entry(entry)
                    if data.get("format") != FORMAT or data.get("fingerprint") != digest:
                        return "ignored: an entry of another format or fingerprint"
                    if with_snapshots and data.get("snapshots") is None:
                        return "ignored: an entry written without snapshots (--spotchaos-prefix=off)"
                    if (owner := os.fstat(entry.fd).st_uid) != os.getuid():
                        return f"ignored: an entry owned by uid {owner}, not this user's"
                    if (changed := _changed_reads(data.get("read"))) is not None:
                        return f"ignored: {changed}, which its uninterrupted run read, changed since it was cached"
                    found = _materialise(entry, data, workdir, job.snapshot_budget if with_snapshots else -1)
                    made = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(data.get("written") or 0)))
                    found.said = f"reference from the cache (fingerprint {digest[:12]}, made {made}): {entry.path}"
                    return found
                except (UnsafeFile, OSError, ValueError, KeyError, TypeError) as exc:
                    shutil.rmtree(workdir, ignore_errors=True)
                    shutil.rmtree(kept_dir(workdir), ignore_errors=True)
                    return f"ignored: an unreadable entry ({type(exc).__name__}: {exc})"

    def store(
        self, job: JobSpec, root: Path, record: RunRecord, snapshots: Snapshots | None, hidden: Iterable[str] = ()
    ) -> str:
        """Keep ``record`` (with its kept checkpoints and snapshots) for the next session; what was
        done, in a few words. A reference whose kept checkpoints or copies hold one of ``hidden`` (secrets)
        is not kept: the cache outlives the run folder the verdict would have called the leak in."""
        if (why := why_not(job)) is not None:
            return f"not cached: {why}"
        values = list(hidden)
        held = [
            f"{folder.name}/{name}"
            for folder in (kept_dir(record.workdir), snapshots.folder if snapshots is not None else None)
            if folder is not None and folder.is_dir() and not folder.is_symlink()
            for name in leaking_files(folder, values)
        ]
        if held:
            return f"not cached: its checkpoints hold a secret ({held[0]})"
        top = self._open()
        if top is None:
            return f"not stored: {self.off}"
        digest = self.fingerprint(job, root)
        name = _entry_name(job, digest)
        temporary = f".new-{name}-{os.getpid()}-{secrets.token_hex(4)}"
        with top:
            if (owner := _owner(top, name)) not in (None, os.getuid()):
                return f"not stored: an entry of uid {owner} holds its place, and only this user's are replaced"
            try:
                _write(top, temporary, record, snapshots, digest)
                with contextlib.suppress(FileNotFoundError):
                    top.remove(name)  # an older, stale or ignored entry of the same fingerprint
                top.rename(temporary, name)
            except OSError as exc:  # another session renamed its entry first, or the disk is full
                with contextlib.suppress(OSError):
                    top.remove(temporary)
                return f"not stored: {exc.strerror or exc}"
            _prune(top, job)
        return f"stored as {self.folder / name}"


def _read_entry(entry: Folder) -> dict[str, Any]:
    fd = entry.open_file(ENTRY)
    with os.fdopen(fd, "rb") as file:
        raw = file.read(ENTRY_BYTES + 1)
    if len(raw) > ENTRY_BYTES:
        raise ValueError(f"{ENTRY} is over {ENTRY_BYTES} bytes")
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{ENTRY} holds no object")
    return data


def _materialise(entry: Folder, data: dict[str, Any], workdir: Path, snapshot_budget: int | None) -> Cached:
    """The entry's reference as this session's: its folder ``workdir``, its kept checkpoints and
    snapshots (unless ``snapshot_budget`` is -1) copied beside it, every path in its events moved there."""
    old = str(data["workdir"])
    record = RunRecord.from_dict(_moved(data["record"], old, str(workdir)))
    record.trained_in = old  # what its kept checkpoints name as their own folder
    workdir.mkdir()
    (workdir / "checkpoints").mkdir()
    kept = entry.path / "kept"
    held = os.listdir(entry.fd)
    if FS_EVENTS in held:
        (workdir / "attempt-0").mkdir()
        with Folder.open(workdir / "attempt-0") as attempt:
            copy_file(entry, FS_EVENTS, attempt, FS_EVENTS, 0o600)
    if "kept" in held:
        kept_dir(workdir).mkdir()
        copy_contents(kept, kept_dir(workdir))
    described = data.get("snapshots")
    snapshots = None
    if isinstance(described, dict) and snapshot_budget != -1:
        snapshots = open_snapshots(workdir, snapshot_budget)
        snapshots.refused = described.get("refused")
        snapshots.skipped = {int(k): str(v) for k, v in (described.get("skipped") or {}).items()}
        for step in described.get("steps") or []:
            target = snapshots.folder / f"s{int(step)}"
            target.mkdir()
            copy_contents(entry.path / "snapshots" / f"s{int(step)}", target)
            snapshots.taken[int(step)] = target
        snapshots.used = sum(os.lstat(f).st_size for f in regular_files(snapshots.folder))
    return Cached(record, snapshots, "")


def _write(top: Folder, name: str, record: RunRecord, snapshots: Snapshots | None, digest: str) -> None:
    os.mkdir(name, 0o700, dir_fd=top.fd)
    data = {
        "format": FORMAT,
        "fingerprint": digest,
        "job": record.job,
        "written": time.time(),
        "workdir": record.workdir,
        "record": {**record.to_dict(with_events=True), "cache": None},
        "snapshots": snapshots.describe() if snapshots is not None else None,
        "read": _reads(record),
    }
    with top.folder(name) as entry:
        fd = entry.create_file(ENTRY, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(json.dumps(data).encode())
        traced = Path(record.workdir) / "attempt-0" / FS_EVENTS  # its file-system events, for crash points
        if os.path.lexists(traced):
            with Folder.open(traced.parent) as attempt:
                copy_file(attempt, FS_EVENTS, entry, FS_EVENTS, 0o600)
        kept = kept_dir(record.workdir)
        if kept.is_dir() and not kept.is_symlink():
            os.mkdir("kept", 0o700, dir_fd=entry.fd)
            copy_contents(kept, entry.path / "kept")
        if snapshots is not None and snapshots.taken:
            os.mkdir("snapshots", 0o700, dir_fd=entry.fd)
            for step, folder in sorted(snapshots.taken.items()):
                os.mkdir(f"snapshots/s{step}", 0o700, dir_fd=entry.fd)
                copy_contents(folder, entry.path / "snapshots" / f"s{step}")


def _reads(record: RunRecord) -> dict[str, str]:
    """Each file the reference read outside its own folder, its Python, its packages and spotchaos
    (the crash-point hook's trace), with its digest: a helper module the job's table does not name."""
    traced = Path(record.workdir) / "attempt-0" / FS_READS
    if not traced.is_file() or traced.is_symlink():
        return {}
    found: dict[str, str] = {}
    for line in read_bounded(traced, ENTRY_BYTES).decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            path = json.loads(line)["path"]
            if Path(path).is_relative_to(record.workdir) or path in found:
                continue
            if (digest := _file_digest(Path(path))) is not None:
                found[path] = digest
    return found


def _changed_reads(read: Any) -> str | None:
    """The first file the cached reference read whose content is not what it was then."""
    if not isinstance(read, dict):
        return None
    for path, digest in sorted(read.items()):
        if _file_digest(Path(str(path))) != digest:
            return str(path)
    return None


def _owner(top: Folder, name: str) -> int | None:
    """Who owns the entry ``name`` (None: there is none), its link not followed."""
    try:
        return os.stat(name, dir_fd=top.fd, follow_symlinks=False).st_uid
    except FileNotFoundError:
        return None


def _prune(top: Folder, job: JobSpec) -> None:
    """Keep the newest ``KEEP_PER_JOB`` entries of this job's name; the rest go (links among them
    too), but never another user's."""
    stem = _entry_name(job, "")
    mine = []
    for child in os.scandir(top.fd):
        if _owner(top, child.name) not in (None, os.getuid()):
            continue
        if child.name.startswith(stem) and len(child.name) == len(stem) + 32:
            with contextlib.suppress(OSError):
                mine.append((child.stat(follow_symlinks=False).st_mtime_ns, child.name))
    for _, name in sorted(mine, reverse=True)[KEEP_PER_JOB:]:
        with contextlib.suppress(OSError):
            top.remove(name)

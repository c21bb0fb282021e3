"""The checkpoints kept for the state diff: copied as they appear, bounded, identical files once.

A trainer rotates its checkpoints away, so the state diff compares copies taken when each was
reported: every checkpoint of the uninterrupted run, and those a chaos run writes after a resume.
Copies are the harness's own (beside the run's folder, never in it), taken through link-refusing
fds, whole or not at all, and only of the version the event reported.

They cost disk, and a gate makes many: the reference keeps every checkpoint, each chaos run those
after its resume. Two bounds hold that: a checkpoint over ``KEEP_BYTES`` is not kept (said in the
verdict), and the session's copies share one budget (``KeptCopies``: a quarter of the disk that
was free when the first was kept); a checkpoint past it is not kept, and the verdict says so. And a
file the session already kept with the same bytes (a resume that was right writes the reference's
bytes again; a framework's config and tokenizer files repeat in every checkpoint) is kept once: the
later copy becomes a hard link to the first, which costs nothing and tells the diff the two are
equal without reading either.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ...safety.safefs import UnsafeFile, open_beneath, regular_files

KEPT_SUFFIX = ".kept"
KEEP_BYTES = 256 << 20  # a checkpoint larger than this is not kept: said, not compared
KEEP_DISK_FRACTION = 0.25  # of the disk free when the session keeps its first copy: all its copies together
TOO_BIG = ".too-big"  # beside a checkpoint not kept for its own size
OVER_BUDGET = ".over-budget"  # beside one not kept because the session's copies reached their budget


class KeptCopies:
    """One session's kept copies: their budget, and the files kept so far by content, so an
    identical one is linked rather than copied again. Shared by the plans a scenario runs at once."""

    def __init__(self, budget_bytes: int | None = None) -> None:
        self.budget = budget_bytes  # None: measured on the first copy's disk
        self.used = 0  # bytes of distinct content kept now
        self.shared = 0  # bytes kept as links to an identical copy, so far
        self._by_content: dict[tuple[int, bytes], list[Path]] = {}  # (size, sha256) -> its kept names
        self._lock = threading.Lock()

    def admit(self, folder: Path, paths: list[Path], sizes: list[int], digests: list[bytes]) -> bool:
        """Account for a checkpoint just copied to ``folder``: each file the session already holds
        becomes a link to it; the rest must fit the budget, or the caller drops the copy."""
        with self._lock:
            if self.budget is None:
                free = shutil.disk_usage(folder).free
                self.budget = int((free + sum(sizes)) * KEEP_DISK_FRACTION)
            fresh = 0
            linked: list[tuple[Path, Path, int]] = []
            for path, size, digest in zip(paths, sizes, digests, strict=True):
                earlier = next((p for p in self._by_content.get((size, digest), []) if _same_file_still(p, size)), None)
                if earlier is not None:
                    linked.append((path, earlier, size))
                else:
                    fresh += size
            if self.used + fresh > self.budget:
                return False
            for path, earlier, size in linked:
                if _link_over(earlier, path):
                    self.shared += size
            for path, size, digest in zip(paths, sizes, digests, strict=True):
                self._by_content.setdefault((size, digest), []).append(path)
            self.used += fresh
            return True

    def forget(self, folder: Path) -> None:
        """A run's kept folder was removed: its copies no longer count, nor serve as a link's source."""
        with self._lock:
            for key in list(self._by_content):
                left = [p for p in self._by_content[key] if not p.is_relative_to(folder)]
                if not left:
                    del self._by_content[key]
                    self.used -= key[0]
                else:
                    self._by_content[key] = left

    def describe(self) -> dict[str, int | None]:
        return {"budget_bytes": self.budget, "kept_bytes": self.used, "shared_bytes": self.shared}


def _same_file_still(path: Path, size: int) -> bool:
    """An earlier copy may have gone with its run's folder (a passing run's is removed)."""
    try:
        return os.lstat(path).st_size == size
    except OSError:
        return False


def _link_over(earlier: Path, path: Path) -> bool:
    """``path`` (the harness's own fresh copy) replaced by a hard link to ``earlier`` (another of
    its own copies with the same bytes), atomically; on any error the copy stays."""
    spare = path.with_name(f".link-{path.name}")
    try:
        os.link(earlier, spare, follow_symlinks=False)
        os.replace(spare, path)
    except OSError:
        spare.unlink(missing_ok=True)
        return False
    return True


def kept_dir(workdir: Path | str) -> Path:
    """Where a run's kept checkpoints go: beside its folder, not in it, so no job (nor a container,
    which gets only the run's folder) can plant a link where the harness writes its copies."""
    workdir = Path(workdir)
    return workdir.parent / f"{workdir.name}{KEPT_SUFFIX}"


def keep(event: dict[str, Any], attempt: int, checkpoints: Path, into: Path, copies: KeptCopies | None = None) -> None:
    """Copy the checkpoint a ``checkpoint`` event reports (a file, or a folder of files) to
    ``into/a<attempt>-s<step>/``: regular files only, no link followed, only from inside the run's
    checkpoint directory, whole or not at all (the job may rotate it away while it is copied), and
    within the session's budget (``copies``)."""
    if event.get("reason") == "observed" and "stored" not in event:
        return  # a log-adapter checkpoint credited to the step printed when it was seen: timing, not content
    parsed = urlparse(event.get("uri", ""))
    if parsed.scheme not in ("", "file"):
        return  # S3 objects are not kept
    path = Path(os.path.normpath(unquote(parsed.path) or "."))
    if not path.is_absolute() or not path.is_relative_to(checkpoints) or path == checkpoints:
        return
    # a log-adapter checkpoint by the key it stores (its step is re-credited once the uninterrupted
    # run has taught the convention), a probe's by its step
    label = f"k{event['stored']}" if "stored" in event else f"s{event['step']}"
    final = into / f"a{attempt}-{label}"
    if final.exists():
        return
    partial = into / f".partial-{final.name}"
    try:
        partial.mkdir()  # refuses anything already there, a link included
    except OSError:
        return
    try:
        folder = path.is_dir() and not path.is_symlink()
        files = regular_files(path) if folder else [path]
        total = 0
        names: list[Path] = []
        sizes: list[int] = []
        digests: list[bytes] = []
        for file in files:
            fd = open_beneath(checkpoints, file.relative_to(checkpoints))
            with os.fdopen(fd, "rb") as source:
                before = os.fstat(source.fileno())
                if rewritten(event, before, in_folder=folder):
                    raise Rewritten
                total += before.st_size
                if total > KEEP_BYTES:
                    (into / f"{final.name}{TOO_BIG}").write_text(str(total))
                    raise OverflowError
                name = file.relative_to(path) if path.is_dir() else Path(file.name)
                (partial / name).parent.mkdir(parents=True, exist_ok=True)
                with open(partial / name, "xb") as target:
                    digests.append(_copy_hashing(source, target))
                if os.fstat(source.fileno()).st_mtime_ns != before.st_mtime_ns:
                    raise Rewritten  # written to while it was copied
                names.append(name)
                sizes.append(before.st_size)
        partial.rename(final)
    except (OSError, UnsafeFile, OverflowError, ValueError, Rewritten):
        shutil.rmtree(partial, ignore_errors=True)
        return
    if copies is not None and not copies.admit(final, [final / n for n in names], sizes, digests):
        shutil.rmtree(final, ignore_errors=True)
        (into / f"{final.name}{OVER_BUDGET}").write_text(str(total))


def _copy_hashing(source: Any, target: Any) -> bytes:
    h = hashlib.sha256()
    for block in iter(lambda: source.read(1 << 20), b""):
        h.update(block)
        target.write(block)
    return h.digest()


class Rewritten(Exception):
    """The checkpoint file was saved over after the event that reported it: what could be copied
    now is another step's state, and comparing it as this step's would be a false alarm (a plain
    script that overwrites one ``ckpt.pt``, its copy taken late on a loaded machine)."""


MTIME_SLACK_NS = 50_000_000  # file times are coarser than time.time(): a file saved just before its event


def rewritten(event: dict[str, Any], info: os.stat_result, *, in_folder: bool = False) -> bool:
    """Whether the file is no longer the version the event reported: the log adapter says which
    version it read (``mtime_ns``); a probe's one-file checkpoint is reported after its save, at
    ``t``, so a file modified after that is a later save. (A checkpoint folder's files may be
    finished after its event, by a framework's callbacks: its new folder per save is the norm.)"""
    if isinstance(event.get("mtime_ns"), int):
        return info.st_mtime_ns != event["mtime_ns"]
    if in_folder:
        return False
    t = event.get("t")
    return isinstance(t, int | float) and info.st_mtime_ns > int(t * 1e9) + MTIME_SLACK_NS


def not_kept(kept: Path) -> dict[str, list[str]]:
    """The checkpoints of a run that were not kept, and so not compared: those a resumed attempt
    wrote over ``KEEP_BYTES`` (``too_big``), and any of the run's past the session's budget."""
    if not kept.is_dir():
        return {"too_big": [], "over_budget": []}
    too_big = sorted(p.name.removesuffix(TOO_BIG) for p in kept.glob(f"a*{TOO_BIG}") if not p.name.startswith("a0-"))
    over = sorted(p.name.removesuffix(OVER_BUDGET) for p in kept.glob(f"a*{OVER_BUDGET}"))
    return {"too_big": too_big, "over_budget": over}


def too_big(kept: Path) -> list[str]:
    """The checkpoints a run wrote after a resume that were over KEEP_BYTES: not kept, not compared."""
    return not_kept(kept)["too_big"]

"""Checkpoint damage: each fault is a small named object that damages one checkpoint.

The target is always a checkpoint the harness's own run reported durable (a ``checkpoint``
event), inside the run's own checkpoint directory: the harness never touches anything else.
A checkpoint is a directory of files (or a single file); ``manifest.json`` inside it and a
``latest`` pointer beside it are recognised when present.

The job wrote every one of those files and is untrusted: a fault changes only regular files
with a single name, opened beneath the run's checkpoint directory without following any link
(:mod:`spotchaos.safety.safefs`). A checkpoint that holds a symbolic link, a hard link or a special
file is refused as a whole before anything is changed (:class:`UnsafeCheckpoint`). The check is
no licence to act by path afterwards: a helper of the job can swap a folder for a link between
the check and the fault, so every unlink, rename, copy and write goes through the fds of folders
opened beneath the run's checkpoint directory (``dir_fd=``), and a link swapped in is refused, or
its target never reached.

Where a fault needs a choice (which file, which byte), it takes a ``pick`` in [0, 1) from the
plan, so hypothesis chooses and shrinks it and the damage replays exactly.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from ..safety.safefs import Folder, UnsafeFile, describe_link, links_below, links_between, regular_files

MANIFEST = "manifest.json"
DIGEST_VALUE = re.compile(r'"(crc32c|crc32|sha256|sha1|md5|digest|hash|checksum)"\s*:\s*"([0-9a-fA-F]+)"')
LATEST = "latest"
HEADER_BYTES = 64


class UnsafeCheckpoint(UnsafeFile):
    """A checkpoint to damage holds a link or a special file: refused, nothing touched."""


@dataclass
class Damage:
    """What a fault did, for the verdict and the report."""

    fault: str
    checkpoint: str  # the checkpoint's path
    file: str | None = None  # the file touched, relative to the checkpoint
    detail: str = ""
    makes_unloadable: bool = True  # False: the checkpoint itself stays intact (a stale pointer)
    needs_rollback: bool = True  # the job must say it skipped it (False when nothing is left to skip)
    previous: str | None = None  # the checkpoint a pointer fault points at instead
    applied: bool = True  # False: nothing to damage yet (the detail says why)
    damaged_step: int | None = None  # step of the damaged checkpoint (filled in by the engine)
    expected_resume: int | None = None  # the step the next attempt must resume after (None: start over)


@dataclass(frozen=True)
class CheckpointSet:
    """The run's durable checkpoints, oldest first, that still exist on disk, below ``root`` (the
    run's own checkpoint directory, which the harness made)."""

    paths: tuple[Path, ...]
    root: Path | None = None  # None: the newest checkpoint's parent

    @property
    def base(self) -> Path:
        return self.root if self.root is not None else self.newest.parent

    @property
    def newest(self) -> Path:
        return self.paths[-1]

    @property
    def previous(self) -> Path | None:
        return self.paths[-2] if len(self.paths) > 1 else None

    def verify(self) -> None:
        """Refuse the whole set when a checkpoint a fault may touch (the newest, the previous one
        a pointer or a swap uses, the ``latest`` pointer) holds a link or a special file."""
        targets = [p for p in (self.newest, self.previous, self.newest.parent / LATEST) if p is not None]
        for target in targets:
            try:
                bad = next(links_between(self.base, target), None) or next(links_below(target), None)
            except FileNotFoundError:
                continue
            if bad is not None:
                path, what = bad
                shown = path.relative_to(self.base) if path != self.base else path
                raise UnsafeCheckpoint(
                    f"checkpoint {target.name} holds {shown}, {what}: spotchaos damages only "
                    "regular files inside the run's own checkpoint directory and never follows a link the job made, "
                    "so it refuses this checkpoint and touches nothing"
                )

    def folder(self) -> Folder:
        """The base folder, opened without following a link: every change goes through it."""
        return Folder.open(self.base)

    def relative(self, path: Path) -> Path:
        return path.relative_to(self.base)

    def open(self, path: Path, flags: int = os.O_RDWR) -> int:
        """An fd of ``path`` (below the base), opened without following any link; one name only."""
        with self.folder() as base:
            return base.open_file(self.relative(path), flags, single_link=True)

    def unlink(self, path: Path) -> None:
        """Remove one file below the base, through folder fds (a link is removed, never followed)."""
        with self.folder() as base:
            base.unlink(self.relative(path))

    def newest_is_folder(self) -> bool:
        """Whether the newest checkpoint is a folder (else a file); a link or a special file there
        (swapped in since :meth:`verify`) is refused."""
        with self.folder() as base:
            mode = base.mode(self.relative(self.newest))
        if stat.S_ISLNK(mode):
            raise UnsafeCheckpoint(f"{self.newest} is a symbolic link ({describe_link(self.newest)}): refused")
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise UnsafeCheckpoint(f"{self.newest} is neither a file nor a folder: refused")
        return stat.S_ISDIR(mode)

    def is_regular(self, path: Path) -> bool:
        """Whether ``path`` is a regular file, reached through folder fds; a link on the way is refused."""
        try:
            with self.folder() as base:
                return stat.S_ISREG(base.mode(self.relative(path)))
        except FileNotFoundError:
            return False

    def read(self, path: Path) -> bytes:
        fd = self.open(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def rewrite(self, path: Path, data: bytes) -> None:
        """Replace ``path``'s content in place, through an fd that followed no link."""
        fd = self.open(path)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)

    @staticmethod
    def files_of(checkpoint: Path) -> list[Path]:
        return regular_files(checkpoint)

    @classmethod
    def data_files_of(cls, checkpoint: Path) -> list[Path]:
        files = cls.files_of(checkpoint)
        return [f for f in files if f.name != MANIFEST] or files


class CheckpointFault(Protocol):
    """Damages the newest of ``checkpoints``; raises ValueError when there is nothing it can damage."""

    @property
    def name(self) -> str: ...

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage: ...


def _choose(items: list[Path], pick: float) -> Path:
    if not items:
        raise ValueError("the checkpoint holds no file to damage")
    return items[min(int(pick * len(items)), len(items) - 1)]


def _rel(path: Path, checkpoint: Path) -> str:
    return path.name if checkpoint.is_file() else str(path.relative_to(checkpoint))


@dataclass(frozen=True)
class Truncate:
    """Cut a data file: to zero bytes, to half, or by its last byte (a torn write)."""

    to: str  # "zero" | "half" | "one-byte"
    KINDS: ClassVar[tuple[str, ...]] = ("zero", "half", "one-byte")

    @property
    def name(self) -> str:
        return f"truncate-{self.to}"

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        target = _choose(CheckpointSet.data_files_of(checkpoints.newest), pick)
        fd = checkpoints.open(target)
        try:
            size = os.fstat(fd).st_size
            new = {"zero": 0, "half": size // 2, "one-byte": max(size - 1, 0)}[self.to]
            os.ftruncate(fd, new)
        finally:
            os.close(fd)
        return Damage(self.name, str(checkpoints.newest), _rel(target, checkpoints.newest), f"{size} -> {new} bytes")


@dataclass(frozen=True)
class FlipBits:
    """Flip one bit, or a burst of bytes, in the tensor data or in the header of a file."""

    region: str  # "data" | "header"
    burst: int = 1  # bytes inverted; 1 flips a single bit

    @property
    def name(self) -> str:
        return f"flip-{'bit' if self.burst == 1 else 'burst'}-{self.region}"

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        files = CheckpointSet.data_files_of(checkpoints.newest)
        target = _choose(files, pick)
        fd = checkpoints.open(target)
        try:
            size = os.fstat(fd).st_size
            if not size:
                raise ValueError(f"{target} is empty: nothing to flip")
            if self.region == "header":
                offset = int(pick * min(HEADER_BYTES, size))
            else:  # the middle half of the file, where a zip's tensor storage lives
                offset = size // 4 + int(pick * (size // 2))
            offset = min(offset, size - 1)
            data = bytearray(os.pread(fd, min(self.burst, size - offset), offset))
            if self.burst == 1:
                data[0] ^= 1 << int(pick * 8 % 8)
            else:
                data = bytearray(b ^ 0xFF for b in data)
            os.pwrite(fd, bytes(data), offset)
        finally:
            os.close(fd)
        detail = f"{'bit' if self.burst == 1 else f'{self.burst} bytes'} at offset {offset}"
        return Damage(self.name, str(checkpoints.newest), _rel(target, checkpoints.newest), detail)


@dataclass(frozen=True)
class DeleteNewest:
    name: str = field(default="delete-newest", init=False)

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        newest = checkpoints.newest
        checkpoints.newest_is_folder()  # refuses a link swapped in since the check
        with checkpoints.folder() as base:
            base.remove(checkpoints.relative(newest))  # links inside removed, never what they point at
        return Damage(self.name, str(newest), detail="the whole checkpoint", needs_rollback=False)


@dataclass(frozen=True)
class DamageManifest:
    """Delete the manifest, or corrupt it (a digest that no longer matches)."""

    how: str  # "delete" | "corrupt"

    @property
    def name(self) -> str:
        return f"{self.how}-manifest"

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        if not checkpoints.newest_is_folder():  # a one-file checkpoint: no folder to hold a manifest
            raise ValueError(f"{checkpoints.newest.name} is one file: it holds no {MANIFEST}")
        manifest = checkpoints.newest / MANIFEST
        if not checkpoints.is_regular(manifest):
            raise ValueError(f"{checkpoints.newest} has no {MANIFEST}")
        if self.how == "delete":
            checkpoints.unlink(manifest)
        else:
            text = checkpoints.read(manifest).decode("utf-8", "replace")
            # only a digest's digits: a flipped hex letter in a key ("format") is damage no loader checks
            positions = [i for m in DIGEST_VALUE.finditer(text) for i in range(m.start(2), m.end(2))]
            if not positions:
                raise ValueError(f"{manifest} holds no digest to corrupt")
            index = positions[min(int(pick * len(positions)), len(positions) - 1)]
            text = text[:index] + ("0" if text[index] != "0" else "1") + text[index + 1 :]
            checkpoints.rewrite(manifest, text.encode())
        return Damage(self.name, str(checkpoints.newest), MANIFEST)


@dataclass(frozen=True)
class DropFile:
    """Delete one data file of a multi-file checkpoint (a partial upload or copy)."""

    name: str = field(default="drop-file", init=False)

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        target = _choose(CheckpointSet.data_files_of(checkpoints.newest), pick)
        checkpoints.unlink(target)
        return Damage(self.name, str(checkpoints.newest), _rel(target, checkpoints.newest))


@dataclass(frozen=True)
class SwapOlder:
    """Put the previous checkpoint's valid content under the newest one's name."""

    name: str = field(default="swap-older", init=False)

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        newest, previous = checkpoints.newest, checkpoints.previous
        if previous is None:
            raise ValueError("swap-older needs two checkpoints")
        if checkpoints.newest_is_folder():
            _replace_with_copy(checkpoints, previous, newest)
        else:
            checkpoints.rewrite(newest, checkpoints.read(previous))
        return Damage(self.name, str(newest), detail=f"content of {previous.name}")


def _replace_with_copy(checkpoints: CheckpointSet, source: Path, target: Path) -> None:
    """``target`` replaced by a copy of ``source``: copied beside it under a new name first, so a
    copy that fails (a read-only folder, a full disk) leaves the checkpoint as it was and nothing
    behind, then the old one removed and the copy renamed into its place, all through fds."""
    temporary = target.with_name(f".spotchaos-swap-{target.name}")
    with checkpoints.folder() as base:
        try:
            base.copy_tree(checkpoints.relative(source), checkpoints.relative(temporary))
            base.remove(checkpoints.relative(target))
        except BaseException:
            with contextlib.suppress(OSError):
                base.remove(checkpoints.relative(temporary))
            raise
        base.rename(checkpoints.relative(temporary), checkpoints.relative(target))


@dataclass(frozen=True)
class LatestPointer:
    """Make the ``latest`` pointer stale (names the previous checkpoint) or torn (half written).

    The checkpoints themselves stay intact: the job must still resume from the newest one.
    """

    how: str  # "stale" | "torn"

    @property
    def name(self) -> str:
        return f"{self.how}-latest"

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        pointer = checkpoints.newest.parent / LATEST
        if not checkpoints.is_regular(pointer):
            raise ValueError(f"no {LATEST} pointer beside {checkpoints.newest.name}")
        if self.how == "stale":
            previous = checkpoints.previous
            if previous is None:
                raise ValueError("stale-latest needs two checkpoints")
            checkpoints.rewrite(pointer, (previous.name + "\n").encode())
            return Damage(
                self.name,
                str(checkpoints.newest),
                LATEST,
                makes_unloadable=False,
                needs_rollback=False,
                previous=str(previous),
            )
        text = checkpoints.read(pointer)
        checkpoints.rewrite(pointer, text[: max(1, len(text) // 2)])
        return Damage(self.name, str(checkpoints.newest), LATEST, makes_unloadable=False, needs_rollback=False)


CHECKPOINT_FAULTS: dict[str, CheckpointFault] = {
    fault.name: fault
    for fault in (
        *(Truncate(kind) for kind in Truncate.KINDS),
        FlipBits("data"),
        FlipBits("header"),
        FlipBits("data", burst=16),
        FlipBits("header", burst=16),
        DeleteNewest(),
        DamageManifest("delete"),
        DamageManifest("corrupt"),
        DropFile(),
        SwapOlder(),
        LatestPointer("stale"),
        LatestPointer("torn"),
    )
}

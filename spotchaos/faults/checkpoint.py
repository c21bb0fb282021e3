"""Checkpoint damage: each fault is a small named object that damages one checkpoint.

The target is always a checkpoint the harness's own run reported durable (a ``checkpoint``
event), inside the run's own checkpoint directory: the harness never touches anything else.
A checkpoint is a directory of files (or a single file); ``manifest.json`` inside it and a
``latest`` pointer beside it are recognised when present.

Where a fault needs a choice (which file, which byte), it takes a ``pick`` in [0, 1) from the
plan, so hypothesis chooses and shrinks it and the damage replays exactly.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

MANIFEST = "manifest.json"
DIGEST_VALUE = re.compile(r'"(crc32c|crc32|sha256|sha1|md5|digest|hash|checksum)"\s*:\s*"([0-9a-fA-F]+)"')
LATEST = "latest"
HEADER_BYTES = 64


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
    """The run's durable checkpoints, oldest first, that still exist on disk."""

    paths: tuple[Path, ...]

    @property
    def newest(self) -> Path:
        return self.paths[-1]

    @property
    def previous(self) -> Path | None:
        return self.paths[-2] if len(self.paths) > 1 else None

    @staticmethod
    def files_of(checkpoint: Path) -> list[Path]:
        if checkpoint.is_file():
            return [checkpoint]
        return sorted(p for p in checkpoint.rglob("*") if p.is_file())

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
        size = target.stat().st_size
        new = {"zero": 0, "half": size // 2, "one-byte": max(size - 1, 0)}[self.to]
        os.truncate(target, new)
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
        data = bytearray(target.read_bytes())
        if not data:
            raise ValueError(f"{target} is empty: nothing to flip")
        if self.region == "header":
            offset = int(pick * min(HEADER_BYTES, len(data)))
        else:  # the middle half of the file, where a zip's tensor storage lives
            offset = len(data) // 4 + int(pick * (len(data) // 2))
        offset = min(offset, len(data) - 1)
        if self.burst == 1:
            data[offset] ^= 1 << int(pick * 8 % 8)
        else:
            for i in range(offset, min(offset + self.burst, len(data))):
                data[i] ^= 0xFF
        target.write_bytes(bytes(data))
        detail = f"{'bit' if self.burst == 1 else f'{self.burst} bytes'} at offset {offset}"
        return Damage(self.name, str(checkpoints.newest), _rel(target, checkpoints.newest), detail)


@dataclass(frozen=True)
class DeleteNewest:
    name: str = field(default="delete-newest", init=False)

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        newest = checkpoints.newest
        shutil.rmtree(newest) if newest.is_dir() else newest.unlink()
        return Damage(self.name, str(newest), detail="the whole checkpoint", needs_rollback=False)


@dataclass(frozen=True)
class DamageManifest:
    """Delete the manifest, or corrupt it (a digest that no longer matches)."""

    how: str  # "delete" | "corrupt"

    @property
    def name(self) -> str:
        return f"{self.how}-manifest"

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        manifest = checkpoints.newest / MANIFEST
        if not manifest.is_file():
            raise ValueError(f"{checkpoints.newest} has no {MANIFEST}")
        if self.how == "delete":
            manifest.unlink()
        else:
            text = manifest.read_text()
            # only a digest's digits: a flipped hex letter in a key ("format") is damage no loader checks
            positions = [i for m in DIGEST_VALUE.finditer(text) for i in range(m.start(2), m.end(2))]
            if not positions:
                raise ValueError(f"{manifest} holds no digest to corrupt")
            index = positions[min(int(pick * len(positions)), len(positions) - 1)]
            text = text[:index] + ("0" if text[index] != "0" else "1") + text[index + 1 :]
            manifest.write_text(text)
        return Damage(self.name, str(checkpoints.newest), MANIFEST)


@dataclass(frozen=True)
class DropFile:
    """Delete one data file of a multi-file checkpoint (a partial upload or copy)."""

    name: str = field(default="drop-file", init=False)

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        target = _choose(CheckpointSet.data_files_of(checkpoints.newest), pick)
        target.unlink()
        return Damage(self.name, str(checkpoints.newest), _rel(target, checkpoints.newest))


@dataclass(frozen=True)
class SwapOlder:
    """Put the previous checkpoint's valid content under the newest one's name."""

    name: str = field(default="swap-older", init=False)

    def apply(self, checkpoints: CheckpointSet, pick: float) -> Damage:
        newest, previous = checkpoints.newest, checkpoints.previous
        if previous is None:
            raise ValueError("swap-older needs two checkpoints")
        if newest.is_dir():
            shutil.rmtree(newest)
            shutil.copytree(previous, newest)
        else:
            shutil.copyfile(previous, newest)
        return Damage(self.name, str(newest), detail=f"content of {previous.name}")


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
        if not pointer.is_file():
            raise ValueError(f"no {LATEST} pointer beside {checkpoints.newest.name}")
        if self.how == "stale":
            previous = checkpoints.previous
            if previous is None:
                raise ValueError("stale-latest needs two checkpoints")
            pointer.write_text(previous.name + "\n")
            return Damage(
                self.name,
                str(checkpoints.newest),
                LATEST,
                makes_unloadable=False,
                needs_rollback=False,
                previous=str(previous),
            )
        text = pointer.read_text()
        pointer.write_text(text[: max(1, len(text) // 2)])
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

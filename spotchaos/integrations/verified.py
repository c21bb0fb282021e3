"""Checkpoints a restart can trust: a sha256 of every file written after the save, and a resume
from the newest checkpoint whose files all match.

None of the three frameworks verifies what it loads: transformers' ``get_last_checkpoint``,
Lightning's ``ckpt_path="last"`` and accelerate's ``load_state`` take the newest checkpoint as it
is, so a torn or bit-flipped one is loaded or makes every restart fail (docs/frameworks.md). These
helpers are the fix the integrations offer; each skipped checkpoint is reported to spotchaos as a
rollback. Standard library and :mod:`spotchaos.probe` only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable

from ..probe import Probe

MANIFEST = "checksums.json"  # in a checkpoint folder: the sha256 of every other file
SIDECAR = ".sha256"  # beside a one-file checkpoint: its sha256


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_whole(path: str, text: str) -> None:
    """``text`` at ``path`` or nothing: a temporary file beside it, fsynced, renamed."""
    partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial")
    with open(partial, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def write_checksums(checkpoint: str) -> None:
    """After a save: ``checksums.json`` in a checkpoint folder, or ``NAME.sha256`` beside a file."""
    if os.path.isdir(checkpoint):
        names = sorted(n for n in os.listdir(checkpoint) if n != MANIFEST and not n.startswith("."))
        sums = {n: sha256(os.path.join(checkpoint, n)) for n in names if os.path.isfile(os.path.join(checkpoint, n))}
        _write_whole(os.path.join(checkpoint, MANIFEST), json.dumps(sums))
    else:
        _write_whole(checkpoint + SIDECAR, sha256(checkpoint))


def problem(checkpoint: str, required: str | None = None) -> str | None:
    """Why ``checkpoint`` is not one to resume from, or None when every file matches its checksum
    (``required``: a file a folder's manifest must list, the one its framework writes last)."""
    if not os.path.isdir(checkpoint):
        try:
            with open(checkpoint + SIDECAR) as f:
                expected = f.read().strip()
        except OSError:
            return f"no {os.path.basename(checkpoint)}{SIDECAR}: its save did not finish"
        if not os.path.isfile(checkpoint):
            return f"{os.path.basename(checkpoint)} is missing (its {SIDECAR} is still there)"
        return None if sha256(checkpoint) == expected else "does not match its sha256"
    try:
        with open(os.path.join(checkpoint, MANIFEST)) as f:
            sums = json.load(f)
    except (OSError, ValueError):
        return f"no readable {MANIFEST}: its save did not finish"
    if not isinstance(sums, dict) or (required is not None and required not in sums):
        return f"{MANIFEST} does not list {required}"
    for name, digest in sums.items():
        path = os.path.join(checkpoint, name)
        if not os.path.isfile(path):
            return f"{name} is missing"
        if sha256(path) != digest:
            return f"{name} does not match its sha256"
    return None


def named_step_problem(checkpoint: str, held: object, named: int, what: str = "step") -> str | None:
    """Why a checkpoint named after step ``named`` is not that step's (an older checkpoint copied
    whole under the newest name matches its own checksums); None when what it holds agrees. For
    ``newest_verified``'s ``named`` check, each framework reading ``held`` its own way."""
    return None if held == named else f"it holds {what} {held} under the name {os.path.basename(checkpoint)}"


REJECTED = ".rejected-"  # the prefix a checkpoint that failed verification is renamed with


def newest_verified(
    candidates: Iterable[str],
    required: str | None = None,
    *,
    set_aside: bool = True,
    named: Callable[[str], str | None] | None = None,
) -> str | None:
    """The first of ``candidates`` (newest first) that verifies; each one before it is reported to
    spotchaos as a rollback and, with ``set_aside``, renamed ``.rejected-NAME`` (kept for a look,
    out of the way of the save that will write that step again). ``named``: the framework's own
    check that a checkpoint holds what its name says (checksums cannot: an older checkpoint copied
    whole matches its own). None when none verifies."""
    probe = Probe.from_env()
    try:
        for checkpoint in candidates:
            why = problem(checkpoint, required) or (named(checkpoint) if named is not None else None)
            if why is None:
                return checkpoint
            probe.rollback(os.path.abspath(checkpoint), why)
            if set_aside:
                _set_aside(checkpoint)
        return None
    finally:
        probe.close()


def _set_aside(checkpoint: str) -> None:
    folder, name = os.path.split(checkpoint)
    for old, new in ((checkpoint, name), (checkpoint + SIDECAR, name + SIDECAR)):
        if os.path.lexists(old):
            os.replace(old, os.path.join(folder, f"{REJECTED}{new}"))

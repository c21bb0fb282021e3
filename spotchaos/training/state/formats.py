"""What a kept checkpoint file holds, for the state diff: each format the frameworks write, read
without running any of the job's code.

Hugging Face ``Trainer`` and accelerate write ``model.safetensors``, ``optimizer.pt``,
``scheduler.pt``, ``rng_state.pth`` (numpy's RNG state inside a torch file), ``trainer_state.json``;
Lightning a ``.ckpt`` (a torch file holding its loops' and callbacks' state); other jobs ``.npy``
and ``.npz`` arrays or a format of their own. Each is read the safe way its format allows:
safetensors through its header and tensors (``safetensors``), numpy files with
``allow_pickle=False``, JSON as JSON, torch files with ``weights_only=True``. A torch file that
needs a full unpickle is the job's confinement's to read (:class:`NeedsConfinement`); a file in
no format read here, or one that does not parse, is compared as bytes (:class:`AsBytes`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ...safety.safefs import open_beneath
from .checkpoint_reader import WEIGHTS_ONLY_REFUSAL

JSON_BYTES = 64 << 20  # a JSON state file larger than this is compared as bytes
# A job's file is hostile input: what reading it may cost is bounded before it is parsed. A
# safetensors header is JSON the library parses whole (a 90 MB one took 109 s and 2.4 GB); an
# .npz member inflates to what its zip entry declares (a 1.5 MB archive grew the harness 1.4 GB).
SAFETENSORS_HEADER_BYTES = 8 << 20
NPZ_INFLATED_BYTES = 256 << 20  # all members together, as declared (zipfile reads no further)
NPZ_RATIO = 64  # and at most this many times the archive's own size
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip format
PICKLE_MAGIC = b"\x80"  # torch.save's legacy (non-zip) format starts with a pickle protocol byte


class AsBytes(Exception):
    """The file is in no format read here, or it does not parse as its name says: its bytes are
    what is compared (never an error of the scenario)."""


class NeedsConfinement(Exception):
    """A torch file that ``weights_only=True`` refused: only the job's confinement may load it."""


def same_bytes(a: Path, b: Path) -> bool:
    """Whether two kept files hold the same bytes: identical bytes are identical state, whatever
    the format (and nothing need be parsed, nor a confined helper started). Two names of one file
    (the kept copies link a file the session already holds) are equal without a read."""
    fds = [open_beneath(path.parent, path.name) for path in (a, b)]
    with os.fdopen(fds[0], "rb") as first, os.fdopen(fds[1], "rb") as second:
        x, y = os.fstat(first.fileno()), os.fstat(second.fileno())
        if (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino):
            return True
        if x.st_size != y.st_size:
            return False
        digests = []
        for f in (first, second):
            h = hashlib.sha256()
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                h.update(block)
            digests.append(h.digest())
    return digests[0] == digests[1]


def load_state(path: Path) -> tuple[str, Any]:
    """``(format, content)`` of one kept checkpoint file, opened beneath its folder without
    following a link. Raises :class:`AsBytes` or :class:`NeedsConfinement`."""
    name = path.name.lower()
    if name.endswith(".safetensors"):
        return "safetensors", _safetensors(path)
    if name.endswith((".npy", ".npz")):
        return "numpy", _numpy(path)
    if name.endswith(".json"):
        return "json", _json(path)
    head = b"" if name.endswith(TORCH_SUFFIXES) else _head(path, len(ZIP_MAGIC))
    if name.endswith(TORCH_SUFFIXES) or head == ZIP_MAGIC or head[:1] == PICKLE_MAGIC:
        return "torch", _torch(path)
    raise AsBytes(f"{path.name}: no format of its own is read here")


def _head(path: Path, size: int) -> bytes:
    with os.fdopen(open_beneath(path.parent, path.name), "rb") as f:
        return f.read(size)


def _safetensors(path: Path) -> dict[str, Any]:
    """Every tensor by name, and the header's ``__metadata__`` as entries ``__metadata__.KEY``."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise AsBytes("safetensors is not installed (pip install safetensors)") from None
    fd = open_beneath(path.parent, path.name)
    try:  # through the fd, not the name: the file opened is the file read
        declared = int.from_bytes(os.pread(fd, 8, 0), "little")
        if declared > SAFETENSORS_HEADER_BYTES:
            raise AsBytes(
                f"{path.name}: a safetensors header of {declared:,} bytes is over the "
                f"{SAFETENSORS_HEADER_BYTES >> 20} MiB bound: compared as bytes"
            )
        with safe_open(f"/proc/self/fd/{fd}", framework="pt") as f:
            state: dict[str, Any] = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
            metadata = f.metadata() or {}
    except AsBytes:
        raise
    except Exception as exc:  # SafetensorError: a header or a length that does not add up
        raise AsBytes(f"{path.name} is not a whole safetensors file: {exc}") from None
    finally:
        os.close(fd)
    if metadata:
        state["__metadata__"] = dict(metadata)
    return state


def _numpy(path: Path) -> Any:
    """An ``.npy`` array, or an ``.npz`` archive's arrays by name; never a pickled object array."""
    try:
        import numpy
    except ImportError:
        raise AsBytes("numpy is not installed") from None
    with os.fdopen(open_beneath(path.parent, path.name), "rb") as f:
        if path.name.lower().endswith(".npz"):
            _bounded_archive(f, path.name)
        try:
            loaded = numpy.load(f, allow_pickle=False)
            if hasattr(loaded, "files"):  # an .npz archive
                with loaded:
                    return {name: loaded[name] for name in loaded.files}
            return loaded
        except (ValueError, OSError, EOFError) as exc:  # object arrays need pickle: compared as bytes
            raise AsBytes(f"{path.name}: {exc}") from None


def _bounded_archive(f: Any, name: str) -> None:
    """Refuse an archive whose members would inflate past the bounds (a zip bomb), before any is read."""
    import zipfile

    size = os.fstat(f.fileno()).st_size
    try:
        with zipfile.ZipFile(f) as archive:
            inflated = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise AsBytes(f"{name} is not a whole .npz archive: {exc}") from None
    finally:
        f.seek(0)
    bound = min(NPZ_INFLATED_BYTES, max(size, 1 << 20) * NPZ_RATIO)
    if inflated > bound:
        raise AsBytes(
            f"{name}: its members inflate to {inflated:,} bytes from {size:,}, over the bound of "
            f"{bound:,}: compared as bytes"
        )


def _json(path: Path) -> Any:
    with os.fdopen(open_beneath(path.parent, path.name), "rb") as f:
        data = f.read(JSON_BYTES + 1)
    if len(data) > JSON_BYTES:
        raise AsBytes(f"{path.name} is over {JSON_BYTES >> 20} MiB")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise AsBytes(f"{path.name} is not JSON: {exc}") from None


def _torch(path: Path) -> Any:
    """A weights-only load, memory-mapped where the format allows, so a big checkpoint's tensors
    are paged in as each is digested rather than all read up front. The map goes through the fd
    (``/proc/self/fd``), not the name, and outlives it."""
    from ...extras import require

    torch = require("torch", "torch", "comparing checkpoints")
    fd = open_beneath(path.parent, path.name)
    try:
        try:
            return torch.load(f"/proc/self/fd/{fd}", map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:
            if WEIGHTS_ONLY_REFUSAL in str(exc):
                raise NeedsConfinement(str(exc)[:200]) from None
            if "mmap" not in str(exc) and "zip" not in str(exc).lower() and "/proc" not in str(exc):
                raise AsBytes(f"{path.name} is not a whole torch file: {str(exc)[:200]}") from None
        with os.fdopen(os.dup(fd), "rb") as f:  # the legacy (non-zip) format: read whole
            try:
                return torch.load(f, map_location="cpu", weights_only=True)
            except Exception as exc:
                if WEIGHTS_ONLY_REFUSAL in str(exc):
                    raise NeedsConfinement(str(exc)[:200]) from None
                raise AsBytes(f"{path.name} is not a whole torch file: {str(exc)[:200]}") from None
    finally:
        os.close(fd)

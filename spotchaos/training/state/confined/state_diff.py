"""Which entries of two checkpoints differ, key by key: the state a resume did not restore.

Shared by the harness (files it can load with ``torch.load(weights_only=True)``) and, for
files that need a full unpickle, run as a script inside the job's own confinement (a process
the job's backend starts), like ``load_checkpoint.py``. Standard library and torch only;
``probe.py`` (tensor digests) is loaded by its path.

Usage: python state_diff.py REFERENCE_FILE CHAOS_FILE LIMIT [REFERENCE_RUN CHAOS_RUN]   (one JSON line on stdout)
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

SHOWN_CHARS = 60  # a scalar shown in a difference: ``scheduler.last_epoch: 12 vs 13``
# Plain values named like a moment, a duration, a machine or a process (``saved_at``, ``hostname``,
# ``train_runtime``, ``pid``) differ between any two runs and are rarely state a resume restores:
# still compared (a name proves nothing), their difference suggests the ignore line that would skip it.
VOLATILE = {
    "time",
    "timestamp",
    "date",
    "datetime",
    "host",
    "hostname",
    "pid",
    "runtime",
    "elapsed",
    "duration",
    "seconds",
}
# Words that name a moment or a machine only beside another word (``saved_at``, ``wall_clock``,
# ``node_name``): a key that is just ``at``, ``node`` or ``wall`` may be a position, a graph node
# or a layer, and is compared.
VOLATILE_BESIDE = {"at", "node", "wall"}
VOLATILE_HINT = "named like a moment, a machine or a process"
# Keys whose values are checksums of other bytes (a manifest's): those bytes are compared themselves
CHECKSUM_WORDS = {
    "crc",
    "crc32",
    "crc32c",
    "sha",
    "sha1",
    "sha256",
    "sha512",
    "md5",
    "hash",
    "digest",
    "checksum",
    "etag",
}
# A manifest's size of one of the checkpoint's files (``files.optimizer.pt.bytes``): derived like its
# checksum, since equal state need not serialise to equal bytes (a step counter resumed onto CUDA
# pickles its device's name); the file itself is compared. A size under any other key is state.
FILE_SIZE = re.compile(
    r"\.(?:pt|pth|bin|safetensors|ckpt|npy|npz|json|pkl|pickle|distcp|msgpack|h5|tar)\.(?:bytes|size|nbytes|size_bytes)$"
)


def _digest():
    spec = importlib.util.spec_from_file_location("_spotchaos_probe", Path(__file__).resolve().parents[3] / "probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tensor_digest


SCALARS = (int, float, bool, str, type(None))
RUN_PLACEHOLDER = "{run}"
LITERAL_PLACEHOLDER = "{run:literal}"  # a job's own text "{run}": never equal to a run's folder


def is_array(value: Any) -> bool:
    """A numpy array or numpy scalar (numpy's RNG state, a ``.npy`` file): compared by its bytes,
    never with ``!=`` (whose answer for an array is another array)."""
    return not hasattr(value, "detach") and all(hasattr(value, a) for a in ("dtype", "shape", "tobytes"))


def array_digest(value: Any) -> str:
    """sha256 over dtype, shape and bytes, as ``probe.tensor_digest`` does for tensors."""
    header = f"{value.dtype}|{tuple(value.shape)}|".encode()
    return hashlib.sha256(header + value.tobytes()).hexdigest()


def placed(value: Any, run: str) -> Any:
    """``value`` with the run's own directory replaced by ``{run}``: a path the job recorded (a
    ``best_model_path``, a ``dirpath``) names its own run, which is another folder in each run."""
    if not run:
        return value
    if isinstance(value, str):
        return _place(value, run)
    if isinstance(value, list):
        return [_place(v, run) if isinstance(v, str) else v for v in value]
    return value


def _place(text: str, run: str) -> str:
    return text.replace(RUN_PLACEHOLDER, LITERAL_PLACEHOLDER).replace(run, RUN_PLACEHOLDER)


MAX_DEPTH = 32  # an object graph deeper than this is one leaf (a cycle, say)


def flatten(value: Any, prefix: str = "", run: str = "", depth: int = 0) -> dict[str, Any]:
    """Leaves of nested dicts, lists, tuples and objects' attributes (a pickled ``TrainingArguments``)
    by dotted path (``optimizer.state.3.exp_avg``). A list of plain values (an RNG's state words) is
    one leaf: 625 entries would say nothing more. Keys and values naming the run's own directory
    ``run`` name ``{run}`` instead."""
    if depth > MAX_DEPTH:
        return {prefix or "(value)": repr(value)[:SHOWN_CHARS]}
    if isinstance(value, dict):
        items = [(placed(str(k), run), v) for k, v in value.items()]
    elif _is_object(value):
        items = [(str(k), v) for k, v in vars(value).items() if not str(k).startswith("__")]
    elif isinstance(value, list | tuple) and value and all(isinstance(v, SCALARS) for v in value):
        return {prefix or "(value)": list(value)}
    elif isinstance(value, list | tuple):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return {prefix or "(value)": placed(value, run)}
    leaves: dict[str, Any] = {}
    if not items:
        leaves[prefix or "(value)"] = type(value).__name__ + "()"
    for key, item in items:
        leaves.update(flatten(item, f"{prefix}.{key}" if prefix else key, run, depth + 1))
    return leaves


def _is_object(value: Any) -> bool:
    """An instance whose state is its attributes (a dataclass, a config object): not a tensor, an
    array, an enum member, a class or a function."""
    if hasattr(value, "detach") or is_array(value) or isinstance(value, type) or callable(value):
        return False
    if type(value).__module__ == "enum" or hasattr(type(value), "_member_map_"):
        return False
    return hasattr(value, "__dict__") and isinstance(vars(value), dict)


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{len(value)} values" if isinstance(value, list) else text[: SHOWN_CHARS - 3] + "..."


def diff(
    reference: Any,
    chaos: Any,
    limit: int,
    *,
    exact_floats: bool = True,
    runs: tuple[str, str] = ("", ""),
    within: str = "",
) -> dict[str, Any]:
    """``{"differences": [{"entry", "reference", "chaos"}...], "more": N}``: the first ``limit``
    entries that differ (tensors and numpy arrays bit for bit, by digest; with ``exact_floats``
    off, floating tensors and floats are left to the envelope and not compared). ``runs`` are
    the two runs' own directories, which may appear in either as ``{run}``. ``within`` is the
    file's name: a ``checksums.json`` names checksums by its name alone."""
    digest = None
    a, b = flatten(reference, run=runs[0]), flatten(chaos, run=runs[1])
    found = []
    for entry in sorted(set(a) | set(b)):
        if entry not in a or entry not in b:
            found.append(
                {
                    "entry": entry,
                    "reference": "absent" if entry not in a else "present",
                    "chaos": "absent" if entry not in b else "present",
                }
            )
            continue
        x, y = a[entry], b[entry]
        if hasattr(x, "detach") or hasattr(y, "detach"):
            if not (hasattr(x, "detach") and hasattr(y, "detach")):
                found.append({"entry": entry, "reference": type(x).__name__, "chaos": type(y).__name__})
                continue
            if x.shape != y.shape or x.dtype != y.dtype:
                found.append(
                    {"entry": entry, "reference": f"{x.dtype} {tuple(x.shape)}", "chaos": f"{y.dtype} {tuple(y.shape)}"}
                )
                continue
            if not exact_floats and x.is_floating_point() and x.dim() > 0:
                continue  # weights and moments carry the noise; a 0-d tensor is a counter or a scale
            digest = digest or _digest()
            if digest(x) != digest(y):
                scalar = x.dim() == 0  # a step count kept as a tensor (the optimizer's): show it
                shown = (_show(x.item()), _show(y.item())) if scalar else ("differs", "differs")
                found.append({"entry": entry, "reference": shown[0], "chaos": shown[1]})
            continue
        if is_array(x) or is_array(y):
            difference = _array_difference(x, y, exact_floats)
            if difference is not None:
                found.append({"entry": entry, "reference": difference[0], "chaos": difference[1]})
            continue
        if isinstance(x, SCALARS) and _volatile(_words(entry.rsplit(".", 1)[-1])):
            if type(x) is not type(y) or x != y:  # compared all the same: a name is no proof, only a hint
                found.append({"entry": entry, "reference": _show(x), "chaos": _show(y), "suggest": VOLATILE_HINT})
            continue
        if _names_checksum(f"{within}:{entry}") and _hex_digest(x) and _hex_digest(y):
            continue  # a checksum of a file (a manifest's): the file itself is compared, and equal
            # state need not serialise to equal bytes
        if FILE_SIZE.search(entry) and _count(x) and _count(y):
            continue  # a file's size: the file is compared itself
        if not exact_floats and isinstance(x, float) and isinstance(y, float):
            continue  # envelope mode: numbers within the noise
        if type(x) is not type(y) or x != y:
            if x != x and y != y:  # both NaN
                continue
            found.append({"entry": entry, "reference": _show(x), "chaos": _show(y)})
    for d in found:
        d["rank"] = _rank(a.get(d["entry"], b.get(d["entry"])))
    found.sort(key=lambda d: (d["rank"], d["entry"]))
    return {"differences": found[:limit], "more": max(0, len(found) - limit)}


def _array_difference(x: Any, y: Any, exact_floats: bool) -> tuple[str, str] | None:
    """How two numpy values differ, shown as the tensors' differences are; None when equal."""
    if not (is_array(x) and is_array(y)):
        return type(x).__name__, type(y).__name__
    if x.shape != y.shape or x.dtype != y.dtype:
        return f"{x.dtype} {tuple(x.shape)}", f"{y.dtype} {tuple(y.shape)}"
    if not exact_floats and x.dtype.kind in "fc" and len(x.shape) > 0:
        return None
    if array_digest(x) == array_digest(y):
        return None
    if len(x.shape) == 0:
        return _show(x.item()), _show(y.item())
    return "differs", "differs"


def _words(key: str) -> list[str]:
    """``saved_at``: ``["saved", "at"]``."""
    return [w for w in re.split(r"[^a-z0-9]+", key.lower()) if w]


def _names_checksum(entry: str) -> bool:
    """Whether the file or a key on the entry's path names checksums (``checksums.json:model.pt``,
    ``files.model.pt.crc32c``, ``digests.0.weight``): a hex string elsewhere (a sample cursor, a
    seed) is state."""
    return any(w in CHECKSUM_WORDS or w.removesuffix("s") in CHECKSUM_WORDS for w in _words(entry))


def _volatile(words: list[str]) -> bool:
    """A key named like a moment, a duration, a machine or a process: a strong word anywhere, or a
    weak one (``at``, ``node``, ``wall``) beside another word."""
    named = set(words)
    return bool(VOLATILE & named) or (len(named) > 1 and bool(VOLATILE_BESIDE & named))


def _hex_digest(value: Any) -> bool:
    """A checksum of other bytes (a manifest's crc32c or sha256): it differs whenever they do."""
    return isinstance(value, str) and len(value) >= 8 and all(c in "0123456789abcdef" for c in value.lower())


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rank(value: Any) -> int:
    """Causes before consequences: counters and RNG states first (a step count, an epoch, a
    scheduler's last_epoch, RNG words), then integer tensors, strings (digests of other files),
    and last the floats and floating tensors every divergence drags along."""
    if hasattr(value, "detach"):
        return 3 if value.is_floating_point() and value.dim() > 0 else 1
    if is_array(value):
        return 3 if value.dtype.kind in "fc" and len(value.shape) > 0 else 1
    if isinstance(value, str):
        return 2
    if isinstance(value, float):
        return 3  # a logged loss or norm: a consequence, as floating tensors are
    return 0


def main(argv: list[str]) -> int:
    reference, chaos, limit = argv[1], argv[2], int(argv[3])
    runs = (argv[4], argv[5]) if len(argv) > 5 else ("", "")
    try:  # a script run by path beside it, or a module of the package
        from load_checkpoint import answer, full_load
    except ImportError:
        from .load_checkpoint import answer, full_load
    return answer(lambda: diff(full_load(reference), full_load(chaos), limit, runs=runs))


if __name__ == "__main__":
    # its answer written, nothing is left to finalize: leave without the interpreter's teardown, which
    # in a child forked from the job's warm interpreter touches every preloaded object (0.2-0.6 s)
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

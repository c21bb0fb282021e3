"""What a job's checkpoint file holds (its stored step, its weights' digests), read without
running any of the job's code in the harness.

A checkpoint is a pickle the job wrote, and unpickling runs whatever code the file names: a
hostile or buggy job could run code as the harness's user (root in CI), outside its container.
So the harness opens the file without following links and loads it with
``torch.load(weights_only=True)``, which accepts tensors and plain containers only. A file that
needs more (numpy RNG state, a custom class) is read by ``confined/load_checkpoint.py`` in a
process the job's own backend starts: the job's confinement, never the pytest process.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...backends.base import Backend, LaunchSpec
from ...errors import JobError
from ...extras import require
from ...safety.safefs import open_beneath, read_text_bounded
from .confined.load_checkpoint import summarize

PACKAGE_DIR = Path(__file__).resolve().parent
LOADER = PACKAGE_DIR / "confined" / "load_checkpoint.py"
DIFFER = PACKAGE_DIR / "confined" / "state_diff.py"
CONFINED_TIMEOUT_SECONDS = 300.0
ANSWER_BYTES = 1 << 20
WEIGHTS_ONLY_REFUSAL = "Weights only load failed"


class NeedsFullUnpickle(JobError):
    """``torch.load(weights_only=True)`` refused the file: only the job's confinement may read it."""


ConfinedLoad = Callable[[Path, "str | None", "str | None"], dict[str, Any]]


def read_checkpoint(
    path: Path,
    step_key: str | None,
    final_key: str | None,
    confined: ConfinedLoad | None = None,
    root: Path | None = None,
) -> dict[str, Any]:
    """``{"step", "digests", "keys"}`` of the checkpoint at ``path`` (see ``summarize``), opened
    beneath ``root`` (default: its own folder) without following any link.

    Raises :class:`~spotchaos.safety.safefs.UnsafeFile` for a link or a special file, ``OSError`` when
    it is missing, and whatever ``torch.load`` raises on a file that is not (yet) whole.
    """
    torch = require("torch", "torch", "reading a log-adapter job's checkpoints")
    root = path.parent if root is None else root
    with os.fdopen(open_beneath(root, path.relative_to(root)), "rb") as f:
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            if WEIGHTS_ONLY_REFUSAL not in str(exc):
                raise
            if confined is None:
                raise NeedsFullUnpickle(
                    f"{path.name} needs a full unpickle (it holds more than tensors and plain containers), and "
                    "spotchaos never unpickles a job's file in its own process"
                ) from None
            return confined(path, step_key, final_key)
    return summarize(state, step_key, final_key)


@dataclass(frozen=True)
class Confinement:
    """Where a helper runs as the job itself would: its environment, working folder and mounts."""

    env: dict[str, str]
    cwd: Path
    writable: tuple[Path, ...]
    readable: tuple[Path, ...] = ()  # mounted read-only for the helper (the kept checkpoints it compares)
    in_container: bool = False
    start_env: dict[str, str] | None = None  # the job's warm interpreter forks the helper too, where it has one
    preload: tuple[str, ...] = ()


class ConfinedLoader:
    """Runs ``load_checkpoint.py`` through the job's backend, with the job's environment and
    mounts: a subprocess for a local job, a container of its image for a container job."""

    def __init__(self, backend: Backend, confinement: Confinement, folder: Path) -> None:
        self.backend = backend
        self.confinement = confinement
        self.python = "python" if confinement.in_container else sys.executable
        self.folder = folder  # where each helper's output goes
        self.runs = 0
        self.start_kinds: list[str] = []  # each helper's start, "warm" or "cold: why"

    def __call__(self, path: Path, step_key: str | None, final_key: str | None) -> dict[str, Any]:
        return _validated(*self._run(LOADER, (str(path), step_key or "", final_key or "")), path)

    def diff(self, reference: Path, chaos: Path, limit: int, runs: tuple[str, str] = ("", "")) -> dict[str, Any]:
        """``confined/state_diff.py`` on two checkpoint files: which entries differ (``runs``: the two
        runs' own directories, compared as ``{run}``)."""
        text, code = self._run(DIFFER, (str(reference), str(chaos), str(limit), *runs))
        answer = _last_json_line(text)
        if not isinstance(answer, dict):
            return {"error": f"no answer (exit status {code})"}
        if isinstance(answer.get("error"), str):
            return {"error": answer["error"][:500]}
        found = answer.get("differences")
        if not isinstance(found, list) or not all(
            isinstance(d, dict) and all(isinstance(d.get(k), str) for k in ("entry", "reference", "chaos"))
            for d in found
        ):
            return {"error": "its answer is not a list of differences"}
        more = answer.get("more")
        return {"differences": found[:limit], "more": more if isinstance(more, int) and more >= 0 else 0}

    def _run(self, script: Path, args: tuple[str, ...]) -> tuple[str, int | None]:
        """Run a confined helper script through the job's backend: its stdout and exit status."""
        self.runs += 1
        out = self.folder / f"confined-{script.stem}-{self.runs}.out"
        where = self.confinement
        spec = LaunchSpec(
            argv=(self.python, str(script), *args),
            env=where.env,
            cwd=where.cwd,
            stdout_path=out,
            stderr_path=out.with_suffix(".err"),
            grace_seconds=1.0,
            writable=where.writable,
            readable=(PACKAGE_DIR, *where.readable),
            start_env=where.start_env,
            preload=where.preload,
        )
        handle = self.backend.start(spec)
        self.start_kinds.append(handle.start_kind)
        try:
            code = handle.wait(CONFINED_TIMEOUT_SECONDS)
        finally:
            handle.cleanup()
        if code is None:
            raise JobError(
                f"{script.name} on {args[0]} in the job's confinement took over {CONFINED_TIMEOUT_SECONDS:g} s"
            )
        return read_text_bounded(out, ANSWER_BYTES), code


def _last_json_line(text: str) -> Any:
    """A confined helper's answer: its last non-empty line, as JSON (None when it is not JSON)."""
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def _validated(text: str, code: int | None, path: Path) -> dict[str, Any]:
    """The loader's answer, checked like any output of the job (the pickle it read ran code)."""
    answer = _last_json_line(text)
    if not isinstance(answer, dict):
        raise JobError(f"reading {path.name} in the job's confinement gave no answer (exit status {code})")
    if isinstance(answer.get("error"), str):
        raise JobError(f"cannot load {path.name}: {answer['error']}")
    step, digests = answer.get("step"), answer.get("digests")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise JobError(f"reading {path.name} in the job's confinement: step {step!r} is not an integer")
    if digests is not None and not (
        isinstance(digests, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in digests.items())
    ):
        raise JobError(f"reading {path.name} in the job's confinement: its digests are not names and strings")
    keys = answer.get("keys")
    return {
        "step": step,
        "digests": digests,
        "keys": [str(k) for k in keys[:20]] if isinstance(keys, list) else None,
        "holds": str(answer.get("holds", "")),
    }


def tensor_distances(a: Path, b: Path, key: str | None = None) -> dict[str, list[float]]:
    """Per tensor of two saved state dicts (under ``key``, if given): [max absolute difference,
    the tensor's scale (its largest absolute value in ``a``)], for envelope mode. Weights-only
    loads through link-refusing fds; a file that needs more, or holds no state dict, gives
    nothing (the digests still compare)."""
    torch = require("torch", "torch", "measuring how far apart two runs' weights are")
    states = []
    for path in (a, b):
        try:
            with os.fdopen(open_beneath(path.parent, path.name), "rb") as f:
                state = torch.load(f, map_location="cpu", weights_only=True)
        except Exception:
            return {}
        state = state.get(key) if key is not None and isinstance(state, dict) else state
        if not isinstance(state, dict):
            return {}
        states.append(state)
    out = {}
    for name in sorted(set(states[0]) & set(states[1])):
        x, y = states[0][name], states[1][name]
        if not (hasattr(x, "detach") and hasattr(y, "detach")) or x.shape != y.shape or not x.is_floating_point():
            continue
        if not x.numel():
            continue
        out[str(name)] = [float((x.double() - y.double()).abs().max()), float(x.double().abs().max())]
    return out

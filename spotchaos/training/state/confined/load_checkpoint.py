"""Read a checkpoint a job wrote, inside the job's own confinement, and print what it holds.

The harness loads a job's checkpoint files with ``torch.load(weights_only=True)``, which
cannot run code. Some checkpoints need a full unpickle (numpy RNG state, custom classes), and
a full unpickle runs whatever code the file names: that happens only here, in a process the
job's own backend starts (a subprocess like the job's, or a container of the job's image with
the same mounts), never in the pytest process. The answer is one JSON line on stdout, which the
harness validates like any other output of the job.

Standard library and torch only; ``probe.py`` (for the digests) is loaded by its path, so this
runs in any image where the spotchaos package directory is mounted read-only.

Usage: python load_checkpoint.py PATH STEP_KEY FINAL_KEY   (an empty key: not asked for)
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _probe():
    spec = importlib.util.spec_from_file_location("_spotchaos_probe", Path(__file__).resolve().parents[3] / "probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summarize(state: Any, step_key: str | None, final_key: str | None) -> dict[str, Any]:
    """What the harness needs of a loaded checkpoint: the stored step, the weights' digests, the
    top-level keys (for error messages). Shared by the harness (weights-only loads) and this script."""
    summary: dict[str, Any] = {"keys": [str(k) for k in list(state)[:20]] if isinstance(state, dict) else None}
    if step_key is not None:
        value = state.get(step_key) if isinstance(state, dict) else None
        try:
            summary["step"] = int(value) if value is not None and not isinstance(value, bool) else None
        except (TypeError, ValueError):
            summary["step"] = None
    weights = state
    if final_key is not None:
        weights = state.get(final_key) if isinstance(state, dict) else None
    if isinstance(weights, dict):
        tensors = {str(k): v for k, v in weights.items() if hasattr(v, "detach")}
        summary["digests"] = _probe().tensor_digests(tensors)
    else:
        summary["digests"] = None
        summary["holds"] = type(weights).__name__
    return summary


def full_load(path: str) -> Any:
    """A full unpickle, on purpose: this process is the job's own confinement (see the docstring)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


def answer(compute: Callable[[], dict[str, Any]]) -> int:
    """Print ``compute()`` as one JSON line, or the error it raised: the harness reads either."""
    try:
        result = compute()
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


def main(argv: list[str]) -> int:
    path, step_key, final_key = argv[1], argv[2] or None, argv[3] or None
    return answer(lambda: summarize(full_load(path), step_key, final_key))


if __name__ == "__main__":
    # its answer written, nothing is left to finalize: leave without the interpreter's teardown, which
    # in a child forked from the job's warm interpreter touches every preloaded object (0.2-0.6 s)
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

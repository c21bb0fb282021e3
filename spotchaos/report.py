"""The reproducibility report (JSON, the machine format).

One document per test session: the environment the verdicts hold for, the jobs, and one entry
per scenario with its verdict, the faults applied, the first divergent step, lost work, timings
and a command line that replays it. ``schema_version`` changes whenever a field changes meaning.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import __version__

SCHEMA_VERSION = 1


def _git_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def environment(root: Path) -> dict[str, Any]:
    """What the verdicts were measured on; torch is described only if it is importable."""
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "spotchaos": __version__,
        "git_commit": _git_commit(root),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        env["torch"] = None
    return env


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def build_report(
    *,
    root: Path,
    seed: int,
    profile: str,
    jobs: list[dict[str, Any]],
    scenarios: list[dict[str, Any]],
    started: str,
) -> dict[str, Any]:
    passed = sum(1 for s in scenarios if s.get("passed"))
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "spotchaos",
        "started": started,
        "finished": now_iso(),
        "seed": seed,
        "profile": profile,
        "environment": environment(root),
        "jobs": jobs,
        "summary": {"scenarios": len(scenarios), "passed": passed, "failed": len(scenarios) - passed},
        "scenarios": scenarios,
    }


def write_text(text: str, path: Path) -> Path:
    """Write atomically: a reader never sees half a report, even if pytest is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(document: dict[str, Any], path: Path) -> Path:
    return write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n", path)

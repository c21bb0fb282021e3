"""Saved runs: every ``--spotchaos`` session keeps its report under ``.spotchaos/``.

Named like pytest-benchmark's saved runs, ``0007_<commit>_<time>.json``, so the directory lists
in order and ``spotchaos compare`` can name runs by counter ("3"), by "latest" and "previous",
or by path.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import ReportError
from .document import write_json, write_text

HISTORY_DIR = ".spotchaos"
SAVED = re.compile(r"^(\d{4,})_([0-9a-f]+|nocommit)_(\d{8}T\d{6}Z)\.json$")


def saved_runs(directory: Path) -> list[Path]:
    """Saved reports in counter order (files that do not follow the naming are ignored)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if SAVED.match(p.name)]
    return sorted(found, key=lambda p: int(SAVED.match(p.name).group(1)))


IGNORE_FILE = "# written by spotchaos: saved reports of gate sessions, not source\n*\n"


def save_run(document: dict[str, Any], directory: Path) -> Path:
    """Save a copy of ``document`` as the next numbered run. The folder gets a ``.gitignore`` of
    its own when spotchaos makes it (as ``.pytest_cache`` does), so a session leaves the project's
    ``git status`` as it was; CI keeps the folder in a cache, not in the repository."""
    if not directory.exists():
        write_text(IGNORE_FILE, directory / ".gitignore")
    runs = saved_runs(directory)
    counter = int(SAVED.match(runs[-1].name).group(1)) + 1 if runs else 1
    commit = ((document.get("environment") or {}).get("git_commit") or "nocommit")[:8]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return write_json(document, directory / f"{counter:04d}_{commit}_{stamp}.json")


def resolve_run(reference: str, directory: Path) -> Path:
    """A path, a counter ("3" or "0003"), "latest" or "previous" to the saved report it names."""
    path = Path(reference)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ReportError(f"{reference}: no such report")
        return path
    runs = saved_runs(directory)
    if reference in ("latest", "previous"):
        need = 1 if reference == "latest" else 2
        if len(runs) < need:
            raise ReportError(f"{reference!r}: {directory} holds {len(runs)} saved run(s)")
        return runs[-need]
    if reference.isdigit():
        for run in runs:
            if int(SAVED.match(run.name).group(1)) == int(reference):
                return run
        raise ReportError(f"no saved run number {int(reference)} in {directory} (see 'spotchaos list')")
    raise ReportError(f"{reference!r} is neither a report file, a run number, 'latest' nor 'previous'")

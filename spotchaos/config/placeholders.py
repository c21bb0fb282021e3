"""What a job's declaration may name before the harness knows it: the run's checkpoint folder and
the newest checkpoint in it.

A script as users bring it takes its output folder and its resume point on the command line
(``--out DIR``, ``--resume_from_checkpoint step_N``), or in its working folder or environment. The
harness makes a fresh checkpoint folder per run, so these are filled in per attempt, and a resume
argument naming the newest checkpoint needs no wrapper script that finds it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ..errors import ConfigError

CHECKPOINT_DIR = "{checkpoint_dir}"  # the run's own checkpoint folder
LATEST_CHECKPOINT = "{latest_checkpoint}"  # the newest checkpoint in it, when the attempt starts
_NUMBER = re.compile(r"\d+")


def fill(text: str, checkpoints: Path, latest: Path | None = None) -> str:
    """``text`` with the placeholders replaced (``latest``: None where there is no checkpoint)."""
    text = text.replace(CHECKPOINT_DIR, str(checkpoints))
    return text.replace(LATEST_CHECKPOINT, str(latest)) if latest is not None else text


def working_folder(cwd: str | None, root: Path, checkpoints: Path | None = None) -> Path:
    """Where the job runs: ``cwd`` under the project root. A ``cwd`` naming ``{checkpoint_dir}`` is
    inside the run's checkpoint folder; outside a run (a fingerprint, a confined reader) the root."""
    if not cwd:
        return root
    if CHECKPOINT_DIR in cwd:
        return Path(fill(cwd, checkpoints)) if checkpoints is not None else root
    return root / cwd


def wants_latest(resume: Iterable[str]) -> bool:
    """Whether a resume command names the newest checkpoint."""
    return any(LATEST_CHECKPOINT in part for part in resume)


def check_latest(command: Iterable[str], env: Iterable[str], cwd: str | None, where: str) -> None:
    """``{latest_checkpoint}`` only where a restart reads it: its resume arguments or command. A first
    start has no checkpoint to name."""
    if any(LATEST_CHECKPOINT in part for part in (*command, *env, cwd or "")):
        raise ConfigError(
            f"{where}: {LATEST_CHECKPOINT} names the newest checkpoint, which a first start does not have: "
            "use it in resume_args or resume_command only"
        )


def latest_checkpoint(checkpoints: Path, pattern: str | None) -> Path | None:
    """The newest entry of the run's checkpoint folder matching ``pattern`` (``*``: any): the one
    whose path holds the largest number (``step_12`` after ``step_9``), then the latest written.
    Names and ``lstat`` only: nothing is opened."""
    found = []
    for path in checkpoints.glob(pattern or "*"):
        relative = path.relative_to(checkpoints).as_posix()
        if relative.startswith(".") or "/." in relative:
            continue
        numbers = [int(n) for n in _NUMBER.findall(relative)]
        try:
            written = path.lstat().st_mtime_ns
        except OSError:
            continue
        found.append(((numbers[-1] if numbers else -1), written, relative))
    return checkpoints / max(found)[2] if found else None

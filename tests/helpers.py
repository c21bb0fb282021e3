"""Plain helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spotchaos.config import JobSpec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
REFERENCE_TRAINER = FIXTURES / "reference_trainer.py"


def trainer_job(script: str = "reference_trainer", *args: str, name: str | None = None, **kwargs) -> JobSpec:
    """A job running one of the trainers in fixtures/ with a short schedule."""
    command = ("python", str(FIXTURES / f"{script}.py"), "--steps", "16", "--checkpoint-every", "4", *args)
    return JobSpec(name=name or script, command=command, **kwargs)


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


def run_pytest(cwd: Path, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """A whole pytest session in a subprocess (no cache, no GitHub step summary): what a user runs."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "GITHUB_STEP_SUMMARY"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )

"""Plain helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

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

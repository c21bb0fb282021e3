"""Plain helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from spotchaos.config.jobs import JobSpec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
REFERENCE_TRAINER = FIXTURES / "reference_trainer.py"


def trainer_job(script: str = "reference_trainer", *args: str, name: str | None = None, **kwargs) -> JobSpec:
    """A job running one of the trainers in fixtures/ with a short schedule. A broken trainer starts
    cold unless told otherwise: a failure through a warm start is judged again cold (the shortcuts'
    rule, tests/test_shortcuts.py), so a test of what a defect's message says runs the slow path
    its user sees, once, instead of a warm run and then that one."""
    command = ("python", str(FIXTURES / f"{script}.py"), "--steps", "16", "--checkpoint-every", "4", *args)
    if script.startswith("broken_"):
        kwargs.setdefault("warm", False)
    return JobSpec(name=name or script, command=command, **kwargs)


def sigint_as_from_a_terminal() -> None:
    """``preexec_fn`` of a pytest that a test sends SIGINT: a shell that starts this suite in the
    background (``cmd &``) hands its children SIGINT ignored, which Python then keeps, and the
    Ctrl-C the test means would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


def hostile_pickle_job(name: str, marker: str, *, steps: int, container=None) -> JobSpec:
    """fixtures/hostile_pickle.py gated through the log adapter: its checkpoint, when unpickled,
    appends the loading process's pid to ``marker``."""
    from spotchaos.config.logspec import LogSpec

    log = LogSpec(
        pattern=r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
        checkpoints="ckpt.pt",
        final_weights="ckpt.pt",
        final_key="model",
        checkpoint_step_key="step",
    )
    script = "fixtures/hostile_pickle.py" if container is not None else str(FIXTURES / "hostile_pickle.py")
    command = ("python", script, "--out", "{checkpoint_dir}", "--marker", marker, "--steps", str(steps))
    return JobSpec(name=name, command=command, resume_args=("--resume",), log=log, container=container)


# How the log adapter reads fixtures/plain_train.py and the scripts built on it.
PLAIN_LOG = {
    "pattern": r"step (?P<step>\d+) loss (?P<loss>[-+0-9.eE]+|nan|inf)",
    "checkpoints": "ckpt.pt",
    "final_weights": "ckpt.pt",
    "final_key": "model",
    "checkpoint_step_key": "step",
}


def plain_job(script: str = "plain_train", steps: int = 20, log: dict | None = None, **table) -> JobSpec:
    """A fixture script gated through the log adapter, declared as pyproject.toml would."""
    from spotchaos.config.jobs import job_from_mapping

    command = ["python", str(FIXTURES / f"{script}.py"), "--out", "{checkpoint_dir}", "--steps", str(steps)]
    if script.startswith("broken_"):  # as trainer_job: the slow path its user sees, run once
        table.setdefault("warm", False)
    return job_from_mapping(
        script, {"command": command, "resume_args": ["--resume"], "log": log or PLAIN_LOG, **table}, "pyproject.toml"
    )


def fresh_venv(where: Path, *requirements: str, env: dict, timeout: float = 1200) -> str:
    """A new venv at ``where`` with ``requirements`` pip-installed (what a new user does): its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    python = str(where / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", *requirements],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
    return python


def no_process_left(runner) -> list[int]:
    """Processes of this runner's jobs still alive: their events file lies in its working directory
    (other test workers run jobs of their own meanwhile)."""
    needle = f"SPOTCHAOS_EVENTS={runner.workdir}".encode()
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(item.startswith(needle) for item in environ):
                left.append(int(entry.name))
    return left

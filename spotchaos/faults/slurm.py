"""Preemption as Slurm delivers it, on one machine with no Slurm daemon.

A preemptible partition warns a job before it ends it: the signal of its ``--signal=USR1@90`` (Lightning's
``SLURMEnvironment`` listens for USR1; submitit uses USR2 because NCCL takes USR1) goes to every
process of the job; ``lead`` seconds later SIGTERM; ``KillWait`` later (the job's grace window),
SIGKILL. In requeue mode the job asks for its own restart in its warning handler (``scontrol
requeue $SLURM_JOB_ID``, as Lightning's auto-requeue does), and runs again under the same job id
with ``SLURM_RESTART_COUNT`` one higher; in cancel mode it ends for good and a new submission
(another job id) resumes from its checkpoint.

The stand-in is what the job sees of Slurm: its ``SLURM_*`` variables and an ``scontrol`` first on
its PATH that records what it was asked (one JSON line each) and answers 0.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..backends.base import Handle
from ..errors import SpotchaosError
from ..safety.safefs import create_new, read_text_bounded
from .traits import Traits

SCONTROL_LOG = "scontrol.jsonl"
_SCONTROL = """#!{python}
# spotchaos's stand-in for Slurm's scontrol: records the call, answers 0
import json, sys, time
with open({log!r}, "a") as out:
    out.write(json.dumps({{"argv": sys.argv[1:], "t": time.time()}}) + "\\n")
"""


@dataclass(frozen=True)
class SlurmWarning(Traits):
    """``slurm-usr1`` / ``slurm-usr2``: the partition's warning signal to every process of the job;
    the engine sends SIGTERM ``lead`` seconds later (the job's ``slurm_signal``) and SIGKILL when
    the grace window (``KillWait``) after it ends."""

    signum: int
    graceful: bool = field(default=True, init=False)
    warns: bool = field(default=True, init=False)  # a SIGTERM follows after the job's lead
    whole_group: bool = field(default=True, init=False)

    @property
    def name(self) -> str:
        return f"slurm-{signal.Signals(self.signum).name.removeprefix('SIG').lower()}"

    def apply(self, handle: Handle) -> None:
        handle.notify(self.signum, whole_group=True)


SLURM_FAULTS = {fault.name: fault for fault in (SlurmWarning(signal.SIGUSR1), SlurmWarning(signal.SIGUSR2))}


def job_id(run_id: str, attempt: int, requeue: bool) -> str:
    """The Slurm job id of an attempt: one for every attempt of a run in requeue mode (a requeue
    keeps it), a new one for each in cancel mode (a new submission)."""
    base = int(run_id[:6], 16) % 9_000_000 + 1_000_000
    return str(base if requeue else base + attempt)


def environment(folder: Path, job_name: str, run_id: str, attempt: int, requeue: bool) -> dict[str, str]:
    """What one attempt sees of Slurm, its ``scontrol`` written into ``folder`` (the attempt's own)."""
    bin_dir = folder / "slurm-bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    with create_new(script) as out:
        out.write(_SCONTROL.format(python=sys.executable, log=str(folder / SCONTROL_LOG)).encode())
    script.chmod(stat.S_IRWXU)
    return {
        "SLURM_JOB_ID": job_id(run_id, attempt, requeue),
        "SLURM_JOB_NAME": job_name,  # Lightning's SLURMEnvironment: "bash" or "interactive" would turn it off
        "SLURM_RESTART_COUNT": str(attempt if requeue else 0),
        "SLURM_NTASKS": "1",
        "SLURM_NNODES": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "localhost",
        "PATH_PREFIX": str(bin_dir),  # the attempt puts it first on PATH
    }


def requeued(folder: Path, slurm_job_id: str) -> bool:
    """Whether the attempt asked ``scontrol requeue`` for its own job id."""
    try:
        text = read_text_bounded(folder / SCONTROL_LOG, 65536)  # no link followed: the job can write there
    except (OSError, SpotchaosError):
        return False
    for line in text.splitlines():
        try:
            argv = json.loads(line).get("argv", [])
        except (ValueError, AttributeError):
            continue
        if isinstance(argv, list) and argv[:1] == ["requeue"] and slurm_job_id in argv[1:]:
            return True
    return False


def with_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the stand-in's folder first on PATH."""
    prefix = env.pop("PATH_PREFIX", None)
    if prefix:
        env["PATH"] = os.pathsep.join(filter(None, [prefix, env.get("PATH")]))
    return env

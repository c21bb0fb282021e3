"""Ranks forked by torchrun's agent (``host/warm/torchrun_ranks.py``): each is the process a cold
rank would be. Real torchrun, real gloo on 127.0.0.1, real forks."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from spotchaos.backends.base import LaunchSpec
from spotchaos.backends.subprocess import SubprocessBackend
from spotchaos.config.jobs import load_settings
from spotchaos.faults.plan import Plan
from spotchaos.host.warm import torchrun_ranks
from spotchaos.training.multirank.torchrun import ForkedRanks, forked_ranks

from .helpers import ROOT

RANK = """
import atexit, json, os, random, signal, sys
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
# one write a line (print writes its newline apart, unbuffered): two ranks' lines never interleave
sys.stdout.write(json.dumps({
    "rank": rank, "pid": os.getpid(), "own_session": os.getsid(0) == os.getpid(), "path0": sys.path[0],
    "argv": sys.argv, "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "random": random.random(), "ppid": os.getppid(),
}) + "\\n")
sys.stdout.flush()
atexit.register(lambda: sys.stdout.write(f"atexit of rank {rank}\\n"))
dist.barrier()
dist.destroy_process_group()
how = sys.argv[1]
if how == "os-exit-0" and rank == 1:
    os._exit(0)  # no atexit, no return value: torchrun's function workers would wait forever
if how == "raise" and rank == 1:
    raise RuntimeError("the job's own error on rank 1")
if how == "exit-3" and rank == 0:
    sys.exit(3)
"""


def launch(folder: Path, how: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, torchrun_ranks.__file__, "--nproc-per-node=2", "--rdzv-backend=c10d"]
    argv += ["--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1", "--monitor-interval=0.1", "rank.py", how]
    return subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "rank.py").write_text(RANK)
    return tmp_path


def said(run: subprocess.CompletedProcess) -> dict[int, dict]:
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {line["rank"]: line for line in lines}


def test_a_forked_rank_runs_as_a_cold_one_and_ends_with_its_own_status(folder):
    run = launch(folder, "os-exit-0")
    ranks = said(run)
    assert run.returncode == 0, run.stderr[-3000:]  # rank 1's os._exit(0) ended the launch, no hang
    assert sorted(ranks) == [0, 1] and "atexit of rank 0" in run.stdout and "atexit of rank 1" not in run.stdout
    for info in ranks.values():
        assert info["own_session"] and info["sigterm_default"], info
        assert info["path0"] == str(folder) and info["argv"] == ["rank.py", "os-exit-0"]
    assert ranks[0]["ppid"] == ranks[1]["ppid"]  # both forked by the one agent
    assert ranks[0]["random"] != ranks[1]["random"]  # each seeded afresh, as a new interpreter is
    assert torchrun_ranks.COLD not in run.stderr


def test_a_forked_ranks_error_and_exit_status_reach_torchrun_as_a_cold_ranks_would(folder):
    raised = launch(folder, "raise")
    assert raised.returncode == 1
    trace = [line for line in raised.stderr.splitlines() if line.startswith("[rank1]:")]
    # the script's own frame first (its raise), never this wrapper's or runpy's
    assert trace[:2] == [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "rank.py", line 20, in <module>',
    ]
    assert trace[-1] == "[rank1]: RuntimeError: the job's own error on rank 1"
    exited = launch(folder, "exit-3")
    assert exited.returncode == 1 and "exitcode: 3" in exited.stderr, exited.stderr[-3000:]


@pytest.mark.unit
def test_ranks_fork_only_from_a_warm_script_attempt_and_a_crash_point_is_armed_in_the_rank(tmp_path):
    spec = LaunchSpec(
        argv=("python", "train.py"),
        env={},
        cwd=tmp_path,
        stdout_path=tmp_path / "out",
        stderr_path=tmp_path / "err",
        grace_seconds=5.0,
        start_env={},
    )
    local = SubprocessBackend()
    assert forked_ranks(spec, local) == ForkedRanks()
    assert forked_ranks(replace(spec, start_env=None), local) == "the attempt starts cold"
    module = replace(spec, argv=("python", "-m", "train"))
    assert forked_ranks(module, local) == "the job's command is no plain 'python script.py'"
    crash = replace(spec, env={"SPOTCHAOS_CRASH_ROOT": "/x", "SPOTCHAOS_CRASH_RANK": "1"})
    hook = forked_ranks(crash, local)
    assert isinstance(hook, ForkedRanks) and Path(hook.site_hook).name == "sitecustomize.py"
    everywhere = replace(spec, env={"SPOTCHAOS_CRASH_ROOT": "/x"})
    assert forked_ranks(everywhere, local) == "a crash point armed in every process"


def test_a_lost_node_takes_the_ranks_its_agent_forked_with_it_and_the_resume_is_bit_exact(runner):
    """Forked ranks carry the run's marker but not the node's: they go as the agent's descendants."""
    job = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == "ddp-2nodes")
    run, verdict = runner.run(job, Plan.parse("lose-node1@5"))
    assert verdict.passed, verdict.message()
    assert {a.start_kind for a in run.attempts} == {"warm"}
    lost = run.attempts[0]
    pids = [e["pid"] for rank in (0, 1) for e in lost.of_rank("start", rank)]
    assert len(pids) == 2 and "node 1 lost" in lost.fault.detail, lost.fault.detail
    node1 = lost.of_rank("start", 1)[-1]["pid"]  # one rank per node: rank 1 is node 1's
    assert str(node1) in lost.fault.detail.partition("pids ")[2], lost.fault.detail  # ended with its agent
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    assert not alive, f"ranks of the lost attempt still running: {alive}"

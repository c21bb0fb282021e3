"""An unmodified torchrun script through the log adapter (issue 60 item 2): torchrun keeps each
rank's output in a log folder of the harness's (``--tee``), and rank 0's own log is read as the rank
writes it. The stand-in has PyTorch's fault-tolerant tutorial's shape (fixtures/torchrun_snapshot.py);
the main job gates the correct one (scenarios/test_gallery_torchrun.py), CI the tutorial's own
bookkeeping, which stores the epoch it just finished as the epochs run."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from spotchaos.config.jobs import job_from_mapping
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure
from spotchaos.training.multirank.torchrun import RankLogLines

from .helpers import FIXTURES


def snapshot_job(*extra: str, epochs: int = 3, name: str = "torchrun-snapshot-test"):
    table = {
        "command": ["python", str(FIXTURES / "torchrun_snapshot.py"), "--epochs", str(epochs), *extra],
        "env": {"SNAPSHOT": "{checkpoint_dir}/snapshot.pt"},
        "launcher": "torchrun",
        "nproc_per_node": 2,
        "warm": False,
        "log": {"checkpoints": "snapshot.pt", "final_weights": "snapshot.pt", "final_key": "MODEL_STATE"},
    }
    return job_from_mapping(name, table, "tests/test_torchrun_log.py")


@pytest.mark.full  # the main job runs the hard kills on torchrun-snapshot; CI fails the tutorial's bookkeeping
def test_an_epoch_snapshot_torchrun_script_resumes_bit_exact_read_from_rank_0s_log(runner):
    job = snapshot_job()
    run, verdict = runner.run(job, Plan.parse("sigkill@13"))
    assert verdict.passed, verdict.failures
    assert runner.reference(job).saved_steps == [7, 15, 23]  # each epoch's end: no line read a poll late
    assert len(run.attempts[0].fault.reached) == 3  # the agent and both ranks


def test_a_snapshot_that_names_the_epoch_it_saved_is_named_as_a_counter_restored_wrong(runner):
    """The tutorial stores the epoch it just finished as the epochs run: the restart loads the
    trained weights and trains that epoch again from step 0. Not a fresh start (its step-0 loss is
    not the fresh start's), not lost work: the counter."""
    job = snapshot_job("--epochs-run-as-saved", epochs=2, name="torchrun-snapshot-as-saved")
    with pytest.raises(ChaosFailure) as failed:
        runner.check(job, Plan.parse("sigkill@9"))
    message = str(failed.value)
    assert "attempt 1 counted its steps from 0 again although a checkpoint after step 7 was durable" in message
    assert "the step or epoch counter it saves in its checkpoint, or restores, is the likely cause" in message
    assert "work was lost silently" not in message and "RNG state" not in message, message


@pytest.mark.unit
def test_rank_0s_log_is_read_from_torchruns_newest_attempt_and_never_through_a_link(tmp_path):
    logs = tmp_path / "torchrun-logs"
    reader = RankLogLines(logs, "stdout")
    assert reader.read_lines() == []  # torchrun has not made its folder yet
    first = logs / "run_abc" / "attempt_0" / "0"
    first.mkdir(parents=True)
    (first / "stdout.log").write_bytes(b"step 0 loss 1\nstep 1 loss 2\nstep 2")
    assert reader.read_lines() == [b"step 0 loss 1", b"step 1 loss 2"]
    with open(first / "stdout.log", "ab") as f:
        f.write(b" loss 3\n")
    newer = logs / "run_abc" / "attempt_1" / "0"  # torchrun restarted its worker group
    newer.mkdir(parents=True)
    (newer / "stdout.log").write_bytes(b"step 2 loss 3\n")
    assert reader.read_lines() == [b"step 2 loss 3", b"step 2 loss 3"]  # the older file to its end, then the newer
    (tmp_path / "elsewhere" / "attempt_9" / "0").mkdir(parents=True)
    (tmp_path / "elsewhere" / "attempt_9" / "0" / "stdout.log").write_bytes(b"step 99 loss 0\n")
    os.symlink(tmp_path / "elsewhere", logs / "run_link")  # a folder a link names is never read
    assert reader.read_lines() == []


@pytest.mark.unit
def test_every_other_ranks_lines_are_read_node_by_node_each_restart_in_order_never_through_a_link(tmp_path):
    from types import SimpleNamespace

    from spotchaos.config.jobs import JobSpec
    from spotchaos.training.multirank.torchrun import other_ranks_lines

    spec = SimpleNamespace(stdout_path=tmp_path / "stdout.log")
    job = JobSpec(name="j", command=("python", "t.py"), launcher="torchrun", nproc_per_node=2, nnodes=2)

    def log(folder: str, attempt: int, local: int, text: bytes) -> None:
        where = tmp_path / folder / "run_x" / f"attempt_{attempt}" / str(local)
        where.mkdir(parents=True, exist_ok=True)
        (where / "stdout.log").write_bytes(text)

    log("torchrun-logs", 0, 0, b"step 0 loss 1\n")  # rank 0: read as it runs, never here
    log("torchrun-logs", 0, 1, b"step 0 loss 2\nstep 1 loss 3\nstep 2 lo")  # killed mid-line
    log("torchrun-logs", 10, 1, b"step 2 loss 4\n")  # torchrun's restart 10 comes after restart 2
    log("torchrun-logs", 2, 1, b"step 1 loss 3\n")
    log("torchrun-logs.node1", 0, 0, b"step 0 loss 5\n")  # node 1's local rank 0 is rank 2
    log("torchrun-logs.node1", 0, 1, b"")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "stdout.log").write_bytes(b"step 9 loss 9\n")
    os.symlink(tmp_path / "elsewhere", tmp_path / "torchrun-logs.node1" / "run_x" / "attempt_1")
    lines = other_ranks_lines(spec, job, "stdout")
    assert lines[1] == ["step 0 loss 2", "step 1 loss 3", "step 1 loss 3", "step 2 loss 4"]
    assert lines == {1: lines[1], 2: ["step 0 loss 5"], 3: []}


def test_agents_whose_rendezvous_port_was_taken_first_start_again_on_another(runner, monkeypatch):
    """The harness picks a free port and torchrun's agent binds it seconds later; another process
    may take it between (the main job's torchrun-snapshot reference failed so, EADDRINUSE). The
    port here is really taken, by a socket listening on it; the pick is made to land there."""
    import socket

    from spotchaos.host import ports
    from spotchaos.training.multirank import torchrun

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picks = iter([taken.getsockname()[1]])
        monkeypatch.setattr(torchrun, "free_port", lambda: next(picks, None) or ports.free_port())
        reference = runner.reference(snapshot_job(epochs=1, name="torchrun-port-taken"))
    assert reference.final is not None and len(reference.steps) == 8
    failed = next(Path(reference.workdir).glob("attempt-0/stderr.port-taken-1.log"))
    assert "EADDRINUSE" in failed.read_text()


def test_a_rank_that_never_loads_the_snapshot_is_named_from_its_own_log(runner):
    """Every rank prints its loss and torchrun keeps each rank's log: the ranks other than 0 are
    judged on their own lines too. Only rank 0 loads the snapshot here, so after the resume rank
    1 trains from fresh weights: its loss leaves the reference at the first step after the resume,
    rank 0's only at the next (the averaged gradient carries rank 1's error). Rank 1 is named first."""
    job = snapshot_job("--load-on-rank-0-only", epochs=2, name="torchrun-snapshot-rank0-loads")
    with pytest.raises(ChaosFailure) as failed:
        runner.check(job, Plan.parse("sigkill@9"))
    failures = failed.value.verdict.failures
    assert failures[0].startswith("rank 1: loss diverged at step 8 (attempt 1, the first step after resuming"), failures
    assert "before rank 0 did (step 9)" in failures[0] and "rank 0 alone" in failures[0], failures[0]
    assert any(f.startswith("loss diverged at step 9") for f in failures[1:]), failures


@pytest.mark.unit
def test_an_unmodified_scripts_ranks_are_found_by_the_rank_torchrun_gave_them_not_their_workers(tmp_path):
    """A script read through the log adapter reports no start event: a rank fault finds its rank
    among the run's processes by the ``RANK`` in its environment, never a DataLoader worker (a
    child holding the same ``RANK``), and a process without the run's marker is no rank at all."""
    import subprocess
    import sys

    from spotchaos.config.jobs import JobSpec
    from spotchaos.config.logspec import LogSpec
    from spotchaos.host.processes import descendants, end
    from spotchaos.training.multirank.ranked import RankedHandle

    class Ranks(RankedHandle):
        def lose_node(self, index: int) -> None: ...

        def drain_node(self, index: int) -> None: ...

    job = JobSpec(name="j", command=("python", "t.py"), launcher="torchrun", nproc_per_node=2, log=LogSpec())
    handle = Ranks(job, "r" * 12)
    sleep = "import time; time.sleep(60)"
    worker = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {sleep!r}]); {sleep}"
    started = []
    try:
        for rank, marker in (("0", handle.marker), ("1", handle.marker), ("1", "SPOTCHAOS_RUN_ID=another")):
            env = {"PATH": "/usr/bin:/bin", "RANK": rank, marker.split("=")[0]: marker.split("=")[1]}
            started.append(subprocess.Popen([sys.executable, "-c", worker], env=env))
        deadline = time.monotonic() + 20  # each with its worker started, newer than the rank itself
        while any(len(descendants(p.pid)) < 2 for p in started) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert handle.ranks_alive()
        assert {rank: p.pid for rank, p in handle.ranks.items()} == {0: started[0].pid, 1: started[1].pid}
    finally:
        end([pid for process in started for pid in descendants(process.pid)])  # the workers too
        for process in started:
            process.wait()

"""A resumed tail run once (spotchaos/training/reference/tails.py): a plan whose last restart begins
on the very bytes another plan's last restart began on takes that attempt's events instead of
training them again; a shortcut like the others, so the audit proves it and a failure through it is
judged again on the slow path.

The runs drive the real reference trainer through a real session: real kills, real resumes.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from spotchaos.config.jobs import load_settings
from spotchaos.core import Allowed
from spotchaos.faults.plan import Plan
from spotchaos.record import ScenarioRecord
from spotchaos.report.gate_cost import cost_line, per_job
from spotchaos.session import Session
from spotchaos.training.reference.tails import Tail, _moved, folder_digest
from spotchaos.training.shortcuts import TAIL, used_by
from spotchaos.training.trajectory import Attempt, RunRecord

from .helpers import ROOT
from .test_prefix import trainer


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Session:
    with Session(ROOT, workdir=tmp_path_factory.mktemp("tails")) as runner:
        yield runner


def _losses(run: RunRecord) -> list[tuple[int, str]]:
    return [(s.step, s.loss) for s in run.steps]


def test_a_plan_ending_on_the_files_another_plan_ended_on_takes_its_tail_credited_not_trained(session):
    """sigkill@13 and sigkill@14 both restart on the folder the checkpoint after step 11 left (copied
    from the reference after 11: attempt 1 trains 12..13 or 12..14, is killed, attempt 2 resumes
    from 11): the second plan's attempt 2 is the first's, moved into its own folder."""
    job = trainer()
    reference = session.reference(job)
    record = ScenarioRecord(scenario="tails", job=job.name, seed=1)
    with record:
        first, verdict = session.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
        assert verdict.passed and first.tail_of is None, verdict.message()
        second, verdict = session.run(job, Plan.parse("sigkill@14"), Allowed(prefix=True))
    assert verdict.passed, verdict.message()
    assert second.tail_of == "plan sigkill@13's attempt 2", second.tail_of
    assert [a.start_kind for a in second.attempts][::2] == ["prefix", "tail"]
    tail = second.attempts[-1]
    assert tail.of_kind("resume")[0]["from_step"] == 11 and tail.final is not None
    # its events name its own run's folder, its times come after its own kill
    own = Path(second.workdir, "checkpoints").as_uri()
    assert all(e["uri"].startswith(own) for e in tail.events if "uri" in e), tail.events
    assert tail.started_wall >= second.attempts[1].fault.delivered_wall
    # the very trajectory and weights the real tail trained, which were the reference's
    trained = [(s.step, s.loss) for s in first.attempts[-1].steps]
    assert [(s.step, s.loss) for s in tail.steps] == trained == _losses(reference)[12:]
    assert tail.final["digests"] == first.attempts[-1].final["digests"] == reference.attempts[0].final["digests"]
    assert TAIL in used_by(second, None, cached=False)
    cost = per_job([{"job": job.name, "cost": record.cost}])[job.name]
    assert cost["tail_runs"] == 1 and cost["tail_steps"] == len(tail.steps) == 8, cost
    assert cost["starts"] == 2 + 1, cost  # the first plan's two attempts, the second's one: its tail never started
    assert "ending on another plan's tail: 8 steps credited" in cost_line(job.name, cost)


def test_a_tail_is_taken_only_on_the_same_bytes_at_the_same_attempt(session):
    """A damaged newest checkpoint, or a restart that is the run's third attempt, begins on other
    files or another attempt: it trains its own tail (and one plan damaged alike reuses that)."""
    job = trainer()
    session.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
    damaged, verdict = session.run(job, Plan.parse("sigkill@13:truncate-half"), Allowed(prefix=True))
    assert verdict.passed and damaged.tail_of is None, (verdict.message(), damaged.tail_of)
    again, verdict = session.run(job, Plan.parse("sigkill@14:truncate-half"), Allowed(prefix=True))
    assert verdict.passed and again.tail_of == "plan sigkill@13:truncate-half's attempt 2", again.tail_of
    chained, verdict = session.run(job, Plan.parse("sigkill@9,sigkill@13"), Allowed(prefix=True))
    assert verdict.passed and chained.tail_of is None, chained.tail_of  # attempt 3: another SPOTCHAOS_ATTEMPT
    fresh, verdict = session.run(job, Plan.parse("sigkill@13"), Allowed())  # no shortcut allowed: none taken
    assert verdict.passed and fresh.tail_of is None and fresh.prefix_step is None


def test_tails_off_for_the_session_trains_every_tail(tmp_path):
    job = trainer(name="tails-off")
    with Session(ROOT, workdir=tmp_path / "runs", tails=False) as runner:
        for plan in ("sigkill@13", "sigkill@14"):
            run, verdict = runner.run(job, Plan.parse(plan), Allowed(prefix=True))
            assert verdict.passed and run.prefix_step is not None and run.tail_of is None, run.tail_of


def test_a_trainers_tail_names_the_folder_it_trained_in_and_the_state_diff_reads_it_as_its_own(tmp_path):
    """A transformers Trainer stores its ``output_dir`` in every checkpoint (``training_args.bin``):
    the reused tail's checkpoints name the run that trained it, and the state diff reads that path
    as the run's own, as it does the run's own folder (the main job's false alarm: *output_dir ...
    differs*, then the slow path passed)."""
    declared = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == "hf-trainer")
    job = replace(declared, name="hf-trainer-tails")
    with Session(ROOT, workdir=tmp_path / "runs") as runner:
        first, verdict = runner.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
        assert verdict.passed and first.prefix_step is not None, verdict.message()
        second, verdict = runner.run(job, Plan.parse("sigkill@14"), Allowed(prefix=True))
        assert verdict.passed and second.shortcuts is None, verdict.message()
        assert second.tail_of == "plan sigkill@13's attempt 2", second.tail_of
        assert second.attempts[-1].trained_in == first.workdir


def test_the_audit_runs_a_pass_through_a_tail_again_on_the_slow_path_and_agrees(tmp_path):
    """``--spotchaos-audit=2``: the first plan's pass (from a copy, warm) and the second's (its tail
    reused) are both run again cold from step 0; a correct job agrees, and both audits are spent."""
    job = trainer(name="tail-audited")
    with Session(ROOT, workdir=tmp_path / "runs", audit=2) as runner:
        runner.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
        run, verdict = runner.run(job, Plan.parse("sigkill@14"), Allowed(prefix=True))
        assert verdict.passed and run.tail_of is not None and run.shortcuts is None, verdict.message()
        assert runner.shortcuts.take_audit(job) is False, "the tail's pass was not audited"


def test_a_job_that_takes_no_copies_or_failed_a_plan_takes_no_tails(tmp_path):
    """Tails are shared where copies are (the job's whole world is its checkpoint folder, as its
    reference's trace showed, and no plan of it failed): a job that takes no copies, and a job after
    a failing plan, train every tail."""
    side = replace(trainer(name="no-copies"), prefix=False)
    broken = trainer("broken_no_optimizer_restore", name="no-optimizer")
    with Session(ROOT, workdir=tmp_path / "runs") as runner:
        for plan in ("sigkill@13", "sigkill@14"):
            run, _ = runner.run(side, Plan.parse(plan), Allowed(prefix=True))
            assert run.tail_of is None, f"{side.name} took a tail: {run.tail_of}"
        _, verdict = runner.run(broken, Plan.parse("sigkill@13"), Allowed(prefix=True))
        assert not verdict.passed
        run, verdict = runner.run(broken, Plan.parse("sigkill@14"), Allowed(prefix=True))
        assert not verdict.passed and run.tail_of is None, run.tail_of


@pytest.mark.unit
def test_the_folder_digest_tells_every_byte_and_name_and_refuses_links(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        (folder / "sub").mkdir(parents=True)
        (folder / "ckpt-3.pt").write_bytes(b"\0" * 100)
        (folder / "sub" / "state.json").write_text("{}")
    assert folder_digest(a) == folder_digest(b) is not None
    (b / "ckpt-3.pt").write_bytes(b"\0" * 99 + b"\1")
    assert folder_digest(a) != folder_digest(b)
    (b / "ckpt-3.pt").write_bytes(b"\0" * 100)
    (b / "sub" / "state.json").rename(b / "sub" / "other.json")
    assert folder_digest(a) != folder_digest(b)
    os.symlink(a / "ckpt-3.pt", a / "latest")
    assert folder_digest(a) is None, "a link's meaning is not its bytes"
    (a / "latest").unlink()
    os.mkfifo(a / "pipe")
    assert folder_digest(a) is None
    (a / "pipe").unlink()
    assert folder_digest(a, limit=101) is None, "over the limit: no key, the tail trains"


@pytest.mark.unit
def test_a_replayed_attempt_names_its_own_folder_and_happens_now():
    ran_in, here = Path("/runs/0001/checkpoints"), Path("/runs/0002/checkpoints")
    events = [
        {"event": "resume", "t": 100.0, "from_step": 3, "uri": (ran_in / "ckpt-3.pt").as_uri()},
        {"event": "rollback", "t": 100.5, "skipped_uri": (ran_in / "ckpt-7.pt").as_uri(), "reason": "torn"},
        {"event": "checkpoint", "t": 101.0, "step": 7, "uri": "s3://bucket/ckpt-7.pt"},
    ]
    attempt = Attempt(index=2, exit_code=0, wall_seconds=2.0, start_seconds=0.5, started_wall=99.0, events=events)
    tail = Tail(attempt, "sigkill@5", ran_in, Path("/store/checkpoints"), Path("/store/kept"))
    moved = _moved(tail, here)
    assert moved.start_kind == "tail" and moved.started_wall > 99.0 + 1e6
    assert moved.events[0]["uri"] == (here / "ckpt-3.pt").as_uri()
    assert moved.events[1]["skipped_uri"] == (here / "ckpt-7.pt").as_uri()
    assert moved.events[2]["uri"] == "s3://bucket/ckpt-7.pt", "an address outside the folder is left as it is"
    assert moved.events[1]["t"] - moved.events[0]["t"] == pytest.approx(0.5) and moved.wall_seconds == 2.0
    assert events[0]["t"] == 100.0, "the kept tail itself is left as it was"

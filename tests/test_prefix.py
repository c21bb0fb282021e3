"""The reference's prefix, shared: a searched plan whose first fault comes after a checkpoint
starts from a copy of the reference's checkpoint folder as that checkpoint left it (held there
while copied), resumes with the job's own resume command, and is judged like any resume; steps up
to the checkpoint are credited to the reference, never trained again.

Every check drives the real reference trainer through a real session: real copies, real resumes.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import strategies as st

from spotchaos.config.jobs import JobSpec, job_from_mapping
from spotchaos.core import Allowed
from spotchaos.errors import ConfigError
from spotchaos.faults.plan import Plan
from spotchaos.probe import Probe
from spotchaos.record import ScenarioRecord
from spotchaos.report.gate_cost import cost_line, per_job
from spotchaos.search import ExploreSettings, explore
from spotchaos.session import ChaosFailure, Session
from spotchaos.strategies import preemption_plans
from spotchaos.training.engine.hold import CheckpointHold
from spotchaos.training.reference.prefix import (
    Prefix,
    Prefixes,
    Snapshots,
    choose,
    open_snapshots,
    ready_steps,
    why_not,
)
from spotchaos.training.trajectory import Attempt, RunRecord

from .helpers import FIXTURES, ROOT

FAST = ("--step-seconds", "0.005")


def trainer(script: str = "reference_trainer", *extra: str, name: str | None = None) -> JobSpec:
    """20 steps, checkpoints after 3, 7, 11, 15 and 19."""
    command = ("python", str(FIXTURES / f"{script}.py"), "--steps", "20", "--checkpoint-every", "4", *FAST, *extra)
    return JobSpec(name=name or script.replace("_", "-"), command=command, grace_seconds=10)


def plans(*texts: str) -> st.SearchStrategy[Plan]:
    return st.sampled_from([Plan.parse(text) for text in texts])


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Session:
    with Session(ROOT, workdir=tmp_path_factory.mktemp("prefix")) as runner:
        yield runner


def test_a_plan_after_a_checkpoint_resumes_from_the_references_copy_and_is_judged_like_any_resume(session):
    job = trainer()
    reference = session.reference(job)
    snapshots = reference.snapshots
    # each checkpoint copied, or skipped with the reason (the trainer deletes rotated checkpoints in a
    # background thread: on a loaded machine that may change the folder while it is copied)
    assert sorted([*snapshots["steps"], *map(int, snapshots["skipped"])]) == [3, 7, 11, 15], snapshots
    assert snapshots["refused"] is None and snapshots["steps"], snapshots
    start = max(step for step in snapshots["steps"] if step < 13)
    run, verdict = session.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
    assert verdict.passed, verdict.message()
    assert run.prefix_step == start
    prefix, resumed, *_ = run.attempts
    assert prefix.start_kind == "prefix" and prefix.exit_code is None and prefix.wall_seconds == 0
    assert [s.step for s in prefix.steps] == list(range(start + 1))
    assert [(s.step, s.loss) for s in prefix.steps] == [(s.step, s.loss) for s in reference.steps[: start + 1]]
    assert resumed.of_kind("resume")[0]["from_step"] == start  # a real resume, of the copy in the run's own folder
    assert resumed.steps[0].step == start + 1 and resumed.fault is not None and resumed.fault.fault == "sigkill"
    copied = [e["uri"] for e in prefix.of_kind("checkpoint")]
    assert copied and all(uri.startswith(Path(run.workdir, "checkpoints").as_uri()) for uri in copied)


def test_a_plan_whose_point_is_the_early_life_starts_from_step_0(session):
    job = trainer()
    snapshots = Snapshots(Path("/nonexistent"), 1 << 30, taken={3: Path("a"), 7: Path("b"), 11: Path("c")})
    assert choose(Plan.parse("sigterm@2"), snapshots) is None  # before the first checkpoint
    assert choose(Plan.parse("sigterm@9,sigkill@3"), snapshots) == 7  # the first fault decides
    assert choose(Plan.parse("crash@5"), snapshots) is None  # a crash point counts from the first attempt
    assert choose(Plan.parse("rerun@0"), snapshots) is None  # no last step known: from step 0
    assert choose(Plan.parse("rerun@0"), snapshots, last_step=11) == 7  # trains to the end from the newest before it
    assert choose(Plan.parse("rerun@0"), snapshots, last_step=7) == 3
    assert choose(Plan.parse("crash@9+2"), snapshots) == 7  # counted from step 9: the save after it, from 7's copy
    run, verdict = session.run(job, Plan.parse("sigterm@2"), Allowed(prefix=True))
    assert verdict.passed and run.prefix_step is None and run.attempts[0].start_kind != "prefix"


def test_a_search_starts_its_first_plan_from_step_0_and_credits_the_rest_to_the_reference(session):
    job = trainer()
    record = ScenarioRecord(scenario="prefix", job=job.name, seed=3)
    plans = preemption_plans(20, max_preemptions=1, faults=("sigkill",))
    with record:
        explore(session, job, lambda steps: plans, settings=ExploreSettings(max_examples=3, seed=3))
    starts = [run["prefix_step"] for run in record.runs]
    assert starts[0] is None and any(step is not None for step in starts[1:]), starts
    cost = per_job([{"job": job.name, "cost": record.cost}])[job.name]
    assert cost["prefix_runs"] == sum(step is not None for step in starts)
    assert cost["prefix_steps"] == sum(step + 1 for step in starts if step is not None)
    assert "from the reference's checkpoints" in cost_line(job.name, cost)
    # another scenario of the session drawing the same plans on the same job: their verdicts, not new runs
    again = ScenarioRecord(scenario="prefix-again", job=job.name, seed=3)
    with again:
        explore(session, job, lambda steps: plans, settings=ExploreSettings(max_examples=3, seed=3))
    assert [r["plan"] for r in again.runs] == [r["plan"] for r in record.runs]
    assert all(r["reused"] for r in again.runs) and not any(r["reused"] for r in record.runs)
    assert not again.cost.get("runs")  # nothing ran: nothing to pay


def test_only_the_sessions_first_searched_plan_of_a_job_starts_from_step_0_and_its_early_life_runs_once(tmp_path):
    """One plan from step 0 a job and session keeps the fresh start tested; a second search of the job
    starts from the reference's copies, and sets aside a draw of the job's early life (a fault before
    its first checkpoint: the whole job trained again) once one has run."""
    job = trainer()
    settings = ExploreSettings(max_examples=2, seed=5)
    first, second = (ScenarioRecord(scenario=name, job=job.name, seed=5) for name in ("first", "second"))
    with Session(ROOT, workdir=tmp_path) as runner:
        with first:  # sampled_from shrinks to its first element: hypothesis draws sigterm@1 first
            explore(runner, job, plans("sigterm@1", "sigkill@9", "sigkill@13"), settings=settings)
        with second:
            explore(runner, job, plans("sigterm@2", "sigkill@10", "sigkill@14"), settings=settings)
    assert (first.runs[0]["plan"], first.runs[0]["prefix_step"]) == ("sigterm@1", None), first.runs
    assert first.runs[1]["prefix_step"] is not None, first.runs
    assert all(r["prefix_step"] is not None for r in second.runs), second.runs
    assert "sigterm@2" not in [r["plan"] for r in second.runs] and second.figures["cells"]["draws_set_aside"] >= 1


def test_a_crash_point_counted_from_its_step_lands_on_the_same_event_from_the_references_copy(session):
    """``crash@S+N`` dies before the N-th file-system event since the job reported step S (the step
    before the save's first event): the same moment of a save from a copy of the checkpoint before
    it as from step 0 (``crash@N``)."""
    job = trainer()
    first, *boundaries = session.save_boundaries(job)
    crash = next(b for b in boundaries if b["event"] == "os.rename")  # the save's publishing rename
    counted = crash["index"] - first["index"] + first["since"]  # the events since step S, on across steps
    relative, *_ = (p for p in session.save_crash_points(job) if p.preemptions[0].fs_event == counted)
    assert str(relative) == f"crash@{first['step']}+{counted}", relative
    from_copy, verdict = session.run(job, relative, Allowed(prefix=True))
    assert verdict.passed, verdict.message()
    assert from_copy.prefix_step is not None and from_copy.prefix_step < crash["step"]
    from_start, verdict = session.run(job, Plan.parse(f"crash@{crash['index']}"))
    assert verdict.passed and from_start.prefix_step is None, verdict.message()
    landed = [run.faults[0].detail.partition(" (")[0] for run in (from_copy, from_start)]
    assert landed[0] == landed[1] and landed[0].startswith("before os.rename"), landed


def test_an_unsafe_writer_fails_at_a_crash_point_counted_from_its_step_started_from_the_copy(session):
    job = trainer("broken_inplace_write")
    for plan in session.save_crash_points(job):
        assert plan.preemptions[0].after_step is not None, plan  # a job that takes prefixes: counted from its step
        try:
            session.check(job, plan)
        except ChaosFailure as failure:
            assert "left neither the old nor the new" in str(failure), str(failure)
            assert str(failure.plan) == str(plan)
            return
    pytest.fail("no crash point of broken_inplace_write was caught")


def test_a_crash_while_loading_is_traced_and_run_from_the_copy_of_the_checkpoint_it_loads(session):
    job = trainer()
    kill, reads = session.resume_boundaries(job)
    assert kill.at_step == 16 and reads, (kill, reads)  # after checkpoint 15, the newest leaving two steps
    plan = Plan((kill, *Plan.parse(f"crash@{reads[0]['index']}").preemptions))
    run, verdict = session.run(job, plan, Allowed(prefix=True))
    # from the newest copy before the kill: the one of step 15, unless the trainer's background unlink
    # of a rotated checkpoint changed the folder while it was copied and that copy was skipped
    newest = max(step for step in session.reference(job).snapshots["steps"] if step < kill.at_step)
    assert verdict.passed and run.prefix_step == newest, verdict.message()
    assert [a.fault.fault for a in run.trained if a.fault] == ["sigkill", "crash"]


def test_a_broken_job_fails_from_step_0_with_its_own_message_and_takes_no_more_prefixes(session):
    job = trainer("broken_no_rng_restore")
    session.reference(job)
    run, verdict = session.run(job, Plan.parse("sigterm@9"), Allowed(prefix=True))
    assert not verdict.passed and run.prefix_step is None  # the verdict is the step-0 run's
    assert "rng" in verdict.message()
    assert "failed" in session.reference(job).snapshots["refused"]
    again, _ = session.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
    assert again.prefix_step is None


def test_a_checkpoint_that_names_the_references_folder_makes_the_job_refuse_prefixes(session):
    job = trainer("reference_trainer", "--latest-absolute", name="absolute-latest")
    snapshots = session.reference(job).snapshots
    assert snapshots["steps"] == [] and "names a path inside the reference run's own folder" in snapshots["refused"]
    assert "latest" in snapshots["refused"]
    run, verdict = session.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
    assert verdict.passed and run.prefix_step is None
    # every plan of it starts from step 0: none is set aside as a second plan of its early life
    early = [Plan.parse("sigterm@1"), Plan.parse("sigterm@2")]
    assert all(session.prefixes.claim_early_life(job, plan, session.reference(job)) for plan in early)


@pytest.mark.unit
def test_a_path_only_in_entries_the_framework_never_follows_is_no_reason_to_refuse(tmp_path):
    """Lightning's ModelCheckpoint keeps the run's folder in its bookkeeping, which a resume from
    another folder never reads; the same path anywhere else in the file still refuses."""
    import torch

    from spotchaos.training.frameworks import paths_never_followed

    folder = tmp_path / "run" / "checkpoints"
    callback = "StepBoundaryCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 4}"

    def snapshots_of(**extra: object) -> Snapshots:
        snapshots = open_snapshots(tmp_path / f"run{len(list(tmp_path.iterdir()))}", None)
        state = {
            "state_dict": {"w": torch.ones(2)},
            "callbacks": {callback: {"best_model_path": f"{folder}/epoch=0-step=4.ckpt", "dirpath": str(folder)}},
            **extra,
        }
        snapshots.taken[3] = snapshots.folder / "s3"
        snapshots.taken[3].mkdir()
        torch.save(state, snapshots.taken[3] / "epoch=0-step=4.ckpt")
        return snapshots

    lightning = paths_never_followed("lightning")
    bookkeeping = snapshots_of()
    bookkeeping.check_names(folder, lightning)
    assert bookkeeping.refused is None and 3 in bookkeeping.taken
    unknown = snapshots_of()
    unknown.check_names(folder)  # a job of no framework: the same file refuses
    assert "names a path inside the reference run's own folder" in unknown.refused and not unknown.taken
    elsewhere = snapshots_of(resume_from=f"{folder}/last.ckpt")
    elsewhere.check_names(folder, lightning)
    assert "epoch=0-step=4.ckpt" in elsewhere.refused and not elsewhere.taken
    as_bytes = snapshots_of(latest=f"{folder}/last.ckpt".encode())  # a pointer kept as bytes
    as_bytes.check_names(folder, lightning)
    assert as_bytes.refused is not None and not as_bytes.taken


@pytest.mark.unit
def test_a_plans_first_attempt_holds_the_references_events_through_the_steps_last_checkpoint(tmp_path):
    """Lightning reports last.ckpt after the named file of the same step, and the copy is the folder
    as that last report left it: attempt 0 holds both reports (the damage scenarios take the
    newest and the previous checkpoint from them), and nothing after."""
    old, new = tmp_path / "reference" / "checkpoints", tmp_path / "run" / "checkpoints"

    def checkpoint(step: int, name: str) -> dict:
        return {"event": "checkpoint", "step": step, "uri": (old / name).as_uri()}

    events = [
        {"event": "start"},
        *({"event": "step", "step": s, "loss": 1.0} for s in range(6)),
        checkpoint(5, "epoch=0-step=6.ckpt"),
        checkpoint(5, "last.ckpt"),
        {"event": "notice", "step": 5},
        {"event": "step", "step": 6, "loss": 1.0},
        checkpoint(6, "last.ckpt"),
    ]
    reference = RunRecord("job", "", [Attempt(0, 0, 1.0, 0.1, events=events)], 1.0, str(old.parent))
    attempt = Prefix(5, tmp_path / "s5", reference, old).attempt(new)
    saved = [(e["step"], e["uri"]) for e in attempt.events if e["event"] == "checkpoint"]
    assert saved == [(5, (new / "epoch=0-step=6.ckpt").as_uri()), (5, (new / "last.ckpt").as_uri())]
    assert attempt.events[-1]["event"] == "checkpoint" and attempt.start_kind == "prefix"
    assert ready_steps(reference) == {5: 5, 6: 6}


@pytest.mark.unit
def test_a_checkpoint_written_in_a_thread_is_a_plans_start_only_for_faults_after_its_report(tmp_path):
    """Written in a thread (AsyncCheckpointIO, dcp.async_save), the checkpoint after step 5 is
    reported after step 7: a fault at step 6 or 7 (or a crash point among the events after them,
    which may be that write's) found it not yet durable in the reference, so its plan starts from
    the checkpoint before; attempt 0 of a plan from it holds no step after 5."""
    old = tmp_path / "reference" / "checkpoints"
    events = [
        *({"event": "step", "step": s, "loss": 1.0} for s in range(8)),
        {"event": "checkpoint", "step": 1, "uri": (old / "a").as_uri()},  # (reported in order, for the test)
        {"event": "checkpoint", "step": 5, "uri": (old / "b").as_uri()},
        {"event": "step", "step": 8, "loss": 1.0},
    ]
    reference = RunRecord("job", "", [Attempt(0, 0, 1.0, 0.1, events=events)], 1.0, str(old.parent))
    ready = ready_steps(reference)
    assert ready == {1: 7, 5: 7}
    snapshots = Snapshots(tmp_path, 1 << 30, taken={1: tmp_path / "s1", 5: tmp_path / "s5"})
    assert [choose(Plan.parse(p), snapshots, 8, ready) for p in ("sigkill@7", "sigkill@8", "crash@7+1")] == [
        None,
        5,
        None,
    ]
    assert choose(Plan.parse("sigkill@7"), snapshots, 8) == 5  # a checkpoint saved in the loop: from 5
    attempt = Prefix(5, tmp_path / "s5", reference, old).attempt(tmp_path / "run")
    assert [e["step"] for e in attempt.events if e["event"] == "step"] == list(range(6))


@pytest.mark.unit
def test_a_plan_that_failed_only_from_a_copy_says_what_failed_there(tmp_path):
    """A run from the reference's copy that failed where the run from step 0 passed gives up the
    job's prefixes; the report says what failed from the copy (a harness's false alarm on copies
    shows there, never as the job's failure)."""
    from spotchaos.training.verdict import Verdict

    def verdict(*failures: str) -> Verdict:
        return Verdict(not failures, list(failures), None, [], [], [], 0, [], 24)

    job = trainer()
    reference = RunRecord(job.name, "", [], 1.0, str(tmp_path / "reference"))
    prefixes = Prefixes(enabled=True)
    snapshots = prefixes.open(job, tmp_path / "reference")
    prefixes.taken(job, reference, snapshots)
    tried = Prefix(11, tmp_path / "s11", reference, tmp_path / "reference" / "checkpoints")
    prefixes.failed(job, reference, Plan.parse("sigkill@13"), tried, verdict(), verdict("silent bad load: attempt 2"))
    assert reference.snapshots["refused"] == (
        "plan sigkill@13 failed from the reference's checkpoint after step 11 (silent bad load: attempt 2) and "
        "passed from step 0: every later plan of this job starts from step 0"
    )
    assert prefixes.start(job, Plan.parse("sigkill@13"), reference) is None


def test_off_for_a_job_or_a_session_means_every_plan_from_step_0(session, tmp_path):
    job = trainer()
    reference = session.reference(job)  # its copies are there: a twin job with prefix = false never uses them
    twin = replace(job, name="no-prefix", prefix=False)
    assert why_not(twin) == "prefix = false"
    assert session.prefixes.start(job, Plan.parse("sigkill@13"), reference) is not None
    assert session.prefixes.start(twin, Plan.parse("sigkill@13"), reference) is None
    with Session(ROOT, workdir=tmp_path / "off", prefix=False) as off:
        assert off.reference(job).snapshots is None
        run, verdict = off.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
        assert verdict.passed and run.prefix_step is None


def test_a_failing_prefix_run_is_judged_from_step_0_and_ends_the_jobs_prefixes(session):
    """A copy that no longer matches what the job needs (here: its newest checkpoint removed
    behind the harness's back) fails from the prefix; the plan is then run on the slow path, whose
    pass counts only because the harness proves its copy changed (a harness defect, said on the
    run's record), and the job takes no more prefixes, with the reason on the report."""
    job = trainer("reference_trainer", "--seed", "9", name="spoiled-copy")
    reference = session.reference(job)
    start = max(step for step in reference.snapshots["steps"] if step < 13)  # 11, unless a load skipped its copy
    snapshot = Path(reference.workdir + ".snapshots") / f"s{start}"
    newest = max(snapshot.glob("ckpt-*"))  # the copy loses its newest checkpoint: a resume goes back further
    shutil.rmtree(newest)
    run, verdict = session.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
    assert verdict.passed and run.prefix_step is None, verdict.message()
    assert "passed from step 0" in reference.snapshots["refused"]
    explained = run.shortcuts["explained"]
    assert f"{newest.name} was gone from the copy after step {start}" in explained, explained
    assert {a.start_kind for a in run.attempts} == {"cold"}, "the slow path starts every attempt cold"


def held_checkpoint(hold: CheckpointHold, step: int) -> dict:
    """What the job's side does after a checkpoint: announce its hold (the harness reads it)."""
    fd = os.open(hold.folder / "held", os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, f"{step} {os.getpid()}\n".encode())
    os.close(fd)
    return {"event": "checkpoint", "step": step, "t": time.time() + 1}


@pytest.mark.unit
def test_a_copy_is_kept_only_within_the_budget_and_only_of_a_folder_that_held_still(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "ckpt-3").mkdir()
    (folder / "ckpt-3" / "model.pt").write_bytes(b"x" * 600)
    (folder / "latest").write_text("ckpt-3\n")
    hold = CheckpointHold(tmp_path / "hold", seconds=1)
    try:
        snapshots = open_snapshots(tmp_path / "run", budget=1000)
        snapshots.take(held_checkpoint(hold, 3), folder, hold)
        assert sorted(snapshots.taken) == [3] and snapshots.used == 607
        copy = snapshots.taken[3]
        assert (copy / "ckpt-3" / "model.pt").read_bytes() == b"x" * 600 and (copy / "latest").read_text() == "ckpt-3\n"
        (folder / "ckpt-7").mkdir()
        (folder / "ckpt-7" / "model.pt").write_bytes(b"y" * 600)
        snapshots.take(held_checkpoint(hold, 7), folder, hold)  # 1207 bytes of copies in all: over 1000
        assert 7 not in snapshots.taken and "over snapshot_budget (1000 bytes)" in snapshots.refused
        assert "\n" not in snapshots.refused  # one line on the report
        unheld = open_snapshots(tmp_path / "unheld", budget=1 << 20)  # events written without the probe
        unheld.take({"event": "checkpoint", "step": 5, "t": time.time() + 1}, folder, hold)
        assert not unheld.taken and "did not hold after its checkpoint after step 5" in unheld.refused
        started = time.monotonic()
        unheld.take(held_checkpoint(hold, 9), folder, hold)  # not waited for again, nor copied
        assert not unheld.taken and time.monotonic() - started < 1
        newer = {**held_checkpoint(hold, 9), "t": time.time() - 60}  # a file in the folder is newer than the event
        fresh = open_snapshots(tmp_path / "again", budget=1 << 20)
        fresh.take(newer, folder, hold)
        assert fresh.skipped == {9: "the folder changed after the checkpoint was reported"} and not fresh.taken
    finally:
        hold.close()


@pytest.mark.unit
def test_the_probe_holds_after_each_checkpoint_until_the_harness_lets_it_go(tmp_path, monkeypatch):
    hold = CheckpointHold(tmp_path / "hold", seconds=5)
    try:
        monkeypatch.setenv("SPOTCHAOS_EVENTS", str(tmp_path / "events.jsonl"))
        for name, value in hold.environment().items():
            monkeypatch.setenv(name, value)
        probe = Probe.from_env()
        hold.release()  # the harness's byte for the first checkpoint, sent before it is reported
        probe.checkpoint(3, seconds=0.1, nbytes=1, uri="file:///x")
        assert hold.held_at(3, timeout=1)
        pid = os.fork()
        if pid == 0:  # the second checkpoint waits for its own byte
            probe.checkpoint(7, seconds=0.1, nbytes=1, uri="file:///x")
            os._exit(0)
        assert hold.held_at(7, timeout=5)
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # still held
        hold.release()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        hold.close()


@pytest.mark.unit
def test_prefix_and_its_budget_are_checked_where_declared():
    job = job_from_mapping("a", {"command": ["x"], "prefix": False, "snapshot_budget": 10}, "pyproject.toml")
    assert not job.prefix and job.snapshot_budget == 10
    with pytest.raises(ConfigError, match=r"snapshot_budget: must be a number of bytes"):
        job_from_mapping("a", {"command": ["x"], "snapshot_budget": "1GB"}, "pyproject.toml")
    with pytest.raises(ConfigError, match=r"prefix: must be true or false"):
        job_from_mapping("a", {"command": ["x"], "prefix": "no"}, "pyproject.toml")


def test_a_twin_run_first_without_prefixes_leaves_the_job_its_own_reference_and_its_prefixes(tmp_path):
    """Two jobs of one command share a trajectory (one key): the main job's `reference` and
    `reference-ray`, or a twin with prefixes off. The twin's reference is taken without snapshots;
    run first and shared, it left the job every plan from step 0 (the main job once trained 550
    steps for `reference` where 150 had done)."""
    job = trainer(name="with-prefixes")
    twin = replace(job, name="without-prefixes", prefix=False)
    assert twin.key() == job.key()
    with Session(ROOT, workdir=tmp_path) as runner:
        whole = runner.reference(twin)
        assert whole.snapshots == {"steps": [], "refused": "prefix = false"}, whole.snapshots
        reference = runner.reference(job)
        assert reference is not whole and reference.snapshots["steps"], reference.snapshots
        run, verdict = runner.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
        assert verdict.passed, verdict.message()
        assert run.prefix_step is not None and run.prefix_step < 13, run.prefix_step
        assert runner.reference(twin) is whole  # each keeps its own for the session


@pytest.mark.unit
def test_a_twins_fresh_start_is_its_own_and_leaves_the_job_one():
    """The claim of the session's one plan from step 0 is kept per job as its reference is: a twin
    (another backend, prefixes off) that claimed it first, keyed by the command alone, once left the
    job without a fresh start, so its fresh-start path (and a cached reference's check) went untested."""
    job = trainer(name="with-prefixes")
    twin = replace(job, name="without-prefixes", prefix=False)
    prefixes = Prefixes(enabled=True)
    assert prefixes.claim_fresh_start(twin, Plan.parse("sigkill@5"))
    assert prefixes.claim_fresh_start(job, Plan.parse("sigkill@9"))  # its own, not the twin's
    assert not prefixes.claim_fresh_start(job, Plan.parse("sigkill@13"))
    assert prefixes.claim_fresh_start(job, Plan.parse("sigkill@9"))  # the claimant asks again: still its


def test_a_side_file_beside_the_checkpoint_folder_refuses_copies_and_fails_on_every_path(tmp_path):
    """``broken_side_file`` writes ``side.json`` next to its checkpoint folder at a fresh start and
    misuses it on resume; a resume from a copy of the checkpoint folder alone never saw it, so
    plans from copies passed. The reference's trace names the file, no plan starts from a copy,
    and the plan fails with prefixes on and off, warm and cold."""
    job = trainer("broken_side_file")
    for warm, prefix in ((True, True), (False, False)):
        with Session(ROOT, workdir=tmp_path / f"{warm}-{prefix}", warm=warm, prefix=prefix) as runner:
            reference = runner.reference(job)
            if prefix:
                refused = reference.snapshots["refused"]
                assert "side.json outside its checkpoint folder (open-write before its first step)" in refused, refused
                assert reference.snapshots["steps"] == []
            run, verdict = runner.run(job, Plan.parse("sigterm@9"), Allowed(prefix=prefix))
            assert run.prefix_step is None and not verdict.passed
            assert "batch" in verdict.message(), verdict.message()  # the batches after the resume differ


def test_a_failure_on_a_shortcut_that_the_slow_path_does_not_see_fails_naming_the_shortcut(tmp_path):
    """``broken_warm_only`` resumes wrong only when forked warm. The warm failure is judged again
    cold, from step 0; the cold pass does not overrule it: the verdict names the warm start, says
    the cause is unknown, and the job runs the rest of the session on the slow path."""
    job = trainer("broken_warm_only")
    with Session(ROOT, workdir=tmp_path / "runs") as runner:
        run, verdict = runner.run(job, Plan.parse("sigterm@9"), Allowed(prefix=True, reuse=True))
        assert not verdict.passed
        first = verdict.failures[0]
        assert first.startswith("the start from the reference's copy and warm start changed the verdict"), first
        assert "The cause is unknown" in first and "hint" not in first, first  # what was seen, no guessed cause
        assert run.shortcuts["used"] == ["start from the reference's copy", "warm start"], run.shortcuts
        assert runner.shortcuts.off(job) is not None
        _, verdict_again = runner.run(job, Plan.parse("sigterm@9"), Allowed(prefix=True, reuse=True))
        assert not verdict_again.passed and verdict_again.failures == verdict.failures  # a replay sees it too
        later, later_verdict = runner.run(job, Plan.parse("sigkill@13"), Allowed(prefix=True))
        assert later_verdict.passed, later_verdict.message()  # cold from step 0 it resumes right
        assert {a.start_kind.split(":")[0] for a in later.attempts} == {"cold"} and later.prefix_step is None


def test_a_search_stopped_by_a_spoiled_copy_searches_again_and_passes(tmp_path):
    """The search's form of the test above (the main job's false alarm: its search reported a plan
    whose failure the harness had explained, with the slow path's passing verdict as the failure).
    A plan drawn from a spoiled copy fails through it; settled on the slow path it passes and the
    harness is to blame; the search found no failure, so it searches again, without copies, and the
    scenario passes, saying why on its record."""
    job = trainer("reference_trainer", "--seed", "11", name="spoiled-search")
    record = ScenarioRecord(scenario="spoiled", job=job.name, seed=2)
    with Session(ROOT, workdir=tmp_path / "runs") as runner:
        reference = runner.reference(job)
        for step in reference.snapshots["steps"]:  # every copy loses its newest checkpoint
            snapshot = Path(reference.workdir + ".snapshots") / f"s{step}"
            shutil.rmtree(max(snapshot.glob("ckpt-*")))
        with record:  # the first plan from step 0 (the fresh start), the next from a spoiled copy
            tried = explore(
                runner, job, plans("sigkill@13", "sigkill@17"), settings=ExploreSettings(max_examples=2, seed=2)
            )
    assert record.passed and record.failing_plan is None, (record.failing_plan, record.verdict)
    assert any("searched again" in w for w in record.warnings), (record.warnings, record.runs)
    explained = [r for r in record.runs if r.get("shortcuts")]
    assert explained and "explained" in explained[0]["shortcuts"], record.runs
    assert tried >= 3 and all(r["passed"] for r in record.runs[-2:]), record.runs

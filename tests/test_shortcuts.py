"""The shortcuts' rule: a shortcut may save work, never decide (spotchaos/training/shortcuts.py).

A reused pass answers only the very same job: its key is every field of the job's dataclass. The
plans that fail through a shortcut and pass on the slow path are in test_prefix.py (a copy) and
test_warm_starts.py (a warm start); the audit is here.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import replace

import pytest

from spotchaos.config.container import ContainerSpec
from spotchaos.config.jobs import JobSpec
from spotchaos.config.logspec import LogSpec
from spotchaos.config.prices import CostInputs
from spotchaos.core import Allowed
from spotchaos.faults.plan import Plan
from spotchaos.search import ExploreSettings, explore
from spotchaos.session import ChaosFailure, Session
from spotchaos.training.shortcuts import verdict_key

from .helpers import FIXTURES, ROOT

# another value of each field of JobSpec: a field added without one here fails the first test
OTHER = {
    "name": "other",
    "command": ("python", "other.py"),
    "resume_command": ("python", "resume.py"),
    "env": (("SEED", "2"),),
    "cwd": "elsewhere",
    "grace_seconds": 2.0,
    "start_timeout_seconds": 30.0,
    "event_timeout_seconds": 5.0,
    "attempt_timeout_seconds": 60.0,
    "provider": "gcp",
    "platform": "kubernetes-job",
    "exit_after_notice": 143,
    "slurm_signal": "USR2@5",
    "watchdog_seconds": 12.0,
    "overhead_budget": 0.5,
    "checkpoint_budget_seconds": 1.0,
    "mtbf_seconds": 3600.0,
    "cost": CostInputs(spot_per_hour=1.0),
    "container": ContainerSpec(image="img"),
    "log": LogSpec(),
    "resume_args": ("--resume",),
    "resume_if_exists": "ckpt-*",
    "determinism_runs": 3,
    "exactness": "envelope",
    "envelope_factor": 2.0,
    "state_diff": False,
    "state_diff_ignore": ("trainer.pt:timestamp",),
    "phases": ("eval",),
    "parametrize": False,
    "storage": "s3",
    "launcher": "torchrun",
    "nproc_per_node": 2,
    "nnodes": 2,
    "max_restarts": 1,
    "rdzv_port": 29500,
    "shutdown_timeout_seconds": 5,
    "reshard_nproc_per_node": 1,
    "gpus": 1,
    "hang_timeout_seconds": 9.0,
    "framework": "lightning",
    "backend": "ray",
    "ray_resources": (("num_cpus", 1.0),),
    "notice": "kuberay",
    "warm": False,
    "preload": ("json",),
    "prefix": False,
    "snapshot_budget": 1,
    "cache_reference": False,
    "source": "test",
}


@pytest.mark.unit
def test_a_reused_verdict_is_keyed_by_every_field_of_the_job():
    """The key once left out the grace window, the provider, the ignore list, the timeouts and the
    name: a job with a 2-s window passed on the verdict of its 20-s twin. Derived from the
    dataclass, it covers a field added later without anyone listing it."""
    assert set(OTHER) == {f.name for f in dataclasses.fields(JobSpec)}, "a new JobSpec field needs a value here"
    base = JobSpec(name="job", command=("python", "job.py"))

    def changed(name: str, value: object) -> JobSpec:  # one field, whether or not it makes sense alone
        job = copy.copy(base)
        object.__setattr__(job, name, value)
        return job

    keys = {name: verdict_key(changed(name, value)) for name, value in OTHER.items()}
    assert verdict_key(base) == verdict_key(JobSpec(name="job", command=("python", "job.py")))
    unchanged = [name for name, key in keys.items() if key == verdict_key(base)]
    assert unchanged == [], f"changing {unchanged} left the key alone"


def test_a_plan_passed_by_one_job_runs_again_for_a_twin_that_differs_anywhere(tmp_path):
    """Two jobs with the same command and another grace window: the second runs the plan itself;
    the very same job asking again gets the first verdict, and a pass from a copy never answers a
    plan that must start from step 0."""
    command = ("python", str(FIXTURES / "reference_trainer.py"), "--steps", "12", "--step-seconds", "0")
    job = JobSpec(name="twin", command=command, grace_seconds=20)
    with Session(ROOT, workdir=tmp_path / "runs") as runner:
        plan = Plan.parse("sigterm@6")
        first, verdict = runner.run(job, plan, Allowed(prefix=True, reuse=True))
        assert verdict.passed and not first.reused and first.prefix_step is not None, verdict.message()
        same, _ = runner.run(job, plan, Allowed(prefix=True, reuse=True))
        assert same.reused
        fresh, _ = runner.run(job, plan, Allowed(prefix=False, reuse=True))
        assert not fresh.reused and fresh.prefix_step is None, "a copy's pass answered a plan from step 0"
        twin, _ = runner.run(replace(job, grace_seconds=2), plan, Allowed(prefix=True, reuse=True))
        assert not twin.reused, "the 2-s twin took the 20-s job's verdict"


def test_the_audit_runs_passes_through_a_shortcut_again_on_the_slow_path(tmp_path):
    """``--spotchaos-audit=N``: the first N passes per job through a shortcut are run again cold,
    from step 0. A correct job agrees and spends its audit; ``broken_cold_only``, right only when
    forked warm, passes warm and is caught: the verdict fails, naming the shortcut that passed it."""

    def job(script: str, name: str) -> JobSpec:
        command = ("python", str(FIXTURES / script), "--steps", "12", "--step-seconds", "0")
        return JobSpec(name=name, command=command, grace_seconds=10)

    good, cold_only = job("reference_trainer.py", "audited"), job("broken_cold_only.py", "cold-only")
    with Session(ROOT, workdir=tmp_path / "runs", audit=1) as runner:
        run, verdict = runner.run(good, Plan.parse("sigterm@6"), Allowed(prefix=True))
        assert verdict.passed and run.shortcuts is None, verdict.message()
        assert runner.shortcuts.take_audit(good) is False, "its one audit was spent"
        run, verdict = runner.run(cold_only, Plan.parse("sigterm@6"), Allowed(prefix=True))
        assert not verdict.passed, "the audit did not catch a pass only a warm start gives"
        first = verdict.failures[0]
        assert first.startswith("a shortcut passed a failing plan: through the start from the reference's copy"), first
        assert "warm start" in run.shortcuts["used"] and runner.shortcuts.off(cold_only) is not None
    with Session(ROOT, workdir=tmp_path / "unaudited") as runner:
        _, verdict = runner.run(cold_only, Plan.parse("sigterm@6"), Allowed(prefix=True))
        assert verdict.passed, "without the audit the warm pass stands (what the audit is for)"


@pytest.mark.unit
def test_a_sessions_runs_folder_is_its_own_users_alone(tmp_path):
    """The kept checkpoints of failing runs (and the copies plans start from) live below it: a
    folder the session makes is 0700, so no other local user reads a job's checkpoints there."""
    with Session(ROOT, workdir=tmp_path / "report" / "runs" / "stamp") as runner:
        assert runner.workdir.stat().st_mode & 0o777 == 0o700
        (runner.workdir / "kept").mkdir()  # so the folder outlives the session, as a failure's does
    assert (tmp_path / "report" / "runs" / "stamp").stat().st_mode & 0o777 == 0o700


def test_a_search_shrinks_through_its_shortcuts_and_settles_the_plan_it_reports_on_the_slow_path(tmp_path):
    """A search's failures steer its shrinking as they were judged (warm, from copies: as cheap as
    before); the one plan it reports is judged again on the slow path before it leaves. A job broken
    only warm is reported as the shortcut's disagreement; a job broken for real, by the slow path's
    own failure, and its other plans then run there."""

    def job(script: str, name: str) -> JobSpec:
        command = ("python", str(FIXTURES / script), "--steps", "12", "--checkpoint-every", "4", "--step-seconds", "0")
        return JobSpec(name=name, command=command, grace_seconds=10, state_diff=False)

    settings = ExploreSettings(max_examples=3, seed=1)
    warm_only, broken = job("broken_warm_only.py", "warm-only"), job("broken_no_optimizer_restore.py", "no-opt")
    with Session(ROOT, workdir=tmp_path / "runs") as runner:
        with pytest.raises(ChaosFailure) as caught:
            explore(runner, warm_only, settings=settings)
        first = caught.value.verdict.failures[0]
        assert "warm start changed the verdict" in first and "The cause is unknown" in first, first
        with pytest.raises(ChaosFailure) as caught:
            explore(runner, broken, settings=settings)
        assert not caught.value.verdict.failures[0].startswith("the "), caught.value.verdict.failures  # no disagreement
        assert "failed on the slow path too" in runner.shortcuts.off(broken)
        assert runner.shortcuts.take_deferred(broken, caught.value.plan) is None, "the reported plan was settled"


@pytest.mark.unit
def test_a_crash_point_that_never_fired_through_a_shortcut_is_explained_not_a_disagreement():
    """A shortcut's runs whose only failure is a crash point that never fired tested nothing: when the
    slow path fires it and passes, the pass stands and the report says why (the main job's false
    alarm of lightning-async, issue 59). A stand-in core: a crash point that misses from a copy and
    fires from step 0 cannot be made to happen on purpose."""
    from spotchaos.core.judging import slow_judged
    from spotchaos.training.shortcuts import Judged, Shortcuts
    from spotchaos.training.trajectory import RunRecord
    from spotchaos.training.verdict import Verdict

    plan = Plan.parse("crash@11+6")
    missed = "crash@11+6 never fired: attempt 0 made fewer than 6 file-system events after step 11 (...)"

    def verdict(failures: list[str]) -> Verdict:
        return Verdict(not failures, failures, None, [], [], [], 0, [], 24)

    def record(unfired: list[str]) -> RunRecord:
        return RunRecord(job="j", plan=str(plan), attempts=[], wall_seconds=0, workdir="", unfired=unfired)

    class Core:  # what slow_judged asks of a core
        def __init__(self, slow_failures: list[str]) -> None:
            self.slow_failures = slow_failures
            self.prefixes, self.shortcuts = self, Shortcuts()

        def judged(self, job, plan, start):
            return Judged(record([]), verdict(self.slow_failures))

        def failed(self, *args) -> None:
            pass

        def discard(self, record) -> None:
            pass

        def reference(self, job):
            return None

    job = JobSpec(name="async", command=("python", "job.py"))
    fast_record = record([missed])
    fast_record.missed_tries = [missed, missed]
    fast = Judged(fast_record, verdict([f"planned fault {missed}"]), used=("reference's checkpoint copy",))
    core = Core([])
    ran, passed = slow_judged(core, job, plan, fast, None)
    assert passed.passed
    assert "crash@11+6 never fired through it in 3 run(s)" in ran.shortcuts["explained"], ran.shortcuts
    elsewhere = Judged(record([]), verdict(["final weights differ"]), used=("warm start",))
    assert not slow_judged(Core([]), replace(job, name="other"), plan, elsewhere, None)[1].passed  # not a miss
    assert not slow_judged(Core(["the loss diverged"]), replace(job, name="third"), plan, fast, None)[1].passed

"""A job that is not deterministic on its own: its own verdict, or judged within its measured noise.

fixtures/broken_nondeterministic.py is the reference trainer with a 1e-7 run-to-run gradient
noise (from a generator nothing seeds, as GPU atomics or an unseeded RNG make); the broken
trainers get the same noise through SPOTCHAOS_FIXTURE_GRAD_NOISE and must still fail.
"""

from __future__ import annotations

import pytest

from spotchaos.config.jobs import JobSpec, job_from_mapping
from spotchaos.errors import ConfigError, NotDeterministic
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure
from spotchaos.strategies import preemption_plans
from spotchaos.training.determinism import Audit, Envelope, audit
from spotchaos.training.trajectory import Attempt, RunRecord

from .helpers import FIXTURES

NOISE = (("SPOTCHAOS_FIXTURE_GRAD_NOISE", "1e-7"),)
FULL = pytest.mark.full  # the full run's (pytest --spotchaos without -m): docs/ci.md


def trainer(script: str, *, noise: bool = False, **settings) -> JobSpec:
    command = ("python", str(FIXTURES / f"{script}.py"), "--steps", "16", "--checkpoint-every", "4")
    name = settings.pop("name", None) or script.replace("_", "-") + ("-noisy" if noise else "")
    return JobSpec(name=name, command=command, env=NOISE if noise else (), grace_seconds=10, **settings)


def test_a_noisy_job_fails_with_the_determinism_verdict_never_a_resume_one(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(trainer("broken_nondeterministic"), Plan.parse("sigkill@8"))
    message = str(failure.value)
    assert (
        "the job is not deterministic without any preemption: attempt 0 differs from the uninterrupted run" in message
    )
    assert "before sigkill after step 8 reached it" in message and "this is not a resume bug" in message
    assert "torch.use_deterministic_algorithms(True)" in message and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in message
    assert "resuming" not in message


def test_a_noisy_job_whose_noise_shows_only_after_the_restart_is_said_not_deterministic_first(runner):
    """Killed at its first step, before its noise shows: the restart's losses differ, which a resume
    cause would explain wrongly. A second uninterrupted run, made once, says first that the job is
    not deterministic (issue 60: "final weights differ" as the only explanation of such a job)."""
    with pytest.raises(NotDeterministic) as failure:
        runner.check(trainer("broken_nondeterministic", name="noise-after-restart"), Plan.parse("sigkill@0"))
    message = str(failure.value)
    assert "is not deterministic without any preemption" in message
    assert "a second uninterrupted run, made because a resumed run differed" in message
    assert "diverged" not in message


def test_repeated_uninterrupted_runs_say_where_they_part_and_how_far(runner):
    job = trainer("broken_nondeterministic", determinism_runs=3)
    with pytest.raises(NotDeterministic, match=r"not bit-reproducible: 3 uninterrupted runs differ; they first differ"):
        runner.reference(job)
    found = runner.audit(job)
    assert not found.reproducible and found.runs == 3 and found.max_loss_drift > 0
    assert found.first_difference["field"] == "loss" and found.varying_tensors


def test_a_deterministic_job_is_said_to_be_bit_reproducible(runner):
    found = runner.audit(trainer("reference_trainer", determinism_runs=2))
    assert found.reproducible and found.text().startswith("bit-reproducible: 2 uninterrupted runs agree")


@pytest.mark.parametrize(
    "plans",
    [
        # CI runs the notice search (one fault a plan: the envelope judged across a resume); the hard
        # kills and the chained search (three faults a plan) are the full run's
        lambda steps: preemption_plans(steps, faults=("sigterm",), max_preemptions=1),
        pytest.param(lambda steps: preemption_plans(steps, faults=("sigkill",), max_preemptions=1), marks=FULL),
        pytest.param(lambda steps: preemption_plans(steps, max_preemptions=3), marks=FULL),
    ],
    ids=["notice", "hard-kill", "chained"],
)
def test_under_envelope_mode_the_noisy_job_passes_the_preemption_scenarios(runner, plans):
    runner.explore(trainer("broken_nondeterministic", exactness="envelope"), plans)


def test_the_envelope_verdict_says_what_it_cannot_see(runner):
    verdict = runner.check(trainer("broken_nondeterministic", exactness="envelope"), Plan.parse("sigterm@6"))
    assert verdict.precision.startswith("within the envelope of 5 uninterrupted runs widened 6x")
    assert "a defect smaller than the job's own noise cannot be seen" in verdict.precision


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("broken_no_rng_restore", r"(loss|rng) diverged at step 8 \(attempt 1, the first step after resuming"),
        # a loss, a final tensor (in CI); an exact fingerprint, a missing step (the full run)
        pytest.param("broken_no_scheduler_restore", r"lr diverged at step 9 .*LR scheduler", marks=FULL),
        (
            "broken_no_optimizer_restore",
            r"(?s)final weights differ .*optimizer.0.step.*optimizer.pt:state.0.step: 12.0 vs 4.0",
        ),
        pytest.param("broken_step_off_by_one", r"step 8 is missing exactly where attempt 1 resumed", marks=FULL),
    ],
)
def test_resume_bugs_larger_than_the_noise_still_fail_under_envelope_mode(runner, script, message):
    with pytest.raises(ChaosFailure, match=message):
        runner.check(trainer(script, noise=True, exactness="envelope"), Plan.parse("sigterm@7"))


# The audit and the envelope alone, on records built by hand.


def _run(losses: list[float], fingerprints: list[dict] | None = None, digests: dict | None = None) -> RunRecord:
    events = [
        {"event": "step", "step": step, "loss": loss.hex(), "fp": (fingerprints or [{}] * len(losses))[step]}
        for step, loss in enumerate(losses)
    ]
    events.append({"event": "final", "step": len(losses) - 1, "digests": digests or {"w": "a"}})
    return RunRecord(
        job="j", plan="none", attempts=[Attempt(0, 0, 1.0, 0.1, events=events)], wall_seconds=1.0, workdir=""
    )


@pytest.mark.unit
def test_the_audit_finds_the_first_difference_and_the_spread():
    runs = [_run([1.0, 0.5, 0.25]), _run([1.0, 0.5, 0.2501]), _run([1.0, 0.5001, 0.25], digests={"w": "b"})]
    found = audit(runs)
    assert not found.reproducible and found.first_difference["step"] == 1
    assert found.loss_spread == {1: pytest.approx(1e-4), 2: pytest.approx(1e-4)}
    assert found.varying_tensors == ["w"]
    assert audit([_run([1.0, 0.5]), _run([1.0, 0.5])]).reproducible


@pytest.mark.unit
def test_the_envelope_widens_the_widest_spread_and_ignores_fingerprints_that_vary():
    fps = [{"lr": 0.1, "opt": "x"}, {"lr": 0.1, "opt": "y"}]
    found = audit([_run([1.0, 0.5], fps), _run([1.0, 0.5001], [{"lr": 0.1, "opt": "z"}, {"lr": 0.1, "opt": "w"}])])
    envelope = Envelope(found, factor=4)
    ref = _run([1.0, 0.5], fps).steps
    assert found.varying_fingerprints == ["opt"]
    assert envelope.step_differences(ref[1], _run([1.0, 0.5003], fps).steps[1]) == []  # inside 4x 1e-4
    assert envelope.step_differences(ref[1], _run([1.0, 0.501], fps).steps[1]) == ["loss"]
    assert envelope.step_differences(ref[0], _run([1.0003, 0.5], fps).steps[0]) == []  # the widest spread, anywhere
    assert envelope.step_differences(ref[0], _run([1.001, 0.5], fps).steps[0]) == ["loss"]
    changed = _run([1.0, 0.5], [{"lr": 0.2, "opt": "q"}, {"lr": 0.1, "opt": "q"}]).steps[0]
    assert envelope.step_differences(ref[0], changed) == ["lr"]  # equal in every uninterrupted run: exact


@pytest.mark.unit
@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"exactness": "close"}, r"exactness: must be 'bit' or 'envelope'"),
        ({"exactness": "envelope", "determinism_runs": 1}, r"determinism_runs: envelope mode measures .* at least 2"),
        ({"determinism_runs": 0}, r"determinism_runs: must be an integer from 1 to 20"),
        ({"envelope_factor": 0.5}, r"envelope_factor: must be a factor"),
    ],
)
def test_bad_determinism_settings_are_named(table, message):
    with pytest.raises(ConfigError, match=message):
        job_from_mapping("x", {"command": ["python", "t.py"], **table}, "pyproject.toml")


@pytest.mark.unit
def test_envelope_mode_measures_five_runs_unless_told():
    assert JobSpec(name="a", command=("x",), exactness="envelope").uninterrupted_runs == 5
    assert JobSpec(name="a", command=("x",)).uninterrupted_runs == 1
    # envelope mode runs the job differently (its final tensors are saved): never the bit job's reference
    assert JobSpec(name="a", command=("x",), exactness="envelope").key() != JobSpec(name="a", command=("x",)).key()
    assert isinstance(audit([_run([1.0])]), Audit)


@pytest.mark.unit
def test_a_final_tensor_may_stray_as_far_as_the_noisiest_tensor_relative_to_its_scale():
    """A bias's optimizer moment is one number: its own spread from two runs says nothing; the
    widest spread any tensor showed, relative to that tensor's scale, does."""
    found = audit([_run([1.0]), _run([1.0])], {"w": [1e-3, 1.0], "b": [1e-9, 0.5]})
    envelope = Envelope(found, factor=4)
    assert envelope.tensor_tolerance("b") == pytest.approx(4 * 1e-3 * 0.5)
    assert envelope.tensor_tolerance("w") == pytest.approx(4e-3)

"""Faults inside a phase the job marks (issue 61): ``sigterm@S/eval`` lands inside the first
evaluation after step S, held at the phase's start; a notice there must end the evaluation and
checkpoint within the grace window. The bundled ``reference-eval`` job runs the built-in scenario
in the main job (scenarios/test_phases.py); here the trainer that finishes its evaluation first."""

from __future__ import annotations

import pytest

from spotchaos.config.jobs import job_from_mapping
from spotchaos.errors import ConfigError
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure

from .helpers import FIXTURES, trainer_job

# 12 steps, checkpoints after 3, 7 and 11, an evaluation after step 5 (5 batches, 0.3 s each: 1.5 s)
EVAL = ("--eval-every", "6", "--eval-batches", "5", "--eval-seconds", "0.3")


def eval_job(script: str = "reference_trainer", **changes):
    return trainer_job(script, *EVAL, name=script.replace("_", "-") + "-eval", grace_seconds=1, **changes)


@pytest.mark.unit
def test_a_plan_names_a_phase_after_its_step_and_refuses_one_it_cannot_hold():
    plan = Plan.parse("sigterm@5/eval,sigkill@9/save:truncate-half~0.5")
    assert str(plan) == "sigterm@5/eval,sigkill@9/save:truncate-half~0.5"
    assert [p.phase for p in plan.preemptions] == ["eval", "save"]
    assert plan.to_dict()[0] == {"fault": "sigterm", "at_step": 5, "damage": None, "pick": 0.0, "phase": "eval"}
    for bad, says in (
        ("crash@3/eval", "a crash point or a rerun has no phase"),
        ("sigterm@3/", "no phase after '/'"),
        ("sigterm@3/9x", "a phase is a name the job reports"),
    ):
        with pytest.raises(ConfigError, match=says):
            Plan.parse(bad)
    with pytest.raises(ConfigError, match="'eval': the log adapter knows a phase by the line that begins it"):
        job_from_mapping("s", {"command": ["python", "s.py"], "phases": ["eval"], "log": {}}, "pyproject.toml")
    with pytest.raises(ConfigError, match=r"log.phases.eval: .* is not a regular expression RE2 can run"):
        job_from_mapping("s", {"command": ["python", "s.py"], "log": {"phases": {"eval": "(?=x)"}}}, "pyproject.toml")


@pytest.mark.full  # the main job lands these plans on reference-eval (scenarios/test_phases.py)
def test_a_notice_inside_an_evaluation_ends_it_and_the_resume_is_bit_exact(runner):
    run, verdict = runner.run(eval_job(), Plan.parse("sigterm@5/eval"))
    assert verdict.passed, verdict.message()
    fault = run.attempts[0].fault
    assert fault.held and fault.landed_step == 5, fault
    assert fault.inside == "the job's eval phase, begun after step 5", fault
    assert run.attempts[0].exit_code == 0 and run.attempts[0].wall_seconds < 60
    # a phase the job never begins after the step: a fault that never fired, not a pass
    _, verdict = runner.run(eval_job(), Plan.parse("sigterm@5/save"))
    assert not verdict.passed
    assert any("began no 'save' phase after step 5" in f for f in verdict.failures), verdict.failures


def test_a_job_that_finishes_its_evaluation_before_the_checkpoint_fails_naming_the_phase(runner):
    """Between steps the broken trainer checkpoints on SIGTERM like the reference one; only a notice
    inside its evaluation (1.5 s, the window 1 s) finds that it reads the flag between steps only."""
    broken = eval_job("broken_eval_ignores_notice")
    with pytest.raises(ChaosFailure) as failed:
        runner.check(broken, Plan.parse("sigterm@5/eval"))
    message = str(failed.value)
    assert "was still inside its 'eval' phase (begun after step 5, no end reported)" in message, message
    assert "is its checkpoint too slow" not in message, message
    # a phase the job never begins after the step: a fault that never fired, not a pass
    _, verdict = runner.run(broken, Plan.parse("sigterm@5/save"))
    assert any("began no 'save' phase after step 5" in f for f in verdict.failures), verdict.failures


def printed_eval_job(*extra: str):
    """plain_train.py through the log adapter: "Running evaluation" after every 6 steps, 5 batches
    of 0.6 s (3 s, the window 2 s: a script that leaves by sys.exit pays torch's teardown), and
    checkpoints after every 4."""
    command = ["python", str(FIXTURES / "plain_train.py"), "--out", "{checkpoint_dir}", "--steps", "14"]
    command += ["--save-every", "4", "--eval-every", "6", "--eval-seconds", "0.6", *extra]
    table = {
        "command": command,
        "resume_args": ["--resume"],
        "grace_seconds": 2,
        "phases": ["eval"],
        "warm": not extra,
        "log": {
            "pattern": r"step (?P<step>\d+) loss (?P<loss>[-+0-9.eE]+|nan|inf)",
            "checkpoints": "ckpt.pt",
            "checkpoint_step_key": "step",
            "final_weights": "ckpt.pt",
            "final_key": "model",
            "phases": {"eval": "^Running evaluation"},
        },
    }
    return job_from_mapping("printed-eval" + "".join(extra), table, "pyproject.toml")


@pytest.mark.full  # CI: the script that ignores the notice, below
def test_a_printed_phase_holds_an_unmodified_script_at_its_line_and_the_notice_lands_inside(runner):
    run, verdict = runner.run(printed_eval_job(), Plan.parse("sigterm@5/eval"))
    assert verdict.passed, verdict.message()
    fault = run.attempts[0].fault
    assert fault.held and fault.inside == "the job's eval phase, begun after step 5", fault


def test_a_printed_phase_holds_an_unmodified_script_at_its_line_and_names_a_notice_it_ignores(runner):
    """The log adapter knows the evaluation by the line that begins it: the hook holds the script
    there, the notice lands inside it; the script that runs its evaluation to its end is SIGKILLed
    inside it, and the verdict names the phase."""
    with pytest.raises(ChaosFailure) as failed:
        runner.check(printed_eval_job("--eval-ignores-notice"), Plan.parse("sigterm@5/eval"))
    message = str(failed.value)
    assert "was still inside its 'eval' phase (begun after step 5, no end reported)" in message, message
    assert "it reports no notice, so whether it saw the signal is unknown" in message, message  # not "received"

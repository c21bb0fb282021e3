"""What a resume loses besides weights (issue 61): the logger's run, the steps it logs, the best
checkpoint. Optional probe events, checked when a job reports them."""

from __future__ import annotations

import pytest

from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure
from spotchaos.training.continuity import continuity_failures
from spotchaos.training.trajectory import Attempt

from .helpers import trainer_job


def logging_job(*broken: str):
    return trainer_job("logging_trainer", *broken, name="logging-" + ("-".join(b.strip("-") for b in broken) or "ok"),
                       grace_seconds=10, warm=not broken)  # fmt: skip


@pytest.mark.full  # CI: the trainer with all three defects, below
def test_a_resume_that_keeps_the_loggers_run_steps_and_best_passes(runner):
    """Killed after step 9, resumed from the checkpoint after step 7: the correct trainer writes on
    to its logger run (its id in the checkpoint is no state difference) from step 8 and keeps its best."""
    run, verdict = runner.run(logging_job(), Plan.parse("sigkill@9"))
    assert verdict.passed, verdict.failures
    assert run.attempts[1].of_kind("logged")[0]["step"] == 8


def test_a_resume_that_loses_the_loggers_run_steps_and_best_fails_naming_each(runner):
    """The broken trainer (all three defects) fails with each named, though every loss and weight matches."""
    with pytest.raises(ChaosFailure) as failed:
        runner.check(logging_job("--fresh-run-id", "--log-step-from-zero", "--forget-best"), Plan.parse("sigkill@9"))
    message = str(failed.value)
    assert "loss diverged" not in message and "final weights differ" not in message, message
    assert "the logger's run changed across a resume: attempt 0 wrote to run" in message, message
    assert "attempt 1 logged step 0 after resuming from step 7: the logger's step counter began again" in message
    assert "attempt 1 replaced the best checkpoint with a worse one" in message, message
    assert "where the checkpoint it resumed from (after step 7) already knew" in message, message


def attempt(index: int, *events: dict) -> Attempt:
    return Attempt(index, 0, 1.0, None, events=[{"rank": 0, **e} for e in events])


@pytest.mark.unit
def test_a_best_lost_with_its_attempt_may_come_back_worse_on_the_replay_but_not_one_the_checkpoint_knew():
    best = [{"event": "best", "step": 4, "score": 0.5}, {"event": "best", "step": 9, "score": 0.3}]
    first = attempt(0, *best)
    # resumed from step 7: the 0.3 of step 9 was lost with attempt 0; 0.45 after step 8 is allowed
    replay = attempt(1, {"event": "resume", "from_step": 7}, {"event": "best", "step": 8, "score": 0.45})
    assert continuity_failures([first, replay]) == []
    forgot = attempt(1, {"event": "resume", "from_step": 7}, {"event": "best", "step": 8, "score": 0.6})
    (failure,) = continuity_failures([first, forgot])
    assert "score 0.6 after step 8" in failure and "already knew 0.5 (attempt 0, step 4)" in failure
    maximised = [{"event": "best", "step": 2, "score": 0.9, "mode": "max"}]
    lower = attempt(1, {"event": "resume", "from_step": 3}, {"event": "best", "step": 4, "score": 0.8, "mode": "max"})
    assert len(continuity_failures([attempt(0, *maximised), lower])) == 1
    # logged steps: after step 7 resumed, 8 on; a step back within an attempt is named too
    logs = attempt(
        1, {"event": "resume", "from_step": 7}, {"event": "logged", "step": 8}, {"event": "logged", "step": 8}
    )
    assert continuity_failures([attempt(0), logs]) == [
        "attempt 1 logged step 8 after step 8: logged steps must increase"
    ]
    # no events: nothing checked
    assert continuity_failures([attempt(0), attempt(1, {"event": "resume", "from_step": 3})]) == []

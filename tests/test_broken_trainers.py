"""Each deliberately broken trainer in fixtures/ fails, and the message names its defect."""

from __future__ import annotations

import pytest

from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure

from .helpers import trainer_job

CASES = [
    pytest.param(
        trainer_job("broken_no_rng_restore"),
        "sigterm@5",  # the notice lands in step 5 or 6, whichever the trainer is in: it saves after that one
        r"loss diverged at step \d+ \(attempt 1, the first step after resuming from step \d+\)"
        r".*also differs at that step: rng.*RNG state not saved or not restored",
        id="no-rng-restore",
    ),
    pytest.param(
        trainer_job("broken_no_scheduler_restore"),
        "sigkill@9",
        r"lr diverged at step 9 \(attempt 1, 2 steps after resuming from step 7\).*LR scheduler",
        id="no-scheduler-restore",
    ),
    pytest.param(
        trainer_job("broken_epoch_restart"),
        "sigterm@10",
        r"diverged at step \d+ \(attempt 1, the first step after resuming from step \d+\)"
        r".*batch.*position in the epoch not restored",
        id="epoch-restart",
    ),
    pytest.param(
        trainer_job("broken_ignores_sigterm", "--step-seconds", "0.25", grace_seconds=1.5),
        "sigterm@3",
        r"grace window exceeded: the job did not exit within 1.5 s of sigterm after step \d+ \(attempt 0\)",
        id="ignores-sigterm",
    ),
    pytest.param(
        trainer_job("broken_sigterm_only", "--step-seconds", "0.25", grace_seconds=1.5),
        "gcp-notice@3",
        r"grace window exceeded: the job did not exit within 1.5 s of gcp-notice after step \d+ \(attempt 0\), a "
        r"reclaim notice posted on gcp's instance metadata with no SIGTERM.*it read preempted 0 time\(s\), never "
        r"after the notice: poll the metadata",
        id="sigterm-only-on-gcp",
    ),
    pytest.param(
        trainer_job("broken_workers_die_on_sigterm", "--num-workers", "2"),
        "sigterm-group@5",
        r"exited with status 1 .* after sigterm-group .*DataLoader workers",
        id="workers-die-on-group-sigterm",
    ),
    pytest.param(
        trainer_job("broken_no_optimizer_restore"),
        "sigterm@5",
        r"diverged at step \d+ \(attempt 1, the first step after resuming from step \d+\)"
        r".*opt.*optimizer state \(moments, step counts\) not saved or not restored",
        id="no-optimizer-restore",
    ),
    pytest.param(
        trainer_job("broken_optimizer_saved_before_step"),
        "sigterm@5",
        r"diverged at step \d+ \(attempt 1, the first step after resuming"
        r".*opt.*saved before the optimizer step finished",
        id="optimizer-saved-before-step",
    ),
    pytest.param(
        trainer_job("broken_step_off_by_one"),
        "sigterm@5",
        r"step \d+ is missing exactly where attempt 1 resumed: is the step counter restored off by one",
        id="step-off-by-one",
    ),
    pytest.param(
        trainer_job("broken_set_epoch_zero"),
        "sigterm@10",  # resumes in epoch 1 (8 batches per epoch): epoch 0's shuffle comes back
        r"diverged at step \d+ \(attempt 1, the first step after resuming.*also differs at that step: batch"
        r".*data order or position in the epoch not restored",
        id="set-epoch-zero",
    ),
    pytest.param(
        trainer_job("broken_epoch_boundary_replay"),
        "sigkill@9",  # resumes from the checkpoint after step 7: exactly the end of epoch 0
        r"diverged at step 8 \(attempt 1, the first step after resuming from step 7\).*batch"
        r".*data order or position in the epoch not restored",
        id="epoch-boundary-replay",
    ),
]


@pytest.mark.parametrize(("job", "plan", "message"), CASES)
def test_broken_trainer_fails_for_its_own_reason(runner, job, plan, message):
    with pytest.raises(ChaosFailure, match=message) as info:
        runner.check(job, Plan.parse(plan))
    assert str(info.value.plan) == plan


def test_workers_trainer_passes_when_only_the_main_process_is_notified(runner):
    """The DataLoader defect needs the group-wide notice to show: that is why both kinds exist."""
    job = trainer_job("broken_workers_die_on_sigterm", "--num-workers", "2")
    assert runner.check(job, Plan.parse("sigterm@5")).passed

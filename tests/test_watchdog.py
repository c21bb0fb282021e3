"""A job's own hang handling (issue 61): a rank hangs, and the job's watchdog must end it non-zero
within ``watchdog_seconds``; the harness's hang detection is the backstop, and a hang it had to end
is the job's failure, named apart from the hang."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure

from .test_distributed import ddp_job


def watchdog_job(**changes):
    """The bundled ddp-watchdog job (collective timeout 8 s, torchrun's teardown 5 s), 12 steps."""
    job = ddp_job(name="ddp-watchdog", **changes)
    return replace(job, command=(*job.command, "--steps", "12", "--every", "3"))


@pytest.mark.full  # the main job runs it on ddp-watchdog (scenarios/test_watchdog.py); CI fails the broken one
def test_a_hung_rank_ended_by_the_jobs_own_collective_timeout_passes(runner):
    run, verdict = runner.run(watchdog_job(), Plan.parse("hang-rank1@4"))
    assert verdict.passed, verdict.failures
    hung = next(a for a in run.attempts if a.fault is not None)
    assert hung.fault.hang_detected_seconds is None, hung.fault.detail  # the job ended itself
    assert hung.exit_code not in (0, None)


def test_a_job_without_a_collective_timeout_fails_naming_the_backstop(runner):
    job = ddp_job(name="ddp-watchdog")
    command = [part for part in job.command if part not in ("--collective-timeout", "8")]
    # cold, as the suite starts every broken job (tests/helpers.py): the slow path its user sees, once
    no_timeout = replace(job, command=(*command, "--steps", "12", "--every", "3"), name="ddp-no-watchdog", warm=False)
    with pytest.raises(ChaosFailure) as failed:
        runner.check(no_timeout, Plan.parse("hang-rank1@4"))
    message = str(failed.value)
    assert "the job's own watchdog did not end it: hang-rank1 after step 4" in message
    assert "past watchdog_seconds = 8 and torchrun's 5-s teardown" in message
    assert "the harness's hang detection (its backstop) ended it" in message


@pytest.mark.unit
def test_the_harness_backstop_waits_for_the_watchdog_and_the_teardown():
    from spotchaos.config.jobs import JobSpec

    job = JobSpec(name="j", command=("python", "t.py"), launcher="torchrun", nproc_per_node=2, hang_timeout_seconds=10)
    assert job.hang_seconds == 10
    watched = replace(job, watchdog_seconds=8, shutdown_timeout_seconds=5)
    assert watched.hang_seconds == 8 + 5 + 15

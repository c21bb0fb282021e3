"""The reference trainer with its checkpoints in S3 (moto over HTTP on loopback, behind the fault
proxy): resumes bit-exact, a preemption during a slow upload keeps the previous checkpoint the
newest valid one, and a credential fault ends the job with a clear message that leaks no secret."""

from __future__ import annotations

import pytest

from spotchaos.plan import Plan
from spotchaos.runner import BudgetFailure, ChaosRunner
from spotchaos.storage import Bandwidth, ExpiredToken, InvalidCredentials, ReadOnly

from .helpers import ROOT, trainer_job


@pytest.fixture(scope="module")
def s3_runner(tmp_path_factory):
    runner = ChaosRunner(ROOT, workdir=tmp_path_factory.mktemp("s3-runs"))
    yield runner
    runner.close()


def s3_job(*args: str, name: str = "s3"):
    return trainer_job("reference_trainer", *args, name=name, storage="s3")


def test_preemption_during_a_slow_upload_keeps_the_previous_checkpoint(s3_runner):
    job = s3_job(name="s3-slow")
    s3_runner.reference(job)
    throttle = s3_runner.s3.add(Bandwidth(bytes_per_second=40_000, downloads=False))
    try:
        # step 7 ends, the checkpoint after it starts uploading (about 2 s at this rate): kill now
        record, verdict = s3_runner.run(job, Plan.parse("sigkill@7"))
    finally:
        throttle.enabled = False
    assert verdict.passed, verdict.message()  # bit-exact, resumed from S3
    assert [e["step"] for e in record.attempts[0].of_kind("checkpoint")] == [3]  # the torn one was never durable
    resume = record.attempts[1].of_kind("resume")[0]
    assert resume["from_step"] == 3 and resume["uri"].startswith("s3://spotchaos-") and "/ckpt/ckpt-" in resume["uri"]


@pytest.mark.parametrize(
    "fault",
    [InvalidCredentials(), ExpiredToken(after_seconds=4.0), ReadOnly()],
    ids=["bad-credentials-at-start", "expiring-mid-run", "read-only"],
)
def test_credential_faults_end_the_job_clearly_and_change_nothing(s3_runner, fault):
    # 40 steps of 0.1 s: the restart is still training when a mid-run expiry (4 s) strikes
    job = s3_job("--steps", "40", "--step-seconds", "0.1", name="s3-refused")
    figures = s3_runner.check_storage_refusal(job, fault)
    assert figures["passed"] and figures["objects_before"] >= 4 and figures["objects_changed"] == []
    code = {"invalid-credentials": "InvalidAccessKeyId", "expired-token": "ExpiredToken", "read-only": "AccessDenied"}
    assert "S3 refused" in figures["job_message"] and code[fault.name] in figures["job_message"]
    assert "exited with status 3" in figures["job_message"] and figures["leaks"] == []


def test_trainer_that_prints_its_credentials_is_caught(s3_runner):
    job = trainer_job("broken_s3_leaks_secret", name="s3-leaky", storage="s3")
    with pytest.raises(BudgetFailure, match=r"the run's secret \(or its first 8 characters\) appears in: .*stderr.log"):
        s3_runner.check_storage_refusal(job, ExpiredToken())


def test_trainer_that_retries_forever_on_expired_token_is_caught(s3_runner):
    job = trainer_job("broken_s3_retries_forever", name="s3-forever", storage="s3", event_timeout=4)
    with pytest.raises(BudgetFailure, match=r"did not end with a non-zero exit: .*hangs: no event for 4 s"):
        s3_runner.check_storage_refusal(job, ExpiredToken())

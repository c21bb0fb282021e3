"""Checkpoints in S3 under storage chaos: moto over HTTP on 127.0.0.1 behind a fault proxy, a fresh
bucket and IAM user per run (moto checks signatures and policies like AWS does).

The seed: slow storage turns checkpoints into the bottleneck, and a wrong or expired token must
end in a controlled failure that reveals no secret.
"""

from __future__ import annotations

import pytest

from spotchaos.storage import ExpiredToken, ReadOnlyKey, ResetMidUpload, SlowDown, UnknownAccessKey

pytestmark = pytest.mark.spotchaos(jobs=["reference-s3"])


def test_preempted_during_a_slow_upload(spotchaos, spotchaos_job):
    """Killed inside a checkpoint upload: the previous checkpoint stays the newest valid one."""
    spotchaos.check_upload_preemption(spotchaos_job)


def test_slowdown_storm_stays_within_the_checkpoint_budget(spotchaos, spotchaos_job):
    """503 SlowDown on a fifth of the requests, then a hard kill: every checkpoint completes
    within checkpoint_budget_seconds or is given up and reported, and the resume is bit-exact."""
    last = spotchaos.checkpoint_steps(spotchaos_job)[-1]
    spotchaos.check_storage(spotchaos_job, f"sigkill@{last + 1}", [SlowDown(probability=0.2, seed=7)])


def test_connection_reset_mid_upload(spotchaos, spotchaos_job):
    """Half the uploads are cut off 4 KiB in (RST): retried, never half-landed, resume bit-exact."""
    last = spotchaos.checkpoint_steps(spotchaos_job)[-1]
    spotchaos.check_storage(spotchaos_job, f"sigkill@{last + 1}", [ResetMidUpload(after_bytes=4096, probability=0.5)])


@pytest.mark.parametrize("refusal", ["unknown-key", "read-only-key", "expiring-token"])
def test_refused_credentials_end_the_job_clearly(spotchaos, spotchaos_job, refusal):
    """A key S3 never issued, a key that may only read, a token that expires once the restart runs:
    a non-zero exit naming the error, every checkpoint object unchanged, the secret nowhere."""
    fault = {
        "unknown-key": UnknownAccessKey(),
        "read-only-key": ReadOnlyKey(),
        "expiring-token": ExpiredToken(after_seconds=0.3),  # 0.3 s after the restart's first request: training
    }[refusal]
    spotchaos.check_storage_refusal(spotchaos_job, fault)

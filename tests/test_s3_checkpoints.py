"""The storage scenarios against broken trainers (the reference passes them in scenarios/test_storage.py):
each defect is caught with a message that names it. Also the two ways through a SlowDown storm
(give a checkpoint up and say so; block past the budget) and the session-end scan for the run's
secret in the report and the JUnit XML."""

from __future__ import annotations

import pytest

from spotchaos.session import Session, StorageFailure
from spotchaos.storage import ExpiredToken, Latency, SlowDown

from .helpers import FIXTURES, ROOT, run_pytest, trainer_job


@pytest.fixture(scope="module")
def s3_runner(tmp_path_factory):
    runner = Session(ROOT, workdir=tmp_path_factory.mktemp("s3-runs"))
    yield runner
    runner.close()


def s3_job(script: str = "reference_trainer", *args: str, name: str | None = None, **kwargs):
    return trainer_job(script, *args, name=name or script, storage="s3", **kwargs)


def test_latest_pointer_written_before_the_data_is_caught(s3_runner):
    with pytest.raises(
        StorageFailure,
        match=r"(?s)killed while the checkpoint after step 7 was uploading.*NoSuchKey.*"
        r"upload the data objects first, then the manifest, then the latest pointer",
    ):
        s3_runner.check_upload_preemption(s3_job("broken_s3_latest_first"))


def test_trainer_that_crashes_when_throttled_is_caught(s3_runner):
    job = s3_job("broken_s3_crashes_when_throttled")
    with pytest.raises(StorageFailure, match=r"(?s)under slow-down.*SlowDown.*must be retried"):
        s3_runner.check_storage(job, "sigkill@9", [SlowDown(probability=0.25, seed=7)])


def test_retries_that_draw_from_the_training_rng_are_caught(s3_runner):
    job = s3_job("broken_s3_retries_share_rng", "--steps", "8")  # it diverges before any preemption
    with pytest.raises(StorageFailure, match=r"(?s)loss diverged at step \d+ \(attempt 0\).*botocore's retry jitter"):
        s3_runner.check_storage(job, "", [SlowDown(probability=0.25, seed=7)])


def test_a_checkpoint_given_up_and_reported_passes_the_storm(s3_runner):
    # a deadline no upload can meet: every checkpoint is given up (probe.checkpoint_failed) and
    # training goes on; the restart starts over, still bit-exact
    job = s3_job("reference_trainer", "--steps", "10", "--checkpoint-deadline", "0.001", name="s3-gives-up")
    figures = s3_runner.check_storage(job, "sigkill@5", [SlowDown(probability=0.25, seed=7)])
    outcomes = {c["outcome"] for c in figures["checkpoints"]}
    assert outcomes == {"given up"} and figures["acted"]["slow-down"] > 0


def test_a_checkpoint_over_the_budget_fails_with_the_figure(s3_runner):
    job = s3_job("reference_trainer", "--steps", "6", name="s3-slow-budget", checkpoint_budget_seconds=0.5)
    with pytest.raises(
        StorageFailure,
        match=r"the checkpoint after step 3 held training up for \d+\.\d s, over the "
        r"checkpoint budget of 0.5 s \(checkpoint_budget_seconds\)",
    ):
        s3_runner.check_storage(job, "", [Latency(seconds=0.2)])


def test_credentials_expiring_while_the_restart_trains(s3_runner):
    # 40 steps of 0.1 s: the restart is training when the token expires (1.5 s after its first request,
    # the listing of checkpoints, however long its start-up took)
    job = s3_job("reference_trainer", "--steps", "40", "--step-seconds", "0.1", name="s3-expiring")
    figures = s3_runner.check_storage_refusal(job, ExpiredToken(after_seconds=1.5))
    assert figures["passed"] and figures["objects_changed"] == [] and figures["leaks"] == []
    assert "ExpiredToken" in figures["job_message"] and "in attempt 1 after step" in figures["job_message"]


def test_trainer_that_prints_its_credentials_is_caught(s3_runner):
    job = s3_job("broken_s3_leaks_secret")
    with pytest.raises(
        StorageFailure, match=r"the run's secret \(or 8 characters of it, or its encoding\) appears in: .*stderr.log"
    ):
        s3_runner.check_storage_refusal(job, ExpiredToken())


def test_trainer_that_retries_forever_on_expired_token_is_caught(s3_runner):
    job = s3_job("broken_s3_retries_forever", event_timeout_seconds=4)
    with pytest.raises(StorageFailure, match=r"did not end with a non-zero exit: .*hangs: no event for 4 s"):
        s3_runner.check_storage_refusal(job, ExpiredToken())


@pytest.mark.parametrize(
    "mode",
    # CI runs the harder case, a secret a worker wrote; one process alone is the full run's (docs/ci.md)
    [pytest.param(["-p", "no:xdist"], marks=pytest.mark.full), ["-n", "2"]],
    ids=["one-process", "xdist-workers"],
)
def test_a_secret_that_reaches_the_junit_xml_fails_the_session(tmp_path, mode):
    """Redaction is checked, not trusted: a test that records the run's secret as a JUnit property
    (past every redaction) turns a green session red, naming the file. Under pytest-xdist the secret
    is made in a worker, and the controller that writes the XML must still know it."""
    (tmp_path / "pyproject.toml").write_text(
        "[tool.spotchaos.jobs.s3]\n"
        f'command = ["python", "{FIXTURES / "reference_trainer.py"}", "--steps", "8", "--checkpoint-every", "4"]\n'
        'storage = "s3"\n'
    )
    (tmp_path / "test_leak.py").write_text(
        "from spotchaos.storage import UnknownAccessKey\n\n"
        "def test_refused(spotchaos, spotchaos_job, record_property):\n"
        "    spotchaos.check_storage_refusal(spotchaos_job, UnknownAccessKey())\n"
        "    record_property('debug', spotchaos.session.secrets[0])\n"
    )
    result = run_pytest(tmp_path, *mode, "--spotchaos", "--junitxml=junit.xml", "test_leak.py")
    assert "1 passed" in result.stdout, result.stdout[-2000:]
    assert result.returncode == 1, result.stdout[-2000:]
    assert "a secret (or 8 characters of one, or its encoding) appears in:" in result.stdout
    assert "junit.xml" in result.stdout.split("appears in:")[1].splitlines()[0]
    assert "report.json" not in result.stdout.split("appears in:")[1].splitlines()[0]

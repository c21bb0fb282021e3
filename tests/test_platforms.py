"""The exit status after a notice as the platform reads it (issue 61): exit 0 is the contract's
default, but a Kubernetes Job counts it Succeeded and never retries it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotchaos.config.exit_status import ExitExpectation, expectation
from spotchaos.config.jobs import job_from_mapping
from spotchaos.errors import ConfigError
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure

from .helpers import trainer_job


def k8s_job(exit_status: int, **table) -> object:
    args = ("--exit-after-notice", str(exit_status))
    return trainer_job("reference_trainer", *args, name=f"k8s-exit-{exit_status}", grace_seconds=10, **table)


@pytest.mark.full  # the main job: the notice scenario on kubernetes-job (scenarios/test_platforms.py); CI: exit 0
def test_a_kubernetes_job_that_exits_143_after_its_checkpoint_passes(runner):
    run, verdict = runner.run(k8s_job(143, platform="kubernetes-job"), Plan.parse("sigterm@6"))
    assert verdict.passed, verdict.failures
    assert run.attempts[0].exit_code == 143 and verdict.warnings == []


def test_a_kubernetes_job_that_exits_0_after_its_notice_fails_naming_the_platform(runner):
    with pytest.raises(ChaosFailure) as failed:
        runner.check(k8s_job(0, platform="kubernetes-job", warm=False), Plan.parse("sigterm@6"))
    message = str(failed.value)
    assert "the job exited 0" in message and "ends it for good" in message
    assert "Kubernetes Job counts exit 0 as Succeeded" in message and "exit non-zero" in message


@pytest.mark.full  # the full run's: CI gates the platform both ways above (docs/ci.md)
def test_exit_0_on_kubernetes_passes_the_contract_with_a_warning_on_the_verdict(runner):
    _, verdict = runner.run(k8s_job(0, provider="kubernetes"), Plan.parse("sigterm@6"))
    assert verdict.passed, verdict.failures
    assert len(verdict.warnings) == 1 and "would not be run again" in verdict.warnings[0]


@pytest.mark.full  # the full run's: CI gates the platform both ways above (docs/ci.md)
def test_a_declared_status_is_held_to(runner):
    with pytest.raises(ChaosFailure, match=r"exited with status 143 .*exit_after_notice expects 3"):
        runner.check(k8s_job(143, exit_after_notice=3), Plan.parse("sigterm@6"))


@pytest.mark.unit
def test_a_process_killed_by_sigterm_is_143_where_the_platform_reads_it():
    assert ExitExpectation(143).matches(-15) and ExitExpectation(143).matches(143)
    assert not ExitExpectation(143).matches(0) and not ExitExpectation(143).matches(1)
    assert ExitExpectation("nonzero").matches(1) and not ExitExpectation("nonzero").matches(0)
    assert ExitExpectation("any").matches(None) and not ExitExpectation(0).matches(None)
    assert expectation(None, "slurm-requeue", None).expected == "any"
    assert expectation(None, None, None).expected == 0 and expectation(None, None, "kubernetes").ends_on_zero


@pytest.mark.unit
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("exit_after_notice", "sometimes", 'must be 0, "nonzero", "any" or an exit status'),
        ("exit_after_notice", 300, "must be 0"),
        ("platform", "nomad", "unknown platform 'nomad' .known: kubernetes-job, wandb-sweep"),
    ],
)
def test_a_wrong_exit_expectation_is_one_clear_error(key, value, message):
    with pytest.raises(ConfigError, match=message):
        job_from_mapping("j", {"command": ["python", "t.py"], key: value}, "pyproject.toml")


def slurm_job(name: str, *args: str, platform: str = "slurm-requeue", signal: str = "USR1@2") -> object:
    """The reference trainer on a Slurm partition; a broken form (no requeue, no handler) starts
    cold, as the suite starts every broken job (tests/helpers.py)."""
    warm = "--requeue-signal" in args and "--no-requeue" not in args
    return trainer_job(
        "reference_trainer", *args, name=name, grace_seconds=10, platform=platform, slurm_signal=signal, warm=warm
    )


@pytest.mark.full  # the main job's Slurm scenario on slurm-requeue (scenarios/test_slurm.py); CI: its broken forms
def test_a_slurm_job_that_checkpoints_and_requeues_on_the_warning_resumes_bit_exact(runner):
    """Slurm's warning (USR1, as Lightning's SLURMEnvironment listens), SIGTERM after its lead,
    SIGKILL after KillWait: the job checkpoints, asks `scontrol requeue $SLURM_JOB_ID` and runs again."""
    run, verdict = runner.run(slurm_job("slurm-requeues", "--requeue-signal", "USR1"), Plan.parse("slurm-usr1@6"))
    assert verdict.passed, verdict.failures
    assert run.attempts[0].requeued is True and run.attempts[0].fault.fault == "slurm-usr1"
    assert run.attempts[0].exit_code == 0 and run.attempts[0].fault.grace_seconds == 12  # lead 2 + KillWait 10


@pytest.mark.full  # the full run's: CI gates the platform both ways above (docs/ci.md)
def test_submitits_usr2_warning_is_the_same_contract(runner):
    job = slurm_job("slurm-usr2", "--requeue-signal", "USR2", signal="submitit")
    assert job.slurm_signal == "USR2@90"
    job = slurm_job("slurm-usr2", "--requeue-signal", "USR2", signal="USR2@2")
    assert runner.check(job, Plan.parse("slurm-usr2@5")).passed


def test_a_slurm_job_that_exits_without_requeueing_fails_naming_it(runner):
    with pytest.raises(ChaosFailure) as failed:
        runner.check(
            slurm_job("slurm-no-requeue", "--requeue-signal", "USR1", "--no-requeue"), Plan.parse("slurm-usr1@6")
        )
    message = str(failed.value)
    assert "attempt 0 ended after slurm-usr1 after step 6 without asking Slurm to requeue it" in message
    assert "scontrol requeue $SLURM_JOB_ID" in message


@pytest.mark.full  # the full run's: CI gates the platform both ways above (docs/ci.md)
def test_a_slurm_job_that_ignores_the_warning_signal_is_ended_by_it_and_fails(runner):
    """No handler for USR1: its default action ends the process, with nothing saved."""
    with pytest.raises(ChaosFailure, match=r"no checkpoint at or after step 6 after slurm-usr1|exited with status -10"):
        runner.check(slurm_job("slurm-no-handler"), Plan.parse("slurm-usr1@6"))


@pytest.mark.full  # the full run's: CI gates the platform both ways above (docs/ci.md)
def test_in_cancel_mode_no_requeue_is_asked_and_each_attempt_is_a_new_job(runner):
    job = slurm_job("slurm-cancel", "--requeue-signal", "USR1", "--no-requeue", platform="slurm-cancel")
    run, verdict = runner.run(job, Plan.parse("slurm-usr1@6"))
    assert verdict.passed, verdict.failures
    assert run.attempts[0].requeued is False


@pytest.mark.unit
def test_the_slurm_stand_in_keeps_the_job_id_on_requeue_and_records_scontrol(tmp_path):
    import json
    import subprocess

    from spotchaos.faults import slurm

    assert slurm.job_id("abcdef123456", 0, True) == slurm.job_id("abcdef123456", 3, True)
    assert slurm.job_id("abcdef123456", 0, False) != slurm.job_id("abcdef123456", 1, False)
    env = slurm.with_path({**slurm.environment(tmp_path, "train", "abcdef123456", 2, True), "PATH": "/usr/bin"})
    assert env["SLURM_RESTART_COUNT"] == "2" and env["PATH"].startswith(str(tmp_path / "slurm-bin"))
    done = subprocess.run(["scontrol", "requeue", env["SLURM_JOB_ID"]], env=env, check=False)
    assert done.returncode == 0
    assert json.loads((tmp_path / slurm.SCONTROL_LOG).read_text())["argv"] == ["requeue", env["SLURM_JOB_ID"]]
    assert slurm.requeued(tmp_path, env["SLURM_JOB_ID"]) and not slurm.requeued(tmp_path, "1")


@pytest.mark.unit
@pytest.mark.parametrize("value", ["USR3@90", "USR1", "USR1@-1", "TERM@5", 90])
def test_a_wrong_slurm_signal_is_one_clear_error(value):
    with pytest.raises(ConfigError, match=r'slurm_signal: must be "USR1@SECONDS" or "USR2@SECONDS"'):
        job_from_mapping("j", {"command": ["python", "t.py"], "slurm_signal": value}, "pyproject.toml")


def lightning_slurm(*args: str) -> object:
    """The bundled Lightning job with Lightning's own ``SLURMEnvironment(auto_requeue=True)``."""
    from spotchaos.config.jobs import load_settings

    from .helpers import ROOT

    declared = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == "lightning-slurm")
    label = "-".join(("lightning-slurm", *(a.strip("-") for a in args)))
    return replace(declared, name=label, command=declared.command + args, grace_seconds=10, warm="hpc" not in args)


@pytest.mark.full  # the main job runs the built-in Slurm scenario on it (scenarios/test_slurm.py)
def test_lightnings_own_slurm_handler_saves_requeues_and_resumes_bit_exact(runner):
    """Lightning's SLURMEnvironment as its docs show it: USR1 saves hpc_ckpt_1.ckpt from inside the
    signal handler and calls `scontrol requeue`; SIGTERM 2 s later stops the fit at a step's end
    with its own checkpoint, and the requeued job resumes from the newest, bit-exact."""
    run, verdict = runner.run(lightning_slurm(), Plan.parse("slurm-usr1@6"))
    assert verdict.passed, verdict.failures
    assert run.attempts[0].requeued is True and len(run.attempts) == 2
    saved = [(e["step"], e.get("uri")) for e in run.attempts[0].of_kind("checkpoint")]
    assert any(step == 6 and "hpc_ckpt_1.ckpt" in str(uri) for step, uri in saved), saved


def test_lightnings_own_resume_on_slurm_misreads_a_sidecar_as_a_checkpoint_version(runner):
    """`trainer.fit(ckpt_path=None)` on Slurm resumes from the newest hpc_ckpt_N.ckpt, N read from
    every name holding "hpc_ckpt_" with its non-digits dropped: the digest beside hpc_ckpt_1.ckpt
    (hpc_ckpt_1.ckpt.sha256) reads as version 1256, a file that is not there (Lightning 2.6.6)."""
    with pytest.raises(ChaosFailure) as failed:
        runner.check(lightning_slurm("--slurm-resume", "hpc", "--step-seconds", "0.1"), Plan.parse("slurm-usr1@6"))
    message = str(failed.value)
    assert "the restart after slurm-usr1 after step 6, exited with status 1 before its first step" in message, message
    assert "Checkpoint file not found" in message and "hpc_ckpt_1256.ckpt" in message, message

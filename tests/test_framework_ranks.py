"""Framework jobs on several ranks: the accelerate job, the Lightning job and the Trainer job
data-parallel on 2 ranks under torchrun (gloo), gated by the same integrations as on one process,
each rank reporting its own steps. The correct jobs resume bit-exact after the whole job's notices
and after one rank's kill; the accelerate job that saves its state on the main process alone (the
other ranks' RNG files never written) is named on rank 1, as are the Lightning job whose RNG
callback keeps rank 0's state and the Trainer job whose checkpoints lose their RNG files, and
Lightning's own SIGTERM handling and transformers' JIT checkpoint on several ranks hang, named. The
main job runs every built-in multi-rank scenario on the three (scenarios/test_framework_ranks.py);
CI leaves these to the full run (docs/ci.md): the one-process jobs' tests cover the integrations
there."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotchaos.config.jobs import load_settings
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure

from .helpers import ROOT


def ranks_job(*args: str, name: str = "accelerate-ddp"):
    declared = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == name)
    label = "-".join((declared.name, *(a.strip("-") for a in args)))
    return replace(declared, name=label, command=declared.command + args)


def notice_then_kill(runner, name: str, *, notice: int, kill: int):
    """``sigterm@notice,sigkill@kill`` on a 2-rank job: bit-exact, every rank reporting its steps, and
    the restart resumed from the notice's own checkpoint (after the step the notice landed on)."""
    run, verdict = runner.run(ranks_job(name=name), Plan.parse(f"sigterm@{notice},sigkill@{kill}"))
    assert verdict.passed, verdict.message()
    assert len(run.attempts) == 3
    assert {e.get("rank", 0) for a in run.attempts for e in a.of_kind("step")} == {0, 1}
    resumed = [e["from_step"] for a in run.attempts[1:] for e in a.of_kind("resume")]
    assert notice in resumed, resumed
    return run


@pytest.mark.full
def test_accelerate_on_two_ranks_resumes_bit_exact_after_a_notice_and_a_killed_rank(runner):
    run, verdict = runner.run(ranks_job(), Plan.parse("sigterm@5,kill-rank1@14"))
    assert verdict.passed, verdict.message()
    assert len(run.attempts) == 3
    assert {e.get("rank", 0) for a in run.attempts for e in a.of_kind("step")} == {0, 1}


@pytest.mark.full
def test_accelerate_saving_its_state_on_the_main_process_alone_is_named_on_rank_1(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(ranks_job("--save-on-main-only"), Plan.parse("sigterm@7"))
    text = str(failure.value)
    assert "rank 1: loss diverged at step 8" in text, text
    assert "holds no random_states_1.pkl: accelerate's load_state went on without restoring the RNG" in text, text


@pytest.mark.full
def test_lightning_on_two_ranks_resumes_bit_exact_after_notices_agreed_and_a_kill(runner):
    """Each notice lands on both ranks (torchrun forwards it), each at its own moment: the ranks agree at
    the step's end and checkpoint after the same step; every rank's RNG comes back, and each rank's
    sampler skips its own share of the epoch (a resume inside epoch 1 of 4-step epochs)."""
    notice_then_kill(runner, "lightning-ddp", notice=6, kill=13)


@pytest.mark.full
def test_lightning_keeping_rank_0s_rng_for_every_rank_is_named_on_rank_1(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(ranks_job("--rng-of-one-rank", name="lightning-ddp"), Plan.parse("sigkill@7"))
    text = str(failure.value)
    assert "rank 1: loss diverged at step 4" in text and "the RNG state" in text, text


@pytest.mark.full
def test_lightnings_own_sigterm_handling_on_two_ranks_hangs_and_is_named(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(ranks_job("--sigterm", "on-exception", name="lightning-ddp"), Plan.parse("sigterm@9"))
    text = str(failure.value)
    assert "grace window exceeded" in text and "dist.broadcast from inside the handler" in text, text


@pytest.mark.full
def test_the_trainer_on_two_ranks_resumes_bit_exact_after_an_agreed_notice_and_a_kill(runner):
    """The Trainer recognises torchrun (DDP over gloo on CPU), saves each rank's RNG file
    (rng_state_<r>.pth) and skips the trained batches of each rank's shard on a resume; the notice
    is agreed at a step's end (SaveOnSigterm's all-reduce), so every rank saves after the same step."""
    run = notice_then_kill(runner, "hf-trainer-ddp", notice=5, kill=10)
    assert {e.get("rank", 0) for a in run.attempts for e in a.of_kind("checkpoint")} == {0}  # rank 0 reports them


@pytest.mark.full
def test_a_trainer_checkpoint_without_rank_1s_rng_file_is_named_on_rank_1(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(ranks_job("--no-rng-file", name="hf-trainer-ddp"), Plan.parse("sigkill@6"))
    text = str(failure.value)
    assert "rank 1: loss diverged at step 4 (attempt 1, the first step after resuming from step 3)" in text, text
    assert "checkpoint-4 holds no rng_state_1.pth for rank 1: transformers resumed without restoring" in text, text


@pytest.mark.full
def test_transformers_jit_checkpoint_on_two_ranks_never_exits_and_is_named(runner):
    """Found here (transformers 5.24.0): with enable_jit_checkpoint on 2 ranks, a notice forwarded to
    both leaves the job running until the grace window's SIGKILL."""
    with pytest.raises(ChaosFailure) as failure:
        runner.check(ranks_job("--sigterm", "jit", name="hf-trainer-ddp"), Plan.parse("sigterm@9"))
    assert "grace window exceeded: the job did not exit within 20 s of sigterm" in str(failure.value)

"""DeepSpeed ZeRO jobs on torchrun (the CPU accelerator over gloo, real DeepSpeed engines): the
bundled trainer resumes bit-exact at ZeRO stages 1, 2 and 3, a rank killed as it opens its own
ZeRO file resumes from the checkpoint before, and a resume that leaves the optimizer's states
unloaded is named. The full run's: CI leaves DeepSpeed out (docs/ci.md), the main job runs the
multi-rank scenarios on the ZeRO-3 job (scenarios/test_deepspeed.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotchaos.config.jobs import JobSpec
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure

from .test_distributed import ddp_job

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed: pip install -e '.[deepspeed]'")
pytestmark = pytest.mark.full


def zero_job(stage: int, script: str = "deepspeed_trainer") -> JobSpec:
    """The pyproject.toml deepspeed job at ZeRO ``stage``, 16 steps of 0.02 s (checkpoints after 3, 7, 11)."""
    job = ddp_job(script, name="deepspeed")
    command = [*job.command]
    command[command.index("--step-seconds") + 1] = "0.02"
    command[command.index("--zero-stage") + 1] = str(stage)
    return replace(job, command=(*command, "--steps", "16"), name=f"zero{stage}-{script}".replace("_", "-"))


@pytest.mark.parametrize(("stage", "plan"), [(1, "kill-rank1@9"), (2, "sigterm@5,sigkill@13"), (3, "hang-rank1@9")])
def test_each_zero_stage_resumes_bit_exact_with_every_rank_restoring_its_partition(runner, stage, plan):
    job = zero_job(stage)
    if plan.startswith("hang"):
        job = replace(job, hang_timeout_seconds=4)
    run, verdict = runner.run(job, Plan.parse(plan))
    assert verdict.passed and verdict.precision == "bit-exact", verdict.message()
    restored = [e for a in run.attempts for e in a.events if e["event"] == "restored"]
    assert {e.get("rank", 0) for e in restored} == {0, 1}, restored  # each rank gathered what it restored
    assert any(key.startswith("optim.") for key in restored[0]["digests"]), restored[0]  # the moments compared


def test_a_rank_killed_as_it_opens_its_zero_file_resumes_from_the_checkpoint_before(runner):
    verdict = runner.check_shard_crash(zero_job(3), rank=1)
    assert verdict.passed, verdict.message()


def test_optimizer_states_left_unloaded_by_a_zero2_resume_are_named(runner):
    """ZeRO 1/2: load_checkpoint(load_optimizer_states=False) says nothing; the weights come back,
    the Adam moments and the optimizer's learning rate do not."""
    with pytest.raises(ChaosFailure) as failure:
        runner.check(zero_job(2, "broken_deepspeed_module_only"), "kill-rank1@9")
    text = str(failure.value)
    assert "lr diverged at step 8 (attempt 1, the first step after resuming from step 7)" in text, text
    assert "differ from what was saved: optim.0.bias.exp_avg" in text, text
    assert "only the optimizer's state" in text and "load_optimizer_states=True" in text, text


def test_the_same_resume_under_zero3_fails_loudly_and_is_named(runner):
    """ZeRO-3 with load_optimizer_states=False reads the weights from the folder's 'latest' file,
    whatever tag was asked for (DeepSpeed 0.19.8, docs/distributed.md): with no 'latest' written,
    every rank dies before its first step."""
    with pytest.raises(ChaosFailure) as failure:
        runner.check(zero_job(3, "broken_deepspeed_module_only"), "kill-rank1@9")
    text = str(failure.value)
    assert "exited with status 1 before its first step" in text and "Unable to find 'latest' file" in text, text

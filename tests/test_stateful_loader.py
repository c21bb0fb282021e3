"""A job whose data position is torchdata's StatefulDataLoader's (fixtures/stateful_loader_trainer.py):
resumed mid-epoch and exactly at an epoch's end, with at least two epochs trained after the first
resume, with and without DataLoader workers; and the torchdata 0.11.0 defect (one generator shared by
the sampler and the loader, no workers: the next epoch's order differs) caught and named.
Real torch training, real torchdata, real kills."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotchaos.config.jobs import JobSpec, load_settings
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure

from .helpers import FIXTURES, ROOT


def loader_job(script: str = "stateful_loader_trainer", workers: int = 2) -> JobSpec:
    """The pyproject.toml job (3 epochs of 8 steps, checkpoints every 4), another script or worker count."""
    job = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == "stateful-loader")
    command = list(job.command)
    command[1] = str(FIXTURES / f"{script}.py")
    command[command.index("--num-workers") + 1] = str(workers)
    return replace(job, command=tuple(command), name=f"{script}-w{workers}".replace("_", "-"))


@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_mid_epoch_and_at_an_epochs_end_it_is_bit_exact(runner, workers):
    """sigkill@6 resumes after step 3 (mid-epoch 0) and trains epochs 1 and 2 after it; sigkill@17
    resumes after step 15, the last step of epoch 1: the loader's saved state is an epoch run out."""
    run, verdict = runner.run(loader_job(workers=workers), Plan.parse("sigkill@6,sigkill@17"))
    assert verdict.passed, verdict.message()
    resumes = [a.of_kind("resume")[0]["from_step"] for a in run.attempts[1:]]
    assert resumes == [3, 15], resumes
    assert verdict.precision == "bit-exact"


def test_one_generator_for_the_sampler_and_the_loader_without_workers_is_named(runner):
    """torchdata 0.11.0: the rest of epoch 0 comes back right, epoch 1's order does not."""
    with pytest.raises(ChaosFailure) as failure:
        runner.check(loader_job("broken_stateful_loader_one_generator", workers=0), "sigkill@6")
    first = str(failure.value).splitlines()[1]
    assert "diverged at step 8 (attempt 1, 5 steps after resuming from step 3)" in first, first
    assert "the 4 steps after the resume had the right batches" in first, first
    assert "give the sampler and the loader a generator each" in first, first
    assert "loader._sampler_iter_state" in str(failure.value), "the state diff names the loader's sampler state"

"""A framework job on several ranks: the accelerate job data-parallel on 2 ranks under torchrun (gloo),
gated by the same integration as on one process, each rank reporting its own steps. The correct job
resumes bit-exact after the whole job's notice and after one rank's kill; the one that saves its
state on the main process alone (the other ranks' RNG files never written) is named on rank 1.
The main job runs every built-in multi-rank scenario on it (scenarios/test_framework_ranks.py);
CI leaves these to the full run (docs/ci.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotchaos.config.jobs import load_settings
from spotchaos.faults.plan import Plan
from spotchaos.runner import ChaosFailure

from .helpers import ROOT

pytestmark = pytest.mark.full


def ranks_job(*args: str):
    declared = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == "accelerate-ddp")
    label = "-".join((declared.name, *(a.strip("-") for a in args)))
    return replace(declared, name=label, command=declared.command + args)


def test_accelerate_on_two_ranks_resumes_bit_exact_after_a_notice_and_a_killed_rank(runner):
    run, verdict = runner.run(ranks_job(), Plan.parse("sigterm@5,kill-rank1@14"))
    assert verdict.passed, verdict.message()
    assert len(run.attempts) == 3
    assert {e.get("rank", 0) for a in run.attempts for e in a.of_kind("step")} == {0, 1}


def test_accelerate_saving_its_state_on_the_main_process_alone_is_named_on_rank_1(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(ranks_job("--save-on-main-only"), Plan.parse("sigterm@7"))
    text = str(failure.value)
    assert "rank 1: loss diverged at step 8" in text, text
    assert "holds no random_states_1.pkl: accelerate's load_state went on without restoring the RNG" in text, text

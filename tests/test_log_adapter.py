"""The log adapter: a script that knows nothing of spotchaos, gated through what it prints."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from spotchaos.config.jobs import job_from_mapping
from spotchaos.errors import ConfigError, JobError
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure
from spotchaos.training.logadapter import significant_digits

from .helpers import PLAIN_LOG, plain_job

LOG = PLAIN_LOG


def test_correct_script_passes_and_says_how_exact_the_comparison_was(runner):
    verdict = runner.check(plain_job(), Plan.parse("sigterm@6,sigkill@13"))
    assert verdict.passed, verdict.message()
    assert verdict.precision == (
        "losses compared as printed, to 8 significant digit(s); final weights compared bit for bit (4 tensors); "
        "a bit-exact claim needs the probe or the weights digest"
    )


def test_a_restart_with_no_steps_left_resumed_after_the_last_step_not_from_scratch(runner):
    """SIGTERM at the last step: the script saves after it and exits; the restart has nothing left to
    train and prints nothing. Its final checkpoint says where it stood, so no work is called lost."""
    verdict = runner.check(plain_job(), Plan.parse("sigterm@19"))
    assert verdict.passed, verdict.message()


def test_script_that_forgets_its_rng_state_fails_with_a_hint_naming_rng_state(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(plain_job("plain_train_no_rng"), Plan.parse("sigterm@8"))
    message = str(failure.value)
    assert "the first step after resuming from step" in message
    assert "the RNG state (dropout masks, augmentation, shuffling)" in message
    assert "final weights differ" in message


def test_printed_digits_are_counted_honestly():
    assert [significant_digits(t) for t in ("0.01230000", "1.5e-03", "12", "-0.5", "0")] == [7, 2, 2, 1, 1]


@pytest.mark.parametrize(
    ("log", "message"),
    [
        ({"pattern": r"step (\d+) loss (\S+)"}, r"has no named group 'step' or 'loss'"),
        ({"pattern": r"step (?P<step>\d+)"}, r"has no named group 'loss'"),
        ({"pattern": r"step (?P<step>[\d+"}, r"is not a regular expression"),
        ({**LOG, "stream": "stdlog"}, r"stream: must be stdout or stderr"),
        ({**LOG, "final_weights": "/abs/ckpt.pt"}, r"final_weights: must be a path under the checkpoint directory"),
        ({**LOG, "colour": "red"}, r"log.colour: unknown key"),
    ],
)
def test_bad_log_tables_name_the_job_and_the_pattern(log, message):
    with pytest.raises(ConfigError, match=message) as raised:
        plain_job(log=log)
    assert "[tool.spotchaos.jobs.plain_train].log" in str(raised.value)


def test_pattern_that_never_matches_is_one_clear_message(runner, tmp_path):
    job = job_from_mapping(
        "chatty",
        {"command": [sys.executable, "-c", "print('epoch 1 iteration 3 mse=0.5')"], "log": {"pattern": LOG["pattern"]}},
        "pyproject.toml",
    )
    with pytest.raises(
        JobError, match=r"(?s)no line of its stdout matched .*\.log\.pattern .*epoch 1 iteration 3 mse=0.5"
    ):
        runner.reference(job)


def test_loss_that_does_not_parse_is_one_clear_message(runner):
    job = job_from_mapping(
        "garbled",
        {
            "command": [sys.executable, "-c", "print('step 0 loss 1.2.3')"],
            "log": {"pattern": r"step (?P<step>\d+) loss (?P<loss>\S+)"},
        },
        "pyproject.toml",
    )
    with pytest.raises(
        JobError, match=r"job 'garbled': .*pattern matched 'step 0 loss 1.2.3' but its loss group '1.2.3'"
    ):
        runner.reference(job)


def test_a_checkpoint_glob_that_matches_folders_is_refused_not_silently_empty(runner, tmp_path):
    """accelerate's and transformers' checkpoints are folders: a glob naming them must not pass
    every scenario while tracking no checkpoint."""
    code = (
        "import os, sys, time\n"
        "out = sys.argv[1]\n"
        "for step in range(6):\n"
        "    print(f'step {step} loss {1.0 / (step + 1)}', flush=True)\n"
        "    if step % 2 == 1: os.makedirs(os.path.join(out, f'step_{step}'), exist_ok=True)\n"
        "    time.sleep(0.3)\n"
    )
    job = job_from_mapping(
        "folders",
        {"command": [sys.executable, "-c", code, "{checkpoint_dir}"], "log": {"checkpoints": "step_*"}},
        "pyproject.toml",
    )
    with pytest.raises(
        ConfigError, match=r"log\.checkpoints = 'step_\*' matches the folder step_1/: the log adapter"
    ) as said:
        runner.reference(job)
    # the advice, followed to the letter, is a table the loader accepts
    advice = dict(re.findall(r"(checkpoints|checkpoint_complete) = '([^']+)'", str(said.value)))
    assert advice == {"checkpoints": "step_*/model.safetensors", "checkpoint_complete": "random_states_0.pkl"}
    followed = job_from_mapping("folders", {"command": ["python", "t.py"], "log": advice}, "pyproject.toml")
    assert followed.log.companions(Path("step_4/model.safetensors")) == [Path("step_4/random_states_0.pkl")]

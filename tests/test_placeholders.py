"""``{checkpoint_dir}`` and ``{latest_checkpoint}``: a script as users bring it, gated without a
wrapper that finds its newest checkpoint or changes into its output folder (issue 60)."""

from __future__ import annotations

import os

import pytest

from spotchaos.config.jobs import job_from_mapping
from spotchaos.config.placeholders import latest_checkpoint, working_folder
from spotchaos.errors import ConfigError
from spotchaos.faults.plan import Plan

from .helpers import FIXTURES

LOG = {
    "checkpoints": "step_*.pt",
    "checkpoint_step_key": "step",
    "final_weights": "step_*.pt",
    "final_key": "model",
}


def resume_from_path_job(name: str, **table) -> object:
    command = ["python", str(FIXTURES / "resume_from_path.py"), "--steps", "16", "--step-seconds", "0"]
    declared = {"command": command, "resume_args": ["--resume_from_checkpoint", "{latest_checkpoint}"], "log": LOG}
    return job_from_mapping(name, {**declared, **table}, "pyproject.toml")


@pytest.mark.unit
def test_the_newest_checkpoint_is_the_largest_number_in_its_name_never_a_hidden_file(tmp_path):
    assert latest_checkpoint(tmp_path, "step_*.pt") is None
    for name in ("step_9.pt", "step_12.pt", ".step_99.pt", "notes.txt"):
        (tmp_path / name).write_text("x")
    assert latest_checkpoint(tmp_path, "step_*.pt") == tmp_path / "step_12.pt"
    assert latest_checkpoint(tmp_path, None) == tmp_path / "step_12.pt"
    os.symlink("/etc", tmp_path / "step_100.pt")  # named, never opened: the job gets the name
    assert latest_checkpoint(tmp_path, "step_*.pt") == tmp_path / "step_100.pt"


@pytest.mark.unit
def test_a_working_folder_naming_the_checkpoint_folder_is_it_during_a_run_and_the_root_outside(tmp_path):
    assert working_folder("{checkpoint_dir}", tmp_path, tmp_path / "run" / "checkpoints") == (
        tmp_path / "run" / "checkpoints"
    )
    assert working_folder("{checkpoint_dir}", tmp_path) == tmp_path
    assert working_folder("sub", tmp_path, tmp_path / "c") == tmp_path / "sub"


@pytest.mark.unit
@pytest.mark.parametrize("where", ["command", "env", "cwd"])
def test_latest_checkpoint_outside_the_resume_arguments_is_one_clear_error(where):
    table = {"command": ["python", "train.py"]}
    if where == "command":
        table["command"] = ["python", "train.py", "--resume_from_checkpoint", "{latest_checkpoint}"]
    elif where == "env":
        table["env"] = {"RESUME": "{latest_checkpoint}"}
    else:
        table["cwd"] = "{latest_checkpoint}"
    with pytest.raises(ConfigError, match=r"\{latest_checkpoint\} names the newest checkpoint.*resume_args"):
        job_from_mapping("j", table, "pyproject.toml")


@pytest.mark.parametrize(
    "table",
    [pytest.param({"cwd": "{checkpoint_dir}"}, marks=pytest.mark.full), {"env": {"TRAIN_OUT": "{checkpoint_dir}"}}],
    ids=["cwd", "env"],
)
def test_a_script_handed_its_newest_checkpoint_resumes_bit_exact_with_no_wrapper(runner, table):
    job = resume_from_path_job("resume-from-path-" + next(iter(table)), **table)
    run, verdict = runner.run(job, Plan.parse("sigkill@7"))
    assert verdict.passed, verdict.failures
    assert "resumed at step 5 from step_5.pt" in run.attempts[1].stderr_tail
    # killed before its first checkpoint: the restart starts fresh, handed no checkpoint
    run, verdict = runner.run(job, Plan.parse("sigkill@2"))
    assert verdict.passed, verdict.failures
    assert "resumed" not in run.attempts[1].stderr_tail

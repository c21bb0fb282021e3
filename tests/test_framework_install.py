"""What a new user of a framework does: a fresh venv with ``pip install spotchaos
"transformers[torch]"`` (the Trainer needs accelerate), a training script with its one integration
line, a job table of three keys, and ``pytest --spotchaos`` collects every built-in scenario for it
from the installed package, with no file of this repository copied beside it, and runs the notice
scenario (the other seven run on the same script in the main job (scenarios/test_framework_jobs.py) and in
tests/test_frameworks.py: CI's time goes to what only this test can show)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .helpers import FIXTURES, ROOT, fresh_venv

JOB_TABLE = """\
[tool.spotchaos.jobs.train]
command = ["python", "train.py", "--max-steps", "12", "--save-steps", "4", "--step-seconds", "0.25"]
framework = "transformers"
grace_seconds = 20
"""
BUILTIN = {  # every scenario that ships in spotchaos/scenarios, on the one declared job
    "test_budgets.py::test_checkpoint_overhead_within_budget[train]",
    "test_budgets.py::test_notice_flush_fits_half_the_grace_window[train]",
    "test_checkpoint_damage.py::test_damaged_newest_checkpoint_rolls_back[train]",
    "test_checkpoint_damage.py::test_crash_inside_a_checkpoint_save_leaves_a_loadable_checkpoint[train]",
    "test_checkpoint_damage.py::test_crash_while_loading_on_resume_then_resume_again[train]",
    "test_preemption.py::test_notice_then_resume_is_bit_exact[train]",
    "test_preemption.py::test_hard_kill_then_resume_is_bit_exact[train]",
    "test_preemption.py::test_chained_preemptions_are_bit_exact[train]",
}


@pytest.mark.full  # the main job runs hf-trainer in a fresh venv; CI: test_core_install's fresh venv
def test_a_trainer_job_in_a_fresh_venv_collects_every_built_in_scenario_and_passes_a_notice(tmp_path):
    """Collected: all eight; run and passed: the notice, then a bit-exact resume."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GITHUB_STEP_SUMMARY", "CI")}
    python = fresh_venv(tmp_path / "venv", "torch==2.13.0", str(ROOT), "transformers[torch]==5.24.0", env=env)

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text((FIXTURES / "frameworks" / "hf_trainer.py").read_text())  # the user's script
    (project / "pyproject.toml").write_text(JOB_TABLE)
    pytest = [python, "-m", "pytest", "--spotchaos", "--spotchaos-examples", "1", "-p", "no:cacheprovider"]
    listed = subprocess.run([*pytest, "--collect-only", "-q"], cwd=project, capture_output=True, text=True, env=env)
    collected = {line.split("/")[-1] for line in listed.stdout.splitlines() if "::" in line}
    assert collected == BUILTIN, listed.stdout[-4000:] + listed.stderr[-2000:]
    preemption = {name for name in BUILTIN if "test_notice_then_resume" in name}
    run = subprocess.run(
        [*pytest, "-rA", "-k", "test_notice_then_resume"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    passed = {line.split()[1].split("/")[-1] for line in run.stdout.splitlines() if line.startswith("PASSED ")}
    assert passed == preemption, run.stdout[-4000:]
    report = json.loads((project / "spotchaos-report" / "report.json").read_text())
    verdicts = {s["scenario"].split("/")[-1]: s["passed"] for s in report["scenarios"]}
    assert set(verdicts) == preemption and all(verdicts.values()), verdicts
    assert not [p.name for p in project.iterdir() if p.suffix == ".py" and p.name != "train.py"]  # nothing copied

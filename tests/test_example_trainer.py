"""The trainer a user can copy (examples/train_with_probe.py) is gated by the built-in scenarios,
so the pattern the README points to is the one that passes them."""

from __future__ import annotations

import json

import pytest

from .helpers import ROOT, run_pytest


@pytest.mark.full  # CI: the same built-in scenarios on reference, the pattern the example is cut from
def test_the_example_trainer_passes_the_built_in_preemption_and_damage_scenarios(tmp_path):
    example = ROOT / "examples" / "train_with_probe.py"
    (tmp_path / "pyproject.toml").write_text(
        '[tool.spotchaos]\noutput = "out"\n'
        "[tool.spotchaos.jobs.example]\n"
        f'command = ["python", "{example}", "--steps", "24", "--checkpoint-every", "6"]\n'
        "grace_seconds = 20\n"
    )
    builtin = ROOT / "spotchaos" / "scenarios"
    scenarios = [str(builtin / name) for name in ("test_preemption.py", "test_checkpoint_damage.py")]
    result = run_pytest(
        tmp_path,
        "-c",
        str(tmp_path / "pyproject.toml"),
        f"--rootdir={tmp_path}",
        f"--confcutdir={builtin}",
        "--spotchaos",
        "--spotchaos-examples=1",
        "-k",
        # a notice and a crash inside a save: what the example's own code does (its SIGTERM handler,
        # its atomic save); the other scenarios judge what the reference trainer's tests judge
        "notice_then_resume or crash_inside",
        *scenarios,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["summary"]["scenarios"] == 2 and report["summary"]["failed"] == 0, report["summary"]
    faults = {f["fault"] for s in report["scenarios"] for r in s["runs"] for f in r["faults"]}
    assert {"sigterm", "crash"} <= faults, faults

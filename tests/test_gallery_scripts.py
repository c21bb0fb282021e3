"""The gallery's accelerate loop (docs/gallery.md): ``save_state`` into ``step_N`` folders, read
through the log adapter as it is, with the table of pyproject.toml and no wrapper (issue 60)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotchaos.config.jobs import load_settings
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure

from .helpers import ROOT


def accelerate_save_state(*, as_published: bool = False):
    """The bundled table; ``as_published``: the example's own DataLoader, with no generator."""
    declared = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == "accelerate-save-state")
    command = tuple(a for a in declared.command if not (as_published and a == "--loader-generator"))
    name = "accelerate-save-state-as-published" if as_published else declared.name
    return replace(declared, name=name, command=command, warm=not as_published)


@pytest.mark.full  # the main job gates the bundled table with hard kills (scenarios/test_gallery_accelerate.py)
def test_a_save_state_loop_resumes_bit_exact_inside_an_epoch_from_its_step_folder(runner):
    """sigkill@9: the restart is handed step_8 (two batches before the epoch's end) and skips the
    eight it trained; every loss and the final model.safetensors match."""
    run, verdict = runner.run(accelerate_save_state(), Plan.parse("sigkill@9"))
    assert verdict.passed, verdict.failures
    assert run.attempts[1].of_kind("step")[0]["step"] == 8  # handed step_8: trains on from step 8
    saved = [e["step"] for e in run.attempts[0].of_kind("checkpoint")]
    assert saved[:2] == [3, 7], saved  # step_4 and step_8: after steps 3 and 7, each once whole


def test_the_examples_own_dataloader_fails_a_resume_inside_an_epoch_naming_the_step(runner):
    with pytest.raises(ChaosFailure) as failed:
        runner.check(accelerate_save_state(as_published=True), Plan.parse("sigkill@9"))
    message = str(failed.value)
    assert "loss diverged at step 8 (attempt 1, the first step after resuming from step 7)" in message, message

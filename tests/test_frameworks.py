"""Framework jobs gated through their one-line integrations: real transformers Trainers, Lightning
fits and accelerate loops, each correct one resuming bit-exact and each broken one failing with
its cause named. The correct Trainer passes every built-in scenario in tests/test_framework_install.py;
the main job explores every built-in scenario on the three correct ones (README)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from spotchaos.config.jobs import load_settings
from spotchaos.core import Allowed
from spotchaos.faults.plan import Plan
from spotchaos.integrations._report import loss_of, tensors_in
from spotchaos.session import ChaosFailure
from spotchaos.strategies import resumes_across_epochs
from spotchaos.training.reference.prefix import ready_steps

from .helpers import ROOT


def job(name: str, *args: str):
    """A framework job of pyproject.toml with ``args`` added (``--recipe``: as the framework's docs show it)."""
    declared = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == name)
    label = "-".join((name, *(a.strip("-") for a in args)))
    return replace(declared, name=label, command=declared.command + args)


def failure_of(runner, job, plan: str) -> str:
    with pytest.raises(ChaosFailure) as failure:
        runner.check(job, Plan.parse(plan))
    return str(failure.value)


@pytest.mark.full  # CI names transformers' defects by the docs recipe and the rerun; this is the full run's
def test_the_trainer_jit_checkpoint_is_caught_saving_half_a_step(runner):
    """The JIT checkpoint lands on the first hook 3 s after SIGTERM: inside a step (where a step
    spends its time) unless the timer happens to run out between two steps, so a few notices."""
    jit = job("hf-trainer", "--sigterm", "jit", "--unverified", "--max-steps", "70")  # 7 s: the 3 s wait ends inside
    cause = "cause: transformers' JIT checkpoint (enable_jit_checkpoint) wrote checkpoint-"
    lines = []
    for plan in ("sigterm@5", "sigterm@9", "sigterm@13"):
        try:
            runner.check(jit, Plan.parse(plan))
        except ChaosFailure as failure:
            lines.append(next(x for x in str(failure).splitlines() if "diverged" in x))
            if cause in lines[-1]:
                break  # on a loaded machine one notice may land where the save is whole: the next one
    assert lines, "three SIGTERMs, and the JIT checkpoint never landed mid-step"
    line = next((x for x in lines if cause in x), lines[0])
    assert "the first step after resuming" in line, line
    assert cause in line, lines
    assert "from on_pre_optimizer_step, in the middle of step" in line


def test_a_trainer_started_again_after_its_final_checkpoint_trains_an_extra_step(runner):
    message = failure_of(runner, job("hf-trainer", "--max-steps", "26"), "rerun@0")  # 8 steps an epoch
    assert "steps the reference never ran: 26; hint: started again after it had finished" in message, message


def test_a_trainer_that_logs_every_few_steps_passes_though_its_logged_running_loss_restarts(runner):
    """logging_steps = 4: the first log after a resume averages the steps since the resume, not
    since the previous log, so trainer_state.json's log_history differs from the uninterrupted
    run's. A report of the losses, not state: no latent failure (every step's loss is compared)."""
    verdict = runner.check(job("hf-trainer", "--logging-steps", "4"), Plan.parse("sigkill@9"))
    assert verdict.passed and verdict.state_difference is None, verdict.message()


def test_the_lightning_docs_recipe_is_never_bit_exact_and_says_why(runner):
    message = failure_of(runner, job("lightning", "--recipe"), "sigkill@9")
    line = next(x for x in message.splitlines() if "diverged" in x)
    assert "cause: " in line and "Lightning's checkpoint holds no RNG state" in line, line
    assert "from a plain DataLoader, which Lightning restarts from its first batch" in line
    assert "Its sampler is a RandomSampler with no generator of its own" in line, line


def test_lightnings_checkpoint_saved_again_mid_accumulation_after_a_resume_is_named(runner):
    """Found here (Lightning 2.6.6): with accumulate_grad_batches = 2, ModelCheckpoint saves again at
    the first micro-batch after a resume (global_step has not moved), over the checkpoint resumed
    from: loop counters and the torch RNG one micro-batch on. Latent at once; the cause is named."""
    message = failure_of(runner, job("lightning", "--accumulate", "2", "--plain-checkpoint"), "sigkill@9")
    line = next(x for x in message.splitlines() if "latent" in x)
    assert "the checkpoint after step 5 (attempt 1, after a resume)" in line and "rng_state.torch: differs" in line
    assert "cause: Lightning wrote this checkpoint in the middle of gradient accumulation, after 1 of the 2" in line


def test_lightnings_async_checkpoint_io_deleting_the_last_complete_checkpoint_is_named(runner):
    """Lightning 2.6.6's AsyncCheckpointIO writes in a thread and deletes at once: with save_top_k=1
    the older checkpoint goes as the newer save is handed off, and a kill before the write ends
    leaves none. The integration reports a checkpoint once its write is done and each deletion."""
    broken = job("lightning-async", "--async-io", "plain")  # the later flag wins: Lightning's own IO
    message = failure_of(runner, broken, "sigkill@13")
    assert "the checkpoint after step 5 (epoch=0-step=6.ckpt) was durable, but the job deleted it" in message, message
    assert "its rotation removed the last complete checkpoint" in message and "AsyncCheckpointIO" in message


@pytest.mark.full  # CI: Lightning's own async IO named above; the main job searches this one's crash points
def test_lightning_checkpoints_written_in_a_thread_with_ordered_deletions_resume_exact(runner):
    """spotchaos's OrderedAsyncCheckpointIO: the same kill, and one inside the write itself."""
    correct = job("lightning-async")
    assert runner.check(correct, Plan.parse("sigkill@13")).passed
    saves = runner.save_boundaries(correct)
    write = next(b for b in saves if b["event"] == "open-write" and b["path"].endswith(".ckpt"))
    assert runner.check(correct, Plan.parse(f"crash@{write['index'] + 1}")).passed  # inside the thread's write


@pytest.mark.full  # CI names the defect above; the main job runs StepBoundaryCheckpoint on every built-in plan
def test_lightning_checkpoints_at_step_boundaries_only_resume_exact_under_accumulation(runner):
    """The fix spotchaos ships for the defect above: checkpoints at step boundaries only
    (StepBoundaryCheckpoint), twice preempted across the resume that Lightning's own callback
    re-saves after."""
    assert runner.check(job("lightning", "--accumulate", "2"), Plan.parse("sigkill@9,sigkill@8")).passed


@pytest.mark.full  # CI: the pattern below (unit); the main job draws the damage plans on the correct job
def test_a_lightning_job_rolled_back_to_last_ckpt_is_not_a_latent_failure_of_its_checkpoint_callbacks_paths(runner):
    """The only checkpoint damaged (truncated to nothing): the correct job rolls back to last.ckpt of
    the same step, and the StepBoundaryCheckpoint it restores from there remembers that file as its
    last one, where the reference's had none yet: a path of the callback's bookkeeping, not state (a
    false alarm the main job's damage search found once plans spread over cells)."""
    run, verdict = runner.run(job("lightning"), Plan.parse("sigkill@6:truncate-zero"))
    assert verdict.passed, verdict.message()
    assert any(a.of_kind("rollback") for a in run.attempts)


@pytest.mark.full  # the main job's search on lightning runs its plans from the reference's copies
def test_a_lightning_job_takes_prefixes_though_its_checkpoints_name_the_references_files(runner):
    """Every Lightning checkpoint names the reference's folder in ModelCheckpoint's bookkeeping
    (best_model_path, last_model_path), which Lightning never follows from another folder: the job
    takes the reference's copies, and a plan from one resumes bit-exact. The plan swaps an older
    checkpoint's content into the newest: from the copy, the harness knows last.ckpt as the step's
    second report, not the older step's (a no-op swap it then called a silent bad load)."""
    lightning = job("lightning")
    run, verdict = runner.run(lightning, Plan.parse("sigkill@13:swap-older"), Allowed(prefix=True))
    snapshots = runner.reference(lightning).snapshots
    assert snapshots["refused"] is None and 11 in snapshots["steps"], snapshots
    assert run.prefix_step == 11 and verdict.passed, verdict.message()


def test_a_lightning_checkpoint_written_in_a_thread_starts_a_plan_only_once_it_was_reported(runner):
    """lightning-async writes each checkpoint in a thread (0.3 s a write) and reports it steps later:
    a crash point among the first events after step 13 hits the write of the checkpoint after step
    11 in the reference, so the plan starts from the copy before that one, and crashes where the
    run from step 0 does (from the copy after 11 it never fired, and the job took no more copies)."""
    threaded = job("lightning-async")
    run, verdict = runner.run(threaded, Plan.parse("crash@13+1"), Allowed(prefix=True))
    reference = runner.reference(threaded)
    assert ready_steps(reference)[11] >= 13 and reference.snapshots["refused"] is None, reference.snapshots
    assert run.prefix_step == 5 and verdict.passed, verdict.message()
    assert any(f.fault == "crash" for a in run.attempts if (f := a.fault) is not None)


@pytest.mark.unit
def test_the_bookkeeping_of_any_model_checkpoint_subclass_is_not_compared():
    import fnmatch

    from spotchaos.training.frameworks import state_diff_ignore

    patterns = state_diff_ignore("lightning", ())
    ours = "callbacks.StepBoundaryCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 6}.last_model_path"
    early = "callbacks.EarlyStopping{'monitor': 'loss', 'mode': 'min'}.wait_count"
    assert any(fnmatch.fnmatchcase(ours, p) for p in patterns)
    assert not any(fnmatch.fnmatchcase(early, p) for p in patterns)  # another callback's state is compared
    assert not any(fnmatch.fnmatchcase(ours.replace("last_model_path", "current_score"), p) for p in patterns)


def test_a_lightning_job_whose_sampler_skips_the_trained_batches_is_not_blamed_on_its_plain_loader(runner):
    """The correct job's sampler (it skips what the restored global_step says was trained) without
    its RNG state: the batches agree after the resume, so the cause is the RNG, never the loader."""
    message = failure_of(runner, job("lightning", "--no-rng-state"), "sigkill@9")
    line = next(x for x in message.splitlines() if "diverged" in x)
    assert "cause: Lightning's checkpoint holds no RNG state" in line, line
    assert "plain DataLoader" not in line and "RandomSampler" not in line, line


def test_the_accelerate_recipe_mid_epoch_is_caught_and_a_seeded_loader_is_exact(runner):
    message = failure_of(runner, job("accelerate", "--recipe"), "sigkill@10")
    assert "cause: resumed mid-epoch with a shuffling DataLoader that has no generator of its own" in message
    verdict = runner.check(job("accelerate"), Plan.parse("sigkill@10"))
    assert verdict.passed, verdict.message()


@pytest.mark.unit
def test_losses_and_batches_are_found_in_every_framework_output_shape():
    import torch

    loss = torch.tensor(1.5)
    assert loss_of({"loss": loss}) is loss
    assert loss_of(type("Out", (), {"loss": loss})()) is loss
    assert loss_of(loss) is loss and loss_of(torch.ones(2)) is None
    a, b = torch.ones(2), torch.zeros(3)
    assert tensors_in({"labels": b, "input_ids": a}) == [a, b]  # by key, whatever the dict's order
    assert tensors_in([a, (b, "text")]) == [a, b]


def test_importing_the_integrations_package_imports_no_framework():
    code = (
        "import sys, spotchaos.integrations, spotchaos.probe; "
        "print(sorted(m for m in ('transformers', 'lightning', 'accelerate', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == []


def test_an_integration_outside_spotchaos_is_a_no_op(tmp_path):
    """The example job runs as in production (no SPOTCHAOS_EVENTS): it trains, and nothing is written for spotchaos."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    script = ROOT / "fixtures" / "frameworks" / "accelerate_job.py"
    done = subprocess.run(
        [sys.executable, str(script), "--steps", "3", "--step-seconds", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["accelerate-out"]
    assert [p.name for p in (tmp_path / "accelerate-out").iterdir()] == []  # 3 steps: no checkpoint due


@pytest.mark.full  # CI: the Lightning docs recipe's defect; this one is the full run's (docs/ci.md)
def test_lightning_own_sigterm_checkpoint_at_an_epoch_end_is_named_as_the_cause(runner):
    """Lightning 2.6.6: the on-exception checkpoint of a notice on an epoch's last batch resumes into
    the wrong epoch (docs/frameworks.md); the correct job, saving its RNG, skipping what was trained
    and its SIGTERM checkpoint at the end of the step, resumes bit-exact from there."""
    message = failure_of(runner, job("lightning", "--sigterm", "on-exception"), "sigterm@7")
    line = next(x for x in message.splitlines() if "diverged" in x)
    assert "cause: Lightning wrote this checkpoint after epoch 0 ended and before the next began" in line, line
    verdict = runner.check(job("lightning"), Plan.parse("sigterm@7"))
    assert verdict.passed and verdict.state_difference is None, verdict.message()


@pytest.mark.unit
def test_first_plans_aim_at_epoch_ends_inside_epochs_and_twice_in_one_epoch():
    epochs, checkpoints = [0] * 8 + [1] * 8 + [2] * 8, [5, 7, 11, 17, 23]
    shown = [str(p) for p in resumes_across_epochs("sigterm", twice=True, rerun=True)(epochs, checkpoints)]
    # twice: in the last epoch with room, after its checkpoint (from the reference's copy of step 17)
    assert shown == ["sigterm@9", "sigterm@7", "sigterm@18,sigterm@22", "rerun@0"]
    kills = [str(p) for p in resumes_across_epochs("sigkill")(epochs, checkpoints)]
    assert kills == ["sigkill@12", "sigkill@8"]  # after the checkpoint inside epoch 1, after the one ending epoch 0
    assert [str(p) for p in resumes_across_epochs("sigkill")([None] * 24, checkpoints)] == ["sigkill@8"]


def test_a_trainer_resuming_the_docs_way_fails_on_the_planned_damage_and_the_message_says_so(runner):
    """get_last_checkpoint verifies nothing: a truncated newest checkpoint makes the restart fail.
    The message blames the missing verification, not a kill inside the job's own write."""
    message = failure_of(runner, job("hf-trainer", "--unverified"), "sigterm@12:truncate-zero")
    assert "exited with status 1 before its first step: the planned damage (truncate-zero on checkpoint-" in message
    assert "made the restart fail instead of roll back" in message and "torn checkpoint" not in message, message


@pytest.mark.unit
def test_a_trainer_checkpoint_holding_another_steps_state_under_its_name_is_rolled_back(tmp_path, monkeypatch):
    """swap-older: checkpoint-13 replaced by a whole copy of checkpoint-12 (its checksums match):
    the Trainer's name says step 13, its trainer_state.json says 12."""
    from spotchaos.integrations.transformers import last_verified_checkpoint
    from spotchaos.integrations.verified import write_checksums

    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("SPOTCHAOS_EVENTS", str(events))
    out = tmp_path / "out"
    for name in ("checkpoint-12", "checkpoint-13"):
        (out / name).mkdir(parents=True)
        (out / name / "trainer_state.json").write_text(json.dumps({"global_step": 12}))
        (out / name / "model.safetensors").write_bytes(b"weights of step 12")
        write_checksums(str(out / name))
    assert last_verified_checkpoint(str(out)) == str(out / "checkpoint-12")
    (rollback,) = [json.loads(line) for line in events.read_text().splitlines()]
    assert rollback["event"] == "rollback" and rollback["skipped_uri"].endswith("checkpoint-13")
    assert "global_step 12 under the name checkpoint-13" in rollback["reason"], rollback
    assert (out / ".rejected-checkpoint-13").is_dir()


@pytest.mark.unit
def test_a_lightning_checkpoint_gone_but_for_its_sha256_is_rolled_back(tmp_path, monkeypatch):
    """drop-file on a one-file checkpoint: the file is gone, its sidecar says it was written."""
    import os

    from spotchaos.integrations.lightning_exact import newest_verified_checkpoint
    from spotchaos.integrations.verified import write_checksums

    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("SPOTCHAOS_EVENTS", str(events))
    older, newer = tmp_path / "last.ckpt", tmp_path / "sigterm-step=7.ckpt"
    for age, path in enumerate((newer, older)):
        path.write_bytes(path.name.encode())
        write_checksums(str(path))
        for each in (path, Path(f"{path}.sha256")):
            os.utime(each, ns=(10**18 - age * 10**9,) * 2)  # the newer one written later
    newer.unlink()
    assert newest_verified_checkpoint(str(tmp_path)) == str(older)
    (rollback,) = [json.loads(line) for line in events.read_text().splitlines()]
    assert rollback["skipped_uri"].endswith("sigterm-step=7.ckpt") and "is missing" in rollback["reason"], rollback

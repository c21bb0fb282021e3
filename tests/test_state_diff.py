"""The state diff: name what a resume did not restore, even when no loss shows it yet."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import pytest

from spotchaos.config.jobs import JobSpec
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure
from spotchaos.training.state.confined.state_diff import diff

from .helpers import FIXTURES
from .test_script_conventions import sidecar_job


def trainer(script: str) -> JobSpec:
    command = ("python", str(FIXTURES / f"{script}.py"), "--steps", "16", "--checkpoint-every", "4")
    return JobSpec(name=script.replace("_", "-"), command=command, grace_seconds=10)


@pytest.mark.parametrize(
    ("script", "named"),
    [
        ("broken_no_rng_restore", ["trainer.pt:rng.numpy", "trainer.pt:rng.python.1: differs", "trainer.pt:rng.torch"]),
        pytest.param(  # CI: test_a_scheduler_not_restored_is_a_latent_failure_though_every_loss_matched
            "broken_no_scheduler_restore", ["trainer.pt:scheduler.last_epoch: 12 vs 4"], marks=pytest.mark.full
        ),
        ("broken_no_optimizer_restore", ["optimizer.pt:state.0.step: 12.0 vs 4.0"]),
        ("broken_step_off_by_one", ["trainer.pt:position: 4 vs 3"]),
    ],
)
def test_the_state_diff_names_what_each_broken_trainer_did_not_restore(runner, script, named):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(trainer(script), Plan.parse("sigterm@7"))
    line = next(x for x in str(failure.value).splitlines() if "state not restored" in x)
    assert "the checkpoint after step 11 (attempt 1, after a resume) differs from the uninterrupted run's" in line
    for entry in named:
        assert entry in line, line
    weights = line.find("model.pt")  # causes come before the weights they drag along
    assert weights == -1 or line.index(named[0]) < weights


def test_a_correct_resume_leaves_no_state_difference(runner):
    verdict = runner.check(trainer("reference_trainer"), Plan.parse("sigkill@9,sigterm@13"))
    assert verdict.passed and verdict.state_difference is None, verdict.message()


def _every_7(script: str, **settings) -> JobSpec:
    """The sidecar script saving every 7 steps, the step size of its StepLR: a kill after step 9
    resumes from step 7, where a scheduler that starts over decays on the very same steps."""
    base = sidecar_job()
    command = (*(c.replace("sidecar_train.py", f"{script}.py") for c in base.command), "--save-every", "7")
    return replace(base, name=script.replace("_", "-") + "-7", command=command, **settings)


def test_a_scheduler_not_restored_is_a_latent_failure_though_every_loss_matched(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(_every_7("broken_sidecar_no_scheduler"), Plan.parse("sigkill@9"))
    message = str(failure.value)
    assert "latent: the losses matched, but the checkpoint storing step 14 (attempt 1, after a resume)" in message
    assert "scheduler.last_epoch: 14 vs 7" in message
    assert "diverged" not in message and "final weights differ" not in message
    assert runner.check(_every_7("sidecar_train"), Plan.parse("sigkill@9")).passed


def test_state_that_two_uninterrupted_runs_disagree_on_is_named_unrepeatable_not_restored_wrong(runner):
    """Python's random seeded from the OS and saved in every checkpoint, no loss drawing from it:
    the diff alone sees it, and a second uninterrupted run shows it was never repeatable."""
    with pytest.raises(ChaosFailure) as failure:
        runner.check(trainer("broken_unseeded_random"), Plan.parse("sigterm@7"))
    message = str(failure.value)
    assert "not deterministic without any preemption: two uninterrupted runs already differ in" in message, message
    assert "trainer.pt:rng.python.1" in message and "random.seed" in message, message
    assert "latent" not in message and "state not restored" not in message, message


def test_entries_listed_as_ignored_may_differ(runner):
    job = _every_7("broken_sidecar_no_scheduler", state_diff_ignore=("scheduler.*",))
    assert runner.check(job, Plan.parse("sigkill@9")).passed


@pytest.mark.unit
def test_the_diff_walks_nested_state_and_ranks_causes_first():
    import torch

    reference = {
        "model": {"w": torch.ones(3)},
        "optimizer": {"state": {0: {"step": torch.tensor(12.0), "exp_avg": torch.zeros(3)}}},
        "scheduler": {"last_epoch": 12, "_last_lr": [0.1]},
        "rng": {"python": (3, tuple(range(625)), None)},
    }
    chaos = {
        "model": {"w": torch.full((3,), 2.0)},
        "optimizer": {"state": {0: {"step": torch.tensor(4.0), "exp_avg": torch.zeros(3)}}},
        "scheduler": {"last_epoch": 4, "_last_lr": [0.1]},
        "rng": {"python": (3, tuple(range(1, 626)), None)},
        "extra": 1,
    }
    found = diff(reference, chaos, limit=3)
    entries = [(d["entry"], d["reference"], d["chaos"]) for d in found["differences"]]
    assert entries == [
        ("extra", "absent", "present"),
        ("rng.python.1", "625 values", "625 values"),  # RNG words: one entry, not 625
        ("scheduler.last_epoch", "12", "4"),
    ]
    assert found["more"] == 2  # optimizer.state.0.step (12.0 vs 4.0), then model.w (differs)
    rest = diff(reference, chaos, limit=10)["differences"][3:]
    assert [(d["entry"], d["reference"], d["chaos"]) for d in rest] == [
        ("optimizer.state.0.step", "12.0", "4.0"),
        ("model.w", "differs", "differs"),
    ]
    assert diff(reference, reference, limit=3) == {"differences": [], "more": 0}
    assert diff({"lr": 0.1, "w": torch.ones(2)}, {"lr": 0.2, "w": torch.zeros(2)}, 5, exact_floats=False) == {
        "differences": [],
        "more": 0,
    }


@pytest.mark.unit
def test_checkpoints_are_kept_whole_inside_the_run_or_not_at_all_and_an_oversized_one_is_said(tmp_path, monkeypatch):
    import spotchaos.training.state.kept as state_diff

    root = tmp_path / "checkpoints"
    (root / "ckpt-4").mkdir(parents=True)
    (root / "ckpt-4" / "model.pt").write_bytes(b"x" * 100)
    (root / "ckpt-4" / "outside").symlink_to("/etc/passwd")
    kept = tmp_path / "kept"
    kept.mkdir()
    state_diff.keep({"uri": (root / "ckpt-4").as_uri(), "step": 3}, 1, root, kept)
    assert sorted(p.name for p in (kept / "a1-s3").iterdir()) == ["model.pt"]  # the link is never followed
    state_diff.keep({"uri": "file:///etc", "step": 5}, 1, root, kept)  # outside the run: not kept
    state_diff.keep({"uri": (root / "ckpt-4").as_uri(), "step": 9, "reason": "observed"}, 1, root, kept)
    assert not (kept / "a1-s9").exists()  # a log-adapter file credited by timing, not by its content
    monkeypatch.setattr(state_diff, "KEEP_BYTES", 10)
    state_diff.keep({"uri": (root / "ckpt-4").as_uri(), "step": 7}, 1, root, kept)
    assert not (kept / "a1-s7").exists() and state_diff.too_big(kept) == ["a1-s7"]


@pytest.mark.unit
def test_values_named_like_times_hosts_and_pids_are_compared_and_their_ignore_line_suggested():
    """A name proves nothing (issue 38): what a heuristic would have skipped is a difference, named
    as likely no state, with the line that would skip it; equal ones are no difference."""
    reference = {"saved_at": 1.0, "hostname": "a", "meta": {"train_runtime": 2.0, "pid": 5}, "num_updates": 1}
    chaos = {"saved_at": 2.0, "hostname": "b", "meta": {"train_runtime": 3.0, "pid": 5}, "num_updates": 2}
    found = {d["entry"]: d.get("suggest") for d in diff(reference, chaos, 9)["differences"]}
    assert found == {
        "num_updates": None,
        "saved_at": "named like a moment, a machine or a process",
        "hostname": "named like a moment, a machine or a process",
        "meta.train_runtime": "named like a moment, a machine or a process",
    }


@pytest.mark.unit
def test_the_diff_skips_only_checksums_sizes_of_files_and_the_runs_own_folder():
    """A manifest's checksum or byte count of a file is derived (the file is compared itself).
    A hex-looking value that is no checksum (a sample cursor, a seed), a key that is just
    ``node``, ``at`` or ``wall``, a job's literal ``{run}`` text and a value named like a time are
    state, and compared."""
    run_a, run_b = "/runs/a", "/runs/b"
    pairs = {  # key: (the reference's value, the resumed run's)
        "sampler": ({"cursor": "10000042"}, {"cursor": "10000099"}),
        "node": (3, 4),
        "at": (7, 8),
        "wall": (1, 2),
        "files": (
            {"model.pt": {"crc32c": "0123abcd", "bytes": 48301}},
            {"model.pt": {"crc32c": "89abcdef", "bytes": 48365}},
        ),
        "shards": ({"size": 4}, {"size": 5}),  # a size of no file: state
        "digests": ({"0.weight": "ab" * 32}, {"0.weight": "cd" * 32}),
        "template": ("{run}/out", f"{run_b}/out"),
        "saved_at": (1.5, 2.5),
        "node_name": ("host-a", "host-b"),
        "path": (f"{run_a}/ckpt", f"{run_b}/ckpt"),
    }
    reference = {key: values[0] for key, values in pairs.items()}
    chaos = {key: values[1] for key, values in pairs.items()}
    found = {d["entry"] for d in diff(reference, chaos, 20, runs=(run_a, run_b))["differences"]}
    assert found == {"sampler.cursor", "node", "at", "wall", "template", "saved_at", "node_name", "shards.size"}
    manifest = diff({"model.pt": "0123abcd"}, {"model.pt": "89abcdef"}, 5, within="checksums.json")
    assert manifest["differences"] == []  # the file's name says what its values are


@pytest.mark.unit
def test_a_checkpoint_saved_over_after_its_event_is_not_kept_as_that_steps(tmp_path):
    """A script that overwrites one ``ckpt.pt``, its copy taken late on a loaded machine: the copy
    would hold a later step's state and be compared as this step's (a false 'latent' failure)."""
    import os
    import time

    import spotchaos.training.state.kept as state_diff

    root = tmp_path / "checkpoints"
    root.mkdir()
    ckpt = root / "ckpt.pt"
    ckpt.write_bytes(b"step 5")
    seen = os.stat(ckpt).st_mtime_ns
    observed = {"uri": ckpt.as_uri(), "step": 5, "stored": 5, "reason": "observed", "mtime_ns": seen}
    probe = {"uri": ckpt.as_uri(), "step": 5, "t": time.time()}
    kept = tmp_path / "kept"
    kept.mkdir()
    state_diff.keep(observed, 0, root, kept)
    assert (kept / "a0-k5" / "ckpt.pt").read_bytes() == b"step 5"  # the version its key was read from
    ckpt.write_bytes(b"step 20")
    os.utime(ckpt, ns=(seen + 10**9, seen + 10**9))  # saved over a second later
    state_diff.keep({**observed, "stored": 6}, 0, root, kept)
    probe["t"] = seen / 1e9
    state_diff.keep(probe, 0, root, kept)
    assert not (kept / "a0-k6").exists() and not (kept / "a0-s5").exists()
    state_diff.keep({**probe, "t": time.time() + 2}, 1, root, kept)
    assert (kept / "a1-s5" / "ckpt.pt").read_bytes() == b"step 20"  # saved before its event: kept


@pytest.mark.unit
def test_the_sessions_kept_copies_share_identical_files_and_stop_at_their_budget(tmp_path):
    """A resume that was right writes the reference's bytes again: kept once (a link, read by the
    diff as equal without a read); past the budget a checkpoint is not kept, and that is said."""
    from spotchaos.training.state.formats import same_bytes
    from spotchaos.training.state.kept import KeptCopies, keep, not_kept

    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "a.pt").write_bytes(b"a" * 600)
    (root / "b.pt").write_bytes(b"b" * 600)
    reference, chaos = tmp_path / "ref.kept", tmp_path / "chaos.kept"
    reference.mkdir()
    chaos.mkdir()
    copies = KeptCopies(budget_bytes=1000)
    keep({"uri": (root / "a.pt").as_uri(), "step": 3}, 0, root, reference, copies)
    keep({"uri": (root / "a.pt").as_uri(), "step": 3}, 1, root, chaos, copies)  # the same bytes again
    first, again = reference / "a0-s3" / "a.pt", chaos / "a1-s3" / "a.pt"
    assert os.stat(first).st_ino == os.stat(again).st_ino and again.read_bytes() == b"a" * 600
    assert copies.describe() == {"budget_bytes": 1000, "kept_bytes": 600, "shared_bytes": 600}
    assert same_bytes(first, again)
    keep({"uri": (root / "b.pt").as_uri(), "step": 7}, 1, root, chaos, copies)  # 600 more would pass 1000
    assert not (chaos / "a1-s7").exists() and not_kept(chaos) == {"too_big": [], "over_budget": ["a1-s7"]}
    shutil.rmtree(reference)  # a passing run's folder goes: the other name of its file serves
    copies.forget(reference)
    keep({"uri": (root / "a.pt").as_uri(), "step": 11}, 2, root, chaos, copies)
    assert os.stat(chaos / "a2-s11" / "a.pt").st_ino == os.stat(again).st_ino and copies.used == 600
    shutil.rmtree(chaos)
    copies.forget(chaos)
    assert copies.used == 0  # every copy gone: the whole budget is free again


def test_a_scenario_that_fails_on_a_leading_plan_reports_the_plans_it_ran(runner):
    """report.json said ``plans_tried: 0`` for a failed scenario whose leading plan failed."""
    from spotchaos.record import ScenarioRecord
    from spotchaos.search import ExploreSettings

    record = ScenarioRecord(scenario="leading", job="broken-no-scheduler-restore", seed=1)
    with record, pytest.raises(ChaosFailure):
        runner.explore(
            trainer("broken_no_scheduler_restore"),
            first=lambda *_: [Plan.parse("sigterm@7")],
            settings=ExploreSettings(max_examples=3, seed=1),
        )
    assert record.plans_tried >= 1 and not record.passed


@pytest.mark.unit
def test_a_jobs_own_arguments_stored_as_its_restart_got_them_are_no_state_not_restored(tmp_path):
    """nanoGPT keeps its config (``init_from``) in its checkpoint, a Hugging Face script its args
    (``resume_from_checkpoint``): a restart's command adds those options, so the resumed run's
    checkpoint stores other values for them. Arguments both commands share are compared as ever."""
    import torch

    from spotchaos.training.state.diff import DiffRules, compare, restart_flags

    command = ("python", "train.py", "--lr=0.1", "--out", "{checkpoint_dir}")
    flags = restart_flags(command, ("--init_from=resume", "--resume-from-checkpoint", "{latest_checkpoint}"), None)
    assert flags == {"init_from", "resume_from_checkpoint"}
    assert restart_flags(command, (), ("python", "train.py", "--lr=0.2", "--out", "{checkpoint_dir}")) == {"lr"}
    stored = {"w": torch.ones(2), "config": {"init_from": "scratch", "resume_from_checkpoint": None, "lr": 0.1}}
    resumed = {**stored, "config": {"init_from": "resume", "resume_from_checkpoint": "step_5.pt", "lr": 0.1}}
    for run, state in (("ref", stored), ("chaos", resumed)):
        (tmp_path / run / "a1-s9").mkdir(parents=True)
        (tmp_path / run / "a0-s9").mkdir(parents=True)
        torch.save(state, tmp_path / run / "a1-s9" / "ckpt.pt")
        torch.save(stored, tmp_path / run / "a0-s9" / "ckpt.pt")
    assert compare(tmp_path / "ref", tmp_path / "chaos", confined=None, rules=DiffRules(restart_flags=flags)) is None
    found = compare(tmp_path / "ref", tmp_path / "chaos", confined=None)
    assert found is not None and set(found.entries) == {"config.init_from", "config.resume_from_checkpoint"}, found
    changed = {**resumed, "config": {**resumed["config"], "lr": 0.2}}  # an argument both share, stored otherwise
    torch.save(changed, tmp_path / "chaos" / "a1-s9" / "ckpt.pt")
    found = compare(tmp_path / "ref", tmp_path / "chaos", confined=None, rules=DiffRules(restart_flags=flags))
    assert found is not None and found.entries == ["config.lr"], found


@pytest.mark.unit
def test_a_checkpoint_named_for_why_it_was_written_is_compared_with_the_references_of_its_step(tmp_path):
    """A notice's save (sigterm-step=12.ckpt) where the uninterrupted run wrote its periodic one
    (epoch=1-step=12.ckpt): the same state under another name is no difference; other state under
    it is named with both names. Two unmatched files of different kinds are still absent/present."""
    import json

    from spotchaos.training.state.diff import DiffRules, _compare_folders

    reference, chaos = tmp_path / "a0-s11", tmp_path / "a1-s11"
    for folder, name, step in ((reference, "epoch=1-step=12.ckpt", 12), (chaos, "sigterm-step=12.ckpt", 12)):
        folder.mkdir()
        (folder / name).write_text(json.dumps({"global_step": step, "weights": [1.0, 2.0]}))
        (folder / "last.json").write_text(json.dumps({"step": step}))
    assert _compare_folders(reference, chaos, None, DiffRules()) == ([], 0)
    (chaos / "sigterm-step=12.ckpt").write_text(json.dumps({"global_step": 13, "weights": [1.0, 2.0]}))
    found, _ = _compare_folders(reference, chaos, None, DiffRules())
    assert [entry for entry, _ in found] == ["sigterm-step=12.ckpt (the reference's epoch=1-step=12.ckpt):(bytes)"], (
        found
    )
    (chaos / "sigterm-step=12.ckpt").rename(chaos / "sigterm-step=12.pt")
    found, _ = _compare_folders(reference, chaos, None, DiffRules())
    assert {text for _, text in found} == {
        "epoch=1-step=12.ckpt: present vs absent",
        "sigterm-step=12.pt: absent vs present",
    }

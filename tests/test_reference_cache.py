"""The reference kept across sessions: a second session on an unchanged job reads the job's
uninterrupted run (events, kept checkpoints, snapshots) from the cache instead of training it; a
changed job is a new entry; a cache that no longer matches what the job does (a file the
fingerprint cannot see) is found by the first run that fails, recomputed, and never blamed on the
job; a hostile or broken entry is ignored and rewritten, never followed.

Every session here is a real one over the real reference trainer: real runs, real copies.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from spotchaos.config.jobs import JobSpec, job_from_mapping, load_settings
from spotchaos.core import Allowed
from spotchaos.errors import ConfigError
from spotchaos.faults.plan import Plan
from spotchaos.record import ScenarioRecord
from spotchaos.report.gate_cost import cost_line, per_job
from spotchaos.session import Session
from spotchaos.training.reference.cache import ENTRY, ReferenceCache, fingerprint, why_not

from .helpers import FIXTURES, ROOT, run_pytest

WRAPPER = """\
import pathlib, runpy, sys
# the learning rate comes from a file whose name no command line holds: only the run's trace names it
rate = (pathlib.Path(__file__).parent / ("rate" + ".txt")).read_text().strip()
sys.argv = [{trainer!r}, *sys.argv[1:], "--lr", rate]
runpy.run_path({trainer!r}, run_name="__main__")
"""
# the same, read by another program (no Python audit hook there): neither the fingerprint nor the trace sees it
HIDDEN_WRAPPER = WRAPPER.replace(
    '(pathlib.Path(__file__).parent / ("rate" + ".txt")).read_text().strip()',
    '__import__("subprocess").check_output(["cat", pathlib.Path(__file__).parent / "rate.txt"], text=True).strip()',
)


def wrapped_job(folder: Path, rate: str = "0.003", *, hidden: bool = False) -> JobSpec:
    """The reference trainer behind a script of the test's own: 16 steps, checkpoints after 3, 7, 11, 15."""
    folder.mkdir(exist_ok=True)
    wrapper = HIDDEN_WRAPPER if hidden else WRAPPER
    (folder / "train.py").write_text(wrapper.format(trainer=str(FIXTURES / "reference_trainer.py")))
    (folder / "rate.txt").write_text(rate)
    command = ("python", str(folder / "train.py"), "--steps", "16", "--checkpoint-every", "4", "--step-seconds", "0")
    return JobSpec(name="wrapped", command=command, grace_seconds=10)


def session(tmp_path: Path, cache: ReferenceCache, label: str) -> Session:
    return Session(ROOT, workdir=tmp_path / label, reference_cache=cache)  # as --spotchaos-reference-cache


def entries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def test_a_second_session_reads_an_unchanged_jobs_reference_and_its_copies_instead_of_training_it(tmp_path):
    job, folder = wrapped_job(tmp_path / "job"), tmp_path / "cache"
    with session(tmp_path, ReferenceCache(folder), "first") as first:
        trained = first.reference(job)
        assert trained.cache["read"] is False and "stored as" in trained.cache["said"], trained.cache
    (entry,) = entries(folder)
    assert (folder.stat().st_mode & 0o777, entry.stat().st_mode & 0o777) == (0o700, 0o700)
    assert (entry / ENTRY).stat().st_mode & 0o777 == 0o600
    with session(tmp_path, ReferenceCache(folder), "second") as second, ScenarioRecord("cached", job.name, 1) as record:
        read = second.reference(job)
        said = read.cache["said"]
        assert read.cache["read"] is True and said.startswith("reference from the cache (fingerprint "), said
        assert said.endswith(f", made {time.strftime('%Y-%m-%d')} {said.split(', made ')[1][11:16]}): {entry}")
        assert [(s.step, s.loss, s.fingerprints) for s in read.steps] == [
            (s.step, s.loss, s.fingerprints) for s in trained.steps
        ]
        assert read.snapshots["steps"] == trained.snapshots["steps"] and read.workdir != trained.workdir
        assert Path(read.workdir + ".kept").is_dir()  # its kept checkpoints, for the state diff
        run, verdict = second.run(
            job, Plan.parse("sigkill@13"), Allowed(prefix=True)
        )  # from the cached copy of step 11
        assert verdict.passed, verdict.message()
        assert run.prefix_step == max(s for s in read.snapshots["steps"] if s < 13)
        uris = [e["uri"] for e in run.attempts[0].of_kind("checkpoint")]
        assert uris and all(u.startswith(Path(run.workdir, "checkpoints").as_uri()) for u in uris)
        again, verdict = second.run(
            job, Plan.parse("sigterm@2"), Allowed(prefix=True)
        )  # from step 0, against the cache
        assert verdict.passed and again.prefix_step is None, verdict.message()
    cost = per_job([{"job": job.name, "cost": record.cost}])[job.name]
    assert cost["cached_references"] == 1 and cost["runs"] == 2  # the two plans; no reference run
    assert "its reference read from the cache" in cost_line(job.name, cost)


def test_a_file_the_reference_read_that_changed_is_seen_when_the_entry_is_read(tmp_path):
    """No command line names rate.txt; the reference's trace does: a changed one means a reference
    trained again, said on the report, before any plan is judged against a stale one."""
    job, folder = wrapped_job(tmp_path / "job"), tmp_path / "cache"
    with session(tmp_path, ReferenceCache(folder), "first") as first:
        first.reference(job)
    with session(tmp_path, ReferenceCache(folder), "same") as same:
        assert same.reference(job).cache["read"] is True
    wrapped_job(tmp_path / "job", rate="0.01")
    with session(tmp_path, ReferenceCache(folder), "second") as second:
        cache = second.reference(job).cache
        assert cache["read"] is False, cache
        rate = tmp_path / "job" / "rate.txt"
        assert f"ignored: {rate}, which its uninterrupted run read, changed since it was cached" in cache["said"]


def test_a_cache_the_job_no_longer_matches_is_recomputed_never_a_failure_of_the_job(tmp_path):
    job, folder = wrapped_job(tmp_path / "job", hidden=True), tmp_path / "cache"
    with session(tmp_path, ReferenceCache(folder), "first") as first:
        stale = first.reference(job)
    wrapped_job(tmp_path / "job", rate="0.01", hidden=True)  # what the job does changes; nothing the harness sees
    with session(tmp_path, ReferenceCache(folder), "second") as second:
        assert second.reference(job).cache["read"] is True
        # a plan from a cached copy resumes the stale state: consistent with the stale reference, it passes
        early, verdict = second.run(job, Plan.parse("sigkill@6"), Allowed(prefix=True))
        assert verdict.passed and early.prefix_step == 3 and "recomputed" not in second.reference(job).cache
        # a plan from step 0 (every scenario has one) trains what the job does now: it differs (step 0 reports its
        # learning rate), and is judged again
        run, verdict = second.run(job, Plan.parse("sigkill@2"), Allowed(prefix=True))
        assert verdict.passed and run.prefix_step is None, verdict.message()
        fresh = second.reference(job)
        assert fresh.cache["recomputed"] == (
            "the cached reference of 'wrapped' no longer matches the job (step 0 differs): recomputed"
        )
        assert fresh.steps[1].loss != stale.steps[1].loss and run.steps[-1].loss == fresh.steps[-1].loss
        assert "stored as" in fresh.cache["said"]
    with session(tmp_path, ReferenceCache(folder), "third") as third:  # the entry was rewritten with the new one
        reread = third.reference(job)
        assert reread.cache["read"] is True and reread.steps[-1].loss == fresh.steps[-1].loss


def test_a_broken_job_still_fails_and_a_confirmed_cache_costs_one_reference_run(tmp_path):
    job = JobSpec(
        name="no-rng",
        command=("python", str(FIXTURES / "broken_no_rng_restore.py"), "--steps", "16", "--checkpoint-every", "4"),
        grace_seconds=10,
    )
    job = replace(job, command=(*job.command, "--step-seconds", "0"))
    folder = tmp_path / "cache"
    with session(tmp_path, ReferenceCache(folder), "first") as first:
        first.reference(job)
    with session(tmp_path, ReferenceCache(folder), "second") as second:
        _, verdict = second.run(job, Plan.parse("sigterm@9"), Allowed(prefix=True))
        assert not verdict.passed and "rng" in verdict.message()  # the defect, named as without the cache
        assert second.reference(job).cache["confirmed"] == "a run failed: the reference trained again matched"


def test_a_changed_script_or_environment_is_another_entry(tmp_path):
    job = wrapped_job(tmp_path / "job")
    digest = fingerprint(job, ROOT)
    assert fingerprint(job, ROOT) == digest
    assert fingerprint(replace(job, env=(("SEED_SALT", "1"),)), ROOT) != digest
    (tmp_path / "job" / "helper.py").write_text("X = 1\n")  # a module beside the script: it may import it
    assert fingerprint(job, ROOT) != digest
    beside = fingerprint(job, ROOT)
    (tmp_path / "job" / "rate.txt").write_text("0.5")  # invisible: what the runs are there for
    assert fingerprint(job, ROOT) == beside
    folder = tmp_path / "job" / "out"  # a folder a command line names (an output folder): no file, no error
    folder.mkdir()
    assert fingerprint(replace(job, env=(("OUT_DIR", str(folder)),)), ROOT) != beside


@pytest.mark.parametrize("spoil", ["a link", "garbage", "another format"])
def test_an_entry_that_is_a_link_garbage_or_of_another_format_is_ignored_and_rewritten(tmp_path, spoil):
    job, folder = wrapped_job(tmp_path / "job"), tmp_path / "cache"
    with session(tmp_path, ReferenceCache(folder), "first") as first:
        first.reference(job)
    (entry,) = entries(folder)
    elsewhere = tmp_path / "elsewhere"
    if spoil == "a link":  # a link to a folder of someone else's: never followed, never written into
        entry.rename(elsewhere)
        entry.symlink_to(elsewhere)
    elif spoil == "garbage":
        (entry / ENTRY).write_bytes(b"\x80not json")
    else:
        data = json.loads((entry / ENTRY).read_text())
        (entry / ENTRY).write_text(json.dumps({**data, "format": 0}))
    with session(tmp_path, ReferenceCache(folder), "second") as second:
        reference = second.reference(job)
        assert reference.cache["read"] is False and reference.cache["said"].startswith("ignored: "), reference.cache
        assert "stored as" in reference.cache["said"]
    assert not entry.is_symlink() and json.loads((entry / ENTRY).read_text())["format"] == 1
    if spoil == "a link":
        assert json.loads((elsewhere / ENTRY).read_text())["workdir"] != reference.workdir  # left as it was


def test_a_cache_folder_others_can_write_is_not_used_and_the_session_goes_on(tmp_path):
    job, folder = wrapped_job(tmp_path / "job"), tmp_path / "cache"
    folder.mkdir()
    os.chmod(folder, 0o777)
    with session(tmp_path, ReferenceCache(folder), "open") as run:
        reference = run.reference(job)
        assert "cannot be used" in reference.cache["said"] and "writable by others" in reference.cache["said"]
        assert reference.steps and not any(folder.iterdir())


@pytest.mark.unit
def test_what_is_never_cached_says_why():
    job = JobSpec(name="j", command=("python", "train.py"))
    assert why_not(job) is None
    assert why_not(replace(job, cache_reference=False)) == "cache_reference = false"
    assert why_not(replace(job, exactness="envelope")).startswith("envelope mode")
    assert why_not(replace(job, launcher="torchrun", nproc_per_node=2)) == "a torchrun job"
    assert why_not(replace(job, storage="s3")) == "its checkpoints are in S3"
    assert (
        job_from_mapping("j", {"command": ["python", "t.py"], "cache_reference": False}, "x").cache_reference is False
    )
    with pytest.raises(ConfigError, match="cache_reference"):
        job_from_mapping("j", {"command": ["python", "t.py"], "cache_reference": "no"}, "x")


def test_the_plugin_reads_the_cache_on_the_second_session_and_trains_again_when_asked(tmp_path):
    """Three `pytest --spotchaos` sessions on one project: the first keeps the reference, the
    second reads it (its summary says so), the third with --spotchaos-fresh-reference trains it."""
    project = tmp_path / "project"
    project.mkdir()
    job = wrapped_job(tmp_path / "job")
    command = ", ".join(json.dumps(word) for word in job.command)
    (project / "pyproject.toml").write_text(
        f"[tool.spotchaos.jobs.wrapped]\ncommand = [{command}]\ngrace_seconds = 10\n"
    )
    (project / "test_one.py").write_text(
        "def test_one(spotchaos, spotchaos_job):\n    spotchaos.check(spotchaos_job, 'sigkill@6')\n"
    )
    cache = tmp_path / "cache"
    said = []
    for extra in ((), (), ("--spotchaos-fresh-reference",)):
        done = run_pytest(
            project,
            "--spotchaos",
            f"--spotchaos-reference-cache={cache}",
            "--spotchaos-seed=1",
            *extra,
            "test_one.py",
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        report = json.loads((project / "spotchaos-report" / "report.json").read_text())
        (scenario,) = report["scenarios"]
        said.append(scenario["reference"]["cache"])
        if scenario["reference"]["cache"]["read"]:
            assert "its reference read from the cache" in done.stdout
    assert [s["read"] for s in said] == [False, True, False]
    assert said[2]["said"].startswith("not read: --spotchaos-fresh-reference; stored as")


def test_the_crash_points_of_a_save_come_from_the_references_own_trace_cached_or_not(tmp_path):
    """The reference logs its file-system events: a save's crash points cost no uninterrupted run
    of their own, and a cached reference brings them along."""
    job, folder = wrapped_job(tmp_path / "job"), tmp_path / "cache"
    with session(tmp_path, ReferenceCache(folder), "first") as first, ScenarioRecord("save", job.name, 1) as record:
        traced = first.save_boundaries(job)
        assert record.cost["runs"] == 1  # the reference alone: no trace run
    assert traced and all(isinstance(event["index"], int) for event in traced)
    with session(tmp_path, ReferenceCache(folder), "second") as second, ScenarioRecord("save", job.name, 1) as record:
        assert second.save_boundaries(job) == traced
        assert not record.cost.get("runs") and record.cost["cached_references"] == 1
        middle = traced[len(traced) // 2]["index"]
        _, verdict = second.run(job, Plan.parse(f"crash@{middle}"))
        assert verdict.passed, verdict.message()


def test_a_cached_reference_whose_checkpoints_name_its_own_folder_is_compared_as_trained_there(tmp_path):
    """A Trainer's training_args.bin holds its output_dir: the cached reference's checkpoints name the
    folder it was trained in, sessions ago, not the one it was copied to. The state diff takes that
    folder for the reference's own, as it takes the run's for the run's (else every resume of a
    Trainer read from the cache would be a latent failure in output_dir)."""
    trainer = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == "hf-trainer")
    folder = tmp_path / "cache"
    with session(tmp_path, ReferenceCache(folder), "first") as first:
        trained = first.reference(trainer)
    with session(tmp_path, ReferenceCache(folder), "second") as second:
        read = second.reference(trainer)
        assert read.cache["read"] is True and read.trained_in == trained.workdir != read.workdir
        _, verdict = second.run(trainer, Plan.parse("sigterm@9"))  # from step 0: its checkpoints diffed
        assert verdict.passed, verdict.message()
        assert "confirmed" not in read.cache and "recomputed" not in second.reference(trainer).cache


def test_an_entry_of_another_user_is_neither_trusted_nor_removed(tmp_path):
    """A restored CI cache can hold an entry another uid wrote: ignored, said so, and left in
    place (the harness removes only what it made)."""
    job, folder = wrapped_job(tmp_path / "job"), tmp_path / "cache"
    with session(tmp_path, ReferenceCache(folder), "first") as first:
        first.reference(job)
    (entry,) = entries(folder)
    for path in [entry, *entry.rglob("*")]:
        os.chown(path, 4242, 4242, follow_symlinks=False)
    with session(tmp_path, ReferenceCache(folder), "second") as second:
        cache = second.reference(job).cache
    assert cache["read"] is False and "ignored: an entry owned by uid 4242, not this user's" in cache["said"], cache
    assert "not stored: an entry of uid 4242 holds its place" in cache["said"], cache
    assert entries(folder) == [entry] and entry.stat().st_uid == 4242


SECRET_WRAPPER = """\
import os, pathlib, runpy, sys, urllib.parse
folder = pathlib.Path(urllib.parse.urlparse(os.environ["SPOTCHAOS_CHECKPOINT_URI"]).path)
folder.mkdir(parents=True, exist_ok=True)
(folder / "credentials.txt").write_text(os.environ["HF_TOKEN"])  # a secret kept beside its checkpoints
sys.argv = [{trainer!r}, *sys.argv[1:]]
runpy.run_path({trainer!r}, run_name="__main__")
"""


def test_a_reference_whose_checkpoints_hold_a_secret_is_not_cached(tmp_path):
    """The cache outlives the run folder in which the verdict would call the secret a leak: such a
    reference is not kept, and the report says why."""
    (tmp_path / "train.py").write_text(SECRET_WRAPPER.format(trainer=str(FIXTURES / "reference_trainer.py")))
    command = ("python", str(tmp_path / "train.py"), "--steps", "8", "--checkpoint-every", "4", "--step-seconds", "0")
    token = "hf_" + "Zq8vR2mXw4Kp7Ls9Tn3Bc6Yd1Fg5Hj0Q"
    job = JobSpec(name="secretive", command=command, grace_seconds=10, env=(("HF_TOKEN", token),))
    folder = tmp_path / "cache"
    with session(tmp_path, ReferenceCache(folder), "first") as first:
        cache = first.reference(job).cache
    assert "not cached: its checkpoints hold a secret (" in cache["said"] and "credentials.txt" in cache["said"], cache
    assert token not in cache["said"] and entries(folder) == []


HELPER_WRAPPER = """\
import pathlib, subprocess, sys
here = pathlib.Path(__file__).parent
sys.path[:0] = [str(here / "lib"), {fixtures!r}]
import helper  # a module no line of the job's table names, in a folder beside no script
from reference_trainer import Trainer, main

if {hidden!r}:  # the helper's one setting read by another program: no trace of this process sees it
    helper.EXTRA = dict([subprocess.check_output(["cat", str(here / "lib" / "extra.txt")], text=True).split("=")] if
                        (here / "lib" / "extra.txt").stat().st_size else [])


class WithHelper(Trainer):
    def trainer_state(self):
        return {{**super().trainer_state(), **helper.EXTRA}}


main(WithHelper)
"""


@pytest.mark.parametrize("hidden", [False, True], ids=["imported", "read-by-another-program"])
def test_a_helper_the_table_does_not_name_changing_a_checkpoint_recomputes_and_never_fails_the_job(tmp_path, hidden):
    """The issue's false alarm: a helper module outside the fingerprint adds one entry to each
    checkpoint; training is unchanged. Imported, the read trace sees it changed when the entry is
    read; read by another program, the first failing plan (its state differs from the cached
    reference's kept checkpoints) trains the reference again, which differs in its kept
    checkpoints: recomputed and judged again, never 'not deterministic'."""
    folder = tmp_path / "job"
    (folder / "lib").mkdir(parents=True)
    (folder / "train.py").write_text(HELPER_WRAPPER.format(fixtures=str(FIXTURES), hidden=hidden))
    (folder / "lib" / "helper.py").write_text("EXTRA = {}\n")
    (folder / "lib" / "extra.txt").write_text("")
    command = ("python", str(folder / "train.py"), "--steps", "16", "--checkpoint-every", "4", "--step-seconds", "0")
    job = JobSpec(name="helped", command=command, grace_seconds=10)
    cache = tmp_path / "cache"
    with session(tmp_path, ReferenceCache(cache), "first") as first:
        first.reference(job)
    if hidden:
        (folder / "lib" / "extra.txt").write_text("note=added by the helper")
    else:
        (folder / "lib" / "helper.py").write_text("EXTRA = {'note': 'added by the helper'}\n")
    with session(tmp_path, ReferenceCache(cache), "second") as second:
        reference = second.reference(job)
        assert reference.cache["read"] is hidden, reference.cache
        if not hidden:
            assert (
                f"ignored: {folder / 'lib' / 'helper.py'}, which its uninterrupted run read" in reference.cache["said"]
            )
        _, verdict = second.run(job, Plan.parse("sigterm@9"))
        assert verdict.passed, verdict.message()
        if hidden:
            recomputed = second.reference(job).cache["recomputed"]
            assert "no longer matches the job (its kept checkpoints differ (" in recomputed, recomputed

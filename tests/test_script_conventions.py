"""Unmodified scripts with conventions of their own, gated without false alarms (the log adapter).

The careful script (fixtures/sidecar_train.py) counts steps from 1, names checkpoints by step,
trusts one only once its .sha256 is written and prints its own rollbacks; broken ones write
their checkpoint in place, insist on resuming, or print their token.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis.errors import FlakyFailure

from spotchaos.config.jobs import job_from_mapping, load_settings
from spotchaos.config.logspec import DEFAULT_PATTERN, LogSpec
from spotchaos.errors import ConfigError, JobError
from spotchaos.faults.plan import Plan
from spotchaos.search import explore
from spotchaos.session import ChaosFailure, ExploreSettings
from spotchaos.training.events import LineReader
from spotchaos.training.logadapter import LogEventReader

from .helpers import FIXTURES, ROOT, plain_job


def sidecar_job(**log):
    """The pyproject.toml job, with its log table changed by ``log`` (None removes a key)."""
    job = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == "sidecar-script")
    table = {k: v for k, v in {**job.log.describe(), **log}.items() if v not in (None, [])}
    table.pop("pattern")  # the default one reads it
    command = ["python", str(FIXTURES / "sidecar_train.py"), "--out", "{checkpoint_dir}", "--steps", "20"]
    return job_from_mapping(
        "sidecar", {"command": command, "resume_args": ["--resume"], "log": table}, "pyproject.toml"
    )


def test_a_script_counting_from_1_is_learned_and_said(runner):
    reference = runner.reference(sidecar_job())
    convention = reference.convention
    assert convention["first_step"] == 1 and convention["key_offset"] == 1, convention
    assert "steps printed from 1; checkpoint key 'step' holds the number of steps completed" in convention["text"]
    assert "its newest checkpoint holds step=20 after step line 20" in convention["text"]
    assert [s.step for s in reference.steps] == list(range(20))  # counted from 0 inside, whatever is printed
    # every checkpoint credited to the step it holds: ckpt_00000005.pt holds steps 1-5, the 5th is step 4
    assert [e["step"] for e in reference.attempts[0].of_kind("checkpoint")] == [4, 9, 14, 19]


@pytest.mark.parametrize("plan", ["sigterm@9", "sigkill@12", "sigterm@19", "sigkill@3,sigterm@16"])
def test_the_careful_script_passes_notices_and_kills(runner, plan):
    verdict = runner.check(sidecar_job(), Plan.parse(plan))
    assert verdict.passed, verdict.message()
    assert "steps here count from 0 (the script's step line 1 is step 0)" in verdict.precision


def test_the_careful_script_rolls_back_from_damage_and_says_so_in_its_own_words(runner):
    verdict = runner.check(sidecar_job(), Plan.parse("sigterm@11:flip-bit-data"))
    assert verdict.passed, verdict.message()
    (outcome,) = verdict.damage
    assert outcome.rolled_back and outcome.ok and outcome.resumed_from == 9, outcome


def test_without_its_rollback_pattern_the_silent_skip_is_named(runner):
    with pytest.raises(ChaosFailure, match=r"skipped the damaged checkpoint .* without saying so"):
        runner.check(sidecar_job(rollback_pattern=None), Plan.parse("sigterm@11:flip-bit-data"))


def _sidecar_rename(runner, job) -> int:
    """The crash point between a checkpoint's rename into place and its digest's."""
    boundaries = runner.save_boundaries(job)
    renames = [b for b in boundaries if b["event"] == "os.rename" and b["path"].endswith(".sha256")]
    assert renames, boundaries
    return renames[0]["index"]


def test_a_kill_between_the_checkpoint_and_its_digest_is_not_a_lost_checkpoint(runner):
    """The script trusts a checkpoint once its digest exists: killed before the digest's rename,
    it resumes from the older one, which is exactly what checkpoint_complete tells the harness."""
    job = sidecar_job()
    verdict = runner.check(job, Plan.parse(f"crash@{_sidecar_rename(runner, job)}"))
    assert verdict.passed, verdict.message()


def test_without_checkpoint_complete_that_kill_is_a_false_alarm(runner):
    """The same crash, judged as if the .pt alone made the checkpoint durable: it fails a correct
    script, which is why checkpoint_complete exists."""
    job = sidecar_job(checkpoint_complete=None)
    with pytest.raises(ChaosFailure, match=r"left neither the old nor the new checkpoint loadable"):
        runner.check(job, Plan.parse(f"crash@{_sidecar_rename(runner, job)}"))


def test_crash_points_exist_for_log_adapter_scripts(runner):
    """save_boundaries found nothing for a script read from its log: the crash scenario died with
    hypothesis's InvalidArgument. Every boundary is inside one save of the uninterrupted run."""
    boundaries = runner.save_boundaries(plain_job("plain_train"))
    kinds = {b["event"] for b in boundaries}
    assert {"open-write", "os.rename"} <= kinds, boundaries  # os.replace audits as os.rename
    verdict = runner.check(plain_job("plain_train"), Plan.parse(f"crash@{boundaries[-1]['index']}"))
    assert verdict.passed, verdict.message()


def test_a_bare_torch_save_killed_mid_write_is_named_a_torn_checkpoint(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(plain_job("broken_bare_save"), Plan.parse("sigkill@11"))
    message = str(failure.value)
    assert "attempt 1, the restart after sigkill after step 11, exited with status 1 before its first step" in message
    assert "torn checkpoint — ckpt.pt is 0 bytes" in message and "os.replace it into place" in message
    assert "work was lost silently" not in message  # one finding, not its echoes


def test_a_resume_flag_with_nothing_to_resume_is_named_with_the_fix(runner):
    job = plain_job("broken_resume_needs_checkpoint")
    with pytest.raises(ChaosFailure) as failure:
        runner.check(job, Plan.parse("sigkill@2"))
    message = str(failure.value)
    assert "under plan sigkill@2" in message
    assert "started with '--resume' but no checkpoint matching 'ckpt.pt' existed yet" in message
    assert "resume_if_exists = 'ckpt.pt'" in message
    fixed = plain_job("broken_resume_needs_checkpoint", resume_if_exists="ckpt.pt")
    assert runner.check(fixed, Plan.parse("sigkill@2")).passed
    assert runner.check(fixed, Plan.parse("sigterm@7")).passed  # with a checkpoint it still resumes


def test_a_job_printing_its_own_env_secret_fails_any_scenario(runner):
    job = plain_job("broken_prints_token", env={"HF_TOKEN": "hf_Zq8vLx2mWn4RtY6uPk0sJd3F"})
    with pytest.raises(ChaosFailure, match=r"a secret \(HF_TOKEN, .*\) appears in: attempt-0/stdout.log"):
        runner.check(job, Plan.parse("sigterm@6"))


# The reader alone: what the uninterrupted run's lines must look like.


def _reader(tmp_path: Path, lines: list[str], saved: dict | None = None, **spec) -> LogEventReader:
    """A reader of the uninterrupted run over ``lines``, with the checkpoints ``saved`` (name -> state)."""
    import torch

    (tmp_path / "ckpt").mkdir(parents=True)
    for name, state in (saved or {}).items():
        torch.save(state, tmp_path / "ckpt" / name)
    log = tmp_path / "stdout.log"
    log.write_text("".join(line + "\n" for line in lines))
    reader = LogEventReader(LineReader(log), LogSpec(**spec), tmp_path / "ckpt", "script")
    reader.read_new()
    return reader


NANOGPT = [
    "step 0: train loss 4.2176, val loss 4.2208",
    "iter 0: loss 4.2196, time 1234.56ms, mfu -100.00%",
    "iter 1: loss 3.9911, time 101.10ms, mfu -100.00%",
]


@pytest.mark.unit
def test_the_default_pattern_will_not_guess_between_two_kinds_of_line(tmp_path):
    with pytest.raises(ConfigError) as raised:
        _reader(tmp_path, NANOGPT)
    message = str(raised.value)
    assert "matches two kinds of line ('step 0: train loss 4.2176, val loss 4.2208'; 'iter 0: loss 4.2196" in message
    assert "set log.pattern" in message


@pytest.mark.unit
def test_an_explicit_pattern_reads_nanogpt_iter_lines(tmp_path):
    reader = _reader(tmp_path, NANOGPT, pattern=r"iter (?P<step>\d+): loss (?P<loss>[-+0-9.eE]+)")
    assert [(e["step"], e["printed"]) for e in reader.events if e["event"] == "step"] == [(0, "4.2196"), (1, "3.9911")]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("lines", "spec", "message"),
    [
        (
            ["step 0 loss 1.0", "step 10 loss 0.9"],
            {},
            r"printed step 10 right after step 0 .* exactly one line per step",
        ),
        (["step 5 loss 1.0"], {}, r"first matching line is step 5 .* counted from 0 or 1"),
        (["step 1 loss 1.0"], {"first_step": 0}, r"log.first_step is 0 but .* first step line is step 1"),
    ],
)
def test_an_uninterrupted_run_that_does_not_count_one_line_per_step_is_one_clear_error(tmp_path, lines, spec, message):
    with pytest.raises(ConfigError, match=message):
        _reader(tmp_path, lines, **spec)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("log", "message"),
    [
        ({"checkpoint_step": "done", "checkpoint_step_key": "step"}, r"checkpoint_step: must be one of"),
        ({"checkpoint_step": "next"}, r"checkpoint_step: says what checkpoint_step_key holds"),
        ({"first_step": 2}, r"first_step: the printed number of the first step, 0 or 1"),
        ({"checkpoint_complete": "digest.txt", "checkpoints": "*.pt"}, r"must name a file beside the checkpoint"),
        ({"checkpoint_complete": "{name}.ok"}, r"checkpoint_complete: needs checkpoints"),
        ({"rollback_pattern": "rollback: ("}, r"rollback_pattern: .* is not a regular expression"),
        ({"first_step": "1"}, r"first_step: must be an integer"),
    ],
)
def test_bad_convention_settings_are_named(log, message):
    with pytest.raises(ConfigError, match=message):
        job_from_mapping("x", {"command": ["python", "t.py"], "log": log}, "pyproject.toml")


@pytest.mark.unit
def test_a_checkpoint_key_that_tells_nothing_asks_for_the_setting(tmp_path):
    """A script whose newest checkpoint does not hold its last step (it ran on after its last
    save): the harness cannot tell what the key counts, and says which setting decides."""
    lines = [f"step {n} loss 1.0" for n in range(13)]
    spec = {"checkpoints": "ckpt.pt", "checkpoint_step_key": "step"}
    with pytest.raises(
        ConfigError, match=r"last step line is step 12 and its newest checkpoint holds 10 .*checkpoint_step"
    ):
        _reader(tmp_path / "a", lines, {"ckpt.pt": {"step": 10}}, **spec).learn()
    reader = _reader(tmp_path / "b", lines, {"ckpt.pt": {"step": 10}}, **spec, checkpoint_step="completed")
    convention = reader.learn()
    assert "log.checkpoint_step = 'completed'" in convention.learned_from
    assert [e["step"] for e in reader.events if e["event"] == "checkpoint"] == [9]


@pytest.mark.unit
def test_the_default_pattern_reads_common_step_lines():
    regex = LogSpec(pattern=DEFAULT_PATTERN).regex
    for line, step, loss in [
        ("step 12 loss 0.5", "12", "0.5"),
        ("step 12: loss=0.5 lr 1e-3", "12", "0.5"),
        ("iter 7: loss 3.25, time 10ms", "7", "3.25"),
        ("Iteration 3 | loss: 1e-05", None, None),  # capitalised: not matched, say so with a pattern
    ]:
        found = regex.search(line)
        assert (found and (found["step"], found["loss"])) == ((step, loss) if step else None), line


def test_a_failure_that_did_not_replay_shows_spotchaos_message_not_hypothesis_group(runner, monkeypatch):
    """Where a signal lands can decide a verdict; hypothesis then raises FlakyFailure with ~60
    lines of its own. Timing cannot be forced to differ on a replay, so the check is replaced by
    one that fails the first time only."""
    import spotchaos.search as search

    calls = []

    def flaky_check(core, job, plan, record, ran=None, **_):  # families.preemption.check's
        calls.append(plan)
        if len(calls) == 1:
            raise ChaosFailure(job.name, plan, _failed_verdict(), "/tmp/kept")

    monkeypatch.setattr(search, "check", flaky_check)
    job = plain_job("plain_train")
    with pytest.raises(ChaosFailure) as quiet:
        explore(runner, job, settings=ExploreSettings(max_examples=2))
    assert quiet.value.__cause__ is None and not isinstance(quiet.value, FlakyFailure)
    assert any("failed once and passed when replayed" in n for n in quiet.value.__notes__)
    calls.clear()
    with pytest.raises(ChaosFailure) as verbose:
        explore(runner, job, settings=ExploreSettings(max_examples=2, verbose=True))
    assert isinstance(verbose.value.__cause__, FlakyFailure)


def _failed_verdict():
    from spotchaos.training.verdict import Verdict

    return Verdict(False, ["loss diverged at step 3"], None, [], [], [], 0, [], 20)


def test_an_unmodified_script_can_be_audited_for_determinism(runner):
    """Its repeated uninterrupted runs count steps the way the first one taught, and agree."""
    found = runner.audit(plain_job("plain_train", steps=12, determinism_runs=2))
    assert found.reproducible, found.text()


@pytest.mark.unit
def test_another_ranks_line_that_does_not_parse_is_left_out_where_rank_0s_is_an_error(tmp_path):
    """One parse serves rank 0's lines and the other ranks' (read from torchrun's per-rank logs after
    the attempt): rank 0's unparsable line ends the run with the group named; another rank's is
    skipped, and its good lines are counted as rank 0's are."""
    pattern = r"step (?P<step>\S+) loss (?P<loss>\S+)"
    good = ["step 0 loss 2.5", "step 1 loss 2.25"]
    reader = _reader(tmp_path / "a", good, pattern=pattern)
    steps = reader.rank_steps(1, ["step x loss 2.0", "step 0 loss 2.5", f"step {2**53} loss 1.0", "step 1 loss nan?"])
    assert [(e["event"], e.get("step"), e["rank"]) for e in steps] == [("start", None, 1), ("step", 0, 1)], steps
    with pytest.raises(JobError, match=r"its step group 'x' is not an integer"):
        _reader(tmp_path / "b", ["step x loss 2.0"], pattern=pattern)
    with pytest.raises(JobError, match=r"its loss group 'nan\?' does not parse as a number"):
        _reader(tmp_path / "c", ["step 1 loss nan?"], pattern=pattern)

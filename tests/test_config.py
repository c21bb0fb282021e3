"""Declaring jobs: valid tables load, every bad key is named with its file."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from spotchaos.config.jobs import JobSpec, Settings, load_settings
from spotchaos.errors import ConfigError
from spotchaos.faults.plan import Plan, Preemption
from spotchaos.pytest_glue.options import Given, resolve

pytestmark = pytest.mark.unit  # starts no process: part of the fast loop (pytest -m unit)


def write(tmp_path, text):
    path = tmp_path / "pyproject.toml"
    path.write_text(text)
    return path


def test_jobs_load_with_defaults_and_python_alias(tmp_path):
    path = write(
        tmp_path,
        """
[tool.spotchaos]
output = "out"
[tool.spotchaos.jobs.train]
command = "python train.py --steps 10"
env = {A = "1"}
grace_seconds = 5
""",
    )
    settings = load_settings(path)
    assert settings.output == "out"
    (job,) = settings.jobs
    assert job.command == ("python", "train.py", "--steps", "10")
    assert job.argv(resume=False)[0] == sys.executable
    assert job.argv(resume=True) == job.argv(resume=False)
    assert job.environment() == {"A": "1"} and job.grace_seconds == 5


def test_missing_file_or_table_means_no_jobs(tmp_path):
    assert load_settings(tmp_path / "nope.toml").jobs == ()
    assert load_settings(write(tmp_path, "[tool.other]\nx = 1\n")).jobs == ()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[tool.spotchaos.jobs.t]\ncomand = 'x'\n", r"\[tool.spotchaos.jobs.t\].comand: unknown key"),
        ("[tool.spotchaos.jobs.t]\nenv = {}\n", r"\[tool.spotchaos.jobs.t\].command: required"),
        ("[tool.spotchaos.jobs.t]\ncommand = 3\n", r"\.command: must be a string or a list of strings"),
        ("[tool.spotchaos.jobs.t]\ncommand = ''\n", r"\.command: must not be empty"),
        (
            "[tool.spotchaos.jobs.t]\ncommand = 'x'\ngrace_seconds = -1\n",
            r"\.grace_seconds: must be a number of seconds in \(0, 1e\+06\], got -1",
        ),
        (
            "[tool.spotchaos.jobs.t]\ncommand = 'x'\ncheckpoint_budget_seconds = '30'\n",
            r"\.checkpoint_budget_seconds: must be a number of seconds in \(0, 1e\+06\], got '30'",
        ),
        ("[tool.spotchaos.jobs.t]\ncommand = 'x'\nenv = {A = 1}\n", r"\.env: must be a table of strings"),
        ("[tool.spotchaos]\nouptut = 'x'\n", r"\[tool.spotchaos\].ouptut: unknown key"),
        ("[tool.spotchaos\n", "not valid TOML"),
    ],
)
def test_invalid_entries_name_the_key_and_the_file(tmp_path, body, message):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError, match=message) as info:
        load_settings(path)
    assert str(path) in str(info.value)


def test_job_key_changes_with_what_shapes_the_trajectory():
    a = JobSpec(name="a", command=("python", "t.py"))
    assert a.key() == JobSpec(name="b", command=("python", "t.py"), grace_seconds=3).key()
    assert a.key() != JobSpec(name="a", command=("python", "t.py", "--seed", "2")).key()
    assert a.key() != JobSpec(name="a", command=("python", "t.py"), env=(("X", "1"),)).key()
    assert a.key() != JobSpec(name="a", command=("python", "t.py"), gpus=1).key()  # handed a device: its own


def test_python_declared_job_errors_name_the_job():
    with pytest.raises(ConfigError, match=r"JobSpec\(name='j'\).event_timeout_seconds"):
        JobSpec(name="j", command=("x",), event_timeout_seconds=0)


def test_describe_hides_environment_values():
    job = JobSpec(name="a", command=("x",), env=(("AWS_SECRET_ACCESS_KEY", "hunter2"),))
    assert "hunter2" not in repr(job.describe())


def test_plan_parse_and_errors():
    plan = Plan.parse("sigterm@5, sigkill@12")
    assert plan.preemptions == (Preemption(5, "sigterm"), Preemption(12, "sigkill"))
    assert str(plan) == "sigterm@5,sigkill@12" and Plan.parse(str(plan)) == plan
    with pytest.raises(ConfigError, match="unknown preemption 'sigint'"):
        Plan.parse("sigint@3")
    with pytest.raises(ConfigError, match="must look like FAULT@STEP"):
        Plan.parse("sigterm")


def _resolve(environ=None, settings=None, last_seed=None, **given):
    return resolve(Given(**given), environ=environ or {}, settings=settings or Settings(), last_seed=last_seed)


def test_options_precedence_and_errors():
    assert _resolve(seed="7").seed == 7
    assert _resolve(seed="last", last_seed=99).seed == 99
    assert _resolve(environ={"SPOTCHAOS_SEED": "3"}).seed == 3
    assert _resolve(environ={"CI": "true"}).profile == "quick"
    assert _resolve().profile == "standard"
    assert _resolve(examples=9).max_examples == 9
    with pytest.raises(ConfigError, match="--spotchaos-seed=last: no previous"):
        _resolve(seed="last")
    with pytest.raises(ConfigError, match="--spotchaos-seed: expected an integer"):
        _resolve(seed="abc")
    with pytest.raises(ConfigError, match="--spotchaos-profile"):
        _resolve(profile="huge")
    with pytest.raises(ConfigError, match="--spotchaos-job: no job or service named 'x'"):
        _resolve(jobs=["x"])
    assert _resolve().audit == 0 and _resolve(audit=2).audit == 2
    assert (
        _resolve(environ={"SPOTCHAOS_AUDIT": "3"}).audit == 3
        and _resolve(audit=1, environ={"SPOTCHAOS_AUDIT": "3"}).audit == 1
    )
    with pytest.raises(ConfigError, match=r"--spotchaos-audit \(or SPOTCHAOS_AUDIT\) must be a count"):
        _resolve(environ={"SPOTCHAOS_AUDIT": "many"})
    assert _resolve().tails and not _resolve(tails="off").tails
    assert not _resolve(environ={"SPOTCHAOS_TAILS": "off"}).tails
    with pytest.raises(ConfigError, match=r"--spotchaos-tails \(or SPOTCHAOS_TAILS\): expected 'on' or 'off'"):
        _resolve(tails="maybe")


def test_saved_runs_go_where_history_says_with_a_gitignore_and_off_saves_none(tmp_path):
    from spotchaos.report.history import save_run, saved_runs

    assert _resolve().history == ".spotchaos" and _resolve(history="off").history is None
    assert _resolve(environ={"SPOTCHAOS_HISTORY": "ci/gate-runs"}).history == "ci/gate-runs"
    with pytest.raises(ConfigError, match=r"--spotchaos-history .*expected a folder or 'off'"):
        _resolve(history=" ")
    folder = tmp_path / ".spotchaos"
    first = save_run({"scenarios": []}, folder)
    assert (folder / ".gitignore").read_text().splitlines()[-1] == "*"  # git status stays as it was
    (folder / ".gitignore").write_text("mine\n")  # a folder the user owns now: left as it is
    second = save_run({"scenarios": []}, folder)
    assert saved_runs(folder) == [first, second] and (folder / ".gitignore").read_text() == "mine\n"


def test_old_timeout_names_still_work_with_a_deprecation_warning(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.spotchaos.jobs.a]\ncommand = ["python", "x.py"]\nevent_timeout = 7\n')
    with pytest.warns(DeprecationWarning, match=r"\.event_timeout is deprecated: call it event_timeout_seconds"):
        (job,) = load_settings(pyproject).jobs
    assert job.event_timeout_seconds == 7
    pyproject.write_text(
        '[tool.spotchaos.jobs.a]\ncommand = ["python", "x.py"]\nevent_timeout = 7\nevent_timeout_seconds = 8\n'
    )
    with pytest.raises(ConfigError, match="give event_timeout_seconds only"):
        load_settings(pyproject)


@pytest.mark.unit
def test_every_command_line_option_reaches_the_resolved_options():
    """``Given`` is the command line as one object: each of its fields is read from a
    ``--spotchaos-*`` option the plugin declares (``verbose`` from pytest's -v), none forgotten."""
    from dataclasses import fields

    import spotchaos.plugin as plugin
    from spotchaos.pytest_glue.pytest_session import _GIVEN

    assert set(_GIVEN) | {"verbose"} == {f.name for f in fields(Given)}
    declared = set(re.findall(r'"--(spotchaos-[a-z-]+)"', Path(plugin.__file__).read_text()))
    assert {f"spotchaos-{option.replace('_', '-')}" for option in _GIVEN.values()} <= declared

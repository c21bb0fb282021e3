"""The Python API beside the fixture: a session as a context manager, loaded only when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .helpers import FIXTURES, ROOT


@pytest.mark.unit
def test_importing_the_probe_loads_nothing_of_the_harness():
    code = (
        "import sys, spotchaos, spotchaos.probe\n"
        "heavy = ('hypothesis', 'spotchaos.runner', 'spotchaos.training.engine.run', 'torch')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from spotchaos import JobSpec, Plan, Session\n"
        "assert 'spotchaos.runner' in sys.modules and Plan.parse('sigterm@5').preemptions[0].at_step == 5\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_a_session_checks_a_plan_outside_pytest_and_cleans_up(tmp_path):
    from spotchaos import ChaosFailure, JobSpec, Session

    job = JobSpec(
        name="api",
        command=("python", str(FIXTURES / "reference_trainer.py"), "--steps", "12", "--checkpoint-every", "4"),
    )
    broken = JobSpec(
        name="api-broken",
        command=("python", str(FIXTURES / "broken_no_rng_restore.py"), "--steps", "12", "--checkpoint-every", "4"),
    )
    with Session(ROOT, workdir=tmp_path / "runs") as session:
        verdict = session.check(job, "sigkill@6")
        assert verdict.passed and verdict.first_divergence is None
        with pytest.raises(ChaosFailure, match="loss diverged"):
            session.check(broken, "sigkill@6")
    kept = [p.name for p in (tmp_path / "runs").iterdir()]
    assert kept and all("api-broken" in name for name in kept)  # only the failing run is kept, for inspection


@pytest.mark.unit
def test_a_session_checks_a_service_by_its_declared_name(tmp_path):
    """``session.check_drain("model")``, as docs/serving.md shows: the name is looked up in the
    session's own pyproject.toml (an unknown one is one error listing the declared services)."""
    from spotchaos import Session
    from spotchaos.errors import ConfigError

    declared = '[tool.spotchaos.services.api]\ncommand = ["python", "serve.py", "{port}"]\n'
    (tmp_path / "pyproject.toml").write_text(declared)
    with Session(tmp_path) as session, pytest.raises(ConfigError, match=r"no service 'model' .*declared: api"):
        session.check_drain("model")


@pytest.mark.unit
def test_the_fixture_offers_the_sessions_marked_methods_and_names_them_for_a_misspelling():
    from spotchaos.pytest_glue.scenario import Scenario
    from spotchaos.runner import ChaosRunner
    from spotchaos.session import entry_of

    marked = {n: entry_of(getattr(ChaosRunner, n)) for n in dir(ChaosRunner) if entry_of(getattr(ChaosRunner, n, None))}
    assert marked["check"].scenario and marked["check"].plans == 1
    assert not marked["reference"].scenario and not marked["checkpoint_steps"].scenario  # queries, handed over
    fixture = Scenario.__new__(Scenario)  # no pytest item needed to look a name up
    fixture._state = type("State", (), {"runner": ChaosRunner.__new__(ChaosRunner)})()
    with pytest.raises(AttributeError, match=r"no scenario 'chek' \(it has: .*\bcheck, check_drain\b.*\)"):
        _ = fixture.chek

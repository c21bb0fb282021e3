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
        "heavy = ('hypothesis', 'spotchaos.session', 'spotchaos.training.engine.run', 'torch')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from spotchaos import JobSpec, Plan, Session\n"
        "assert 'spotchaos.session' in sys.modules and Plan.parse('sigterm@5').preemptions[0].at_step == 5\n"
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
    from spotchaos.session import Session, entry_of

    marked = {n: entry_of(getattr(Session, n)) for n in dir(Session) if entry_of(getattr(Session, n, None))}
    assert marked["check"].scenario and marked["check"].plans == 1
    assert not marked["reference"].scenario and not marked["checkpoint_steps"].scenario  # queries, handed over
    fixture = Scenario.__new__(Scenario)  # no pytest item needed to look a name up
    fixture._state = type("State", (), {"session": Session.__new__(Session)})()
    with pytest.raises(AttributeError, match=r"no scenario 'chek' \(it has: .*\bcheck, check_drain\b.*\)"):
        _ = fixture.chek


@pytest.mark.unit
def test_the_names_before_0_2_still_import_with_one_warning_naming_the_new_path():
    """``spotchaos.runner.ChaosRunner`` and ``spotchaos.session.SessionCore`` (0.1) are kept one
    release: the very classes of today, the old module path with a DeprecationWarning."""
    code = (
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "from spotchaos.session import Session, SessionCore, ChaosRunner\n"
        "from spotchaos.core import Core\n"
        "assert ChaosRunner is Session and SessionCore is Core and issubclass(Session, Core)\n"
        "try:\n"
        "    import spotchaos.runner\n"
        "except DeprecationWarning as warned:\n"
        "    assert 'spotchaos.runner moved to spotchaos.session' in str(warned), warned\n"
        "else:\n"
        "    raise AssertionError('no warning')\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from spotchaos.runner import ChaosRunner as old\n"
        "assert old is Session\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stderr


@pytest.mark.unit
def test_a_session_option_that_does_not_exist_is_one_clear_error(tmp_path):
    from spotchaos import Session

    with pytest.raises(TypeError, match=r"Session: no option \['wram'\]; known: .*'warm'"):
        Session(tmp_path, workdir=tmp_path / "runs", wram=False)

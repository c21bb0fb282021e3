"""Shared helpers for the test suite: real processes, real torch, no mocks."""

from __future__ import annotations

import sys
import textwrap

import pytest

from spotchaos.runner import ChaosRunner

from .helpers import ROOT


@pytest.fixture(autouse=True)
def _inner_sessions_are_not_xdist_workers(monkeypatch):
    """The suite runs under pytest-xdist; a pytest session a test starts inherits the worker's
    PYTEST_XDIST_* variables and would take itself for a worker (pytest-benchmark then disables
    itself and writes no --benchmark-json). A user's session has none of them."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def runner(tmp_path_factory) -> ChaosRunner:
    """One runner for the session, so each job's reference run is computed once."""
    return ChaosRunner(ROOT, workdir=tmp_path_factory.mktemp("runs"))


@pytest.fixture
def script(tmp_path):
    """Write a small Python program to a file and return a command that runs it."""

    def make(body: str, name: str = "job.py") -> tuple[str, ...]:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body))
        return (sys.executable, str(path))

    return make


# The built-in scenarios this repository's own session adds on its reference job (builtin = true)
# are the main job's gate. CI keeps those whose fault tests/ drives nowhere else on that trainer
# (the notice, damage and its rollback, a crash inside a save, a crash while loading) and leaves to
# the main job and the full run the ones tests/ drives on the same trainer already (docs/ci.md).
BUILTIN_IN_CI_ELSEWHERE = {
    "test_preemption.py::test_chained_preemptions_are_bit_exact[reference]": "test_reference_trainer.py's chained plan",
    "test_preemption.py::test_hard_kill_then_resume_is_bit_exact[reference]": "test_reference_trainer.py's sigkill@9",
    "test_budgets.py::test_checkpoint_overhead_within_budget[reference]": "test_budgets.py's overhead budget tests",
    "test_budgets.py::test_notice_flush_fits_half_the_grace_window[reference]": "test_budgets.py's notice flush test",
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        path, _, name = item.nodeid.rpartition("/")
        if path.endswith("spotchaos/scenarios") and name in BUILTIN_IN_CI_ELSEWHERE:
            item.add_marker(pytest.mark.full)

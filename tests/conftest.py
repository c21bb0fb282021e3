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

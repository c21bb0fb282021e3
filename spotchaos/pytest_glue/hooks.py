"""Hooks users implement in conftest.py (pytest hook specifications)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec
def pytest_spotchaos_jobs(config: pytest.Config) -> list[Any] | None:
    """Return extra :class:`spotchaos.config.JobSpec` objects, for jobs declared in Python."""


@pytest.hookspec
def pytest_spotchaos_report(config: pytest.Config, report: dict[str, Any]) -> None:
    """Called with the report document before it is written; add or change fields in place."""

"""Declarations: jobs (``jobs``), the options of a run, containers, presets, profiles and the table
shape jobs and services share.

``from spotchaos.config import JobSpec`` (the documented path) keeps working: the names of ``jobs``
are handed on when first asked for, so importing a sibling such as ``spotchaos.config.declare``
does not load the job loader.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    jobs = importlib.import_module("spotchaos.config.jobs")
    try:
        return getattr(jobs, name)
    except AttributeError:
        raise AttributeError(f"module 'spotchaos.config' has no attribute {name!r}") from None

"""spotchaos: preempt a real training job and fail the build unless it resumes bit-exact.

Kept import-light on purpose: ``spotchaos.probe`` is imported inside training processes and
containers, and importing it runs this file first. The Python API (``from spotchaos import
Session, JobSpec, Plan``) is loaded on first use, so a trainer that imports the probe never
pays for the runner, hypothesis or the backends.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import _moved

__version__ = "0.1.0"
_moved.install()  # the 0.1 import paths (spotchaos.engine, spotchaos.plan, ...) for one more release

_LAZY = {
    "Session": "spotchaos.runner",
    "ChaosFailure": "spotchaos.runner",
    "JobSpec": "spotchaos.config.jobs",
    "Plan": "spotchaos.faults.plan",
    "Preemption": "spotchaos.faults.plan",
    "SpotchaosError": "spotchaos.errors",
    "ScenarioFailure": "spotchaos.errors",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'spotchaos' has no attribute {name!r}")

"""spotchaos: preempt a real training job and fail the build unless it resumes bit-exact.

Kept import-light on purpose: ``spotchaos.probe`` is imported inside training processes and
containers, and importing it runs this file first. The Python API (``from spotchaos import
Session, JobSpec, Plan``) is loaded on first use, so a trainer that imports the probe never
pays for the runner, hypothesis or the backends.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__version__ = "0.1.0"


class _MovedPaths:
    """The 0.1 import paths (``spotchaos.engine``, ``spotchaos.plan``...) for one more release. At the
    end of ``sys.meta_path``, so asked only for a name no other finder found; ``spotchaos/_moved.py``
    (the table, the warning) is imported only then, never by a trainer importing the probe."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith("spotchaos.") or fullname == "spotchaos._moved":
            return None
        from . import _moved

        return _moved.find_spec(fullname)


if not any(type(finder).__name__ == "_MovedPaths" for finder in sys.meta_path):
    sys.meta_path.append(_MovedPaths())

_LAZY = {
    "Session": "spotchaos.session",
    "Allowed": "spotchaos.core.judging",
    "ChaosFailure": "spotchaos.session",
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

"""Where a job runs. The engine talks to one small interface; each backend implements it.

``subprocess`` is the embedded default. A backend owns the whole life of what it starts: after
``cleanup`` nothing it started may still run, whatever path led there.
"""

from __future__ import annotations

from .base import Backend, Handle, LaunchSpec
from .subprocess import SubprocessBackend

__all__ = ["Backend", "Handle", "LaunchSpec", "SubprocessBackend"]

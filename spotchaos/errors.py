"""One exception hierarchy, so callers can catch spotchaos's own problems apart from bugs.

Every message says what went wrong and what to do about it; the pytest plugin shows it as the
scenario's single failure line.
"""

from __future__ import annotations


class SpotchaosError(Exception):
    """Base of every error spotchaos raises on purpose."""


class ConfigError(SpotchaosError):
    """A job or option is invalid; the message names the key and where it came from."""


class JobError(SpotchaosError):
    """The job under test misbehaved outside the faults we injected: it never started, hung,
    crashed, or wrote events we cannot read."""


class BackendError(SpotchaosError):
    """The machinery that runs jobs (process spawning, a Docker daemon) failed."""


class ReportError(SpotchaosError):
    """A saved report cannot be read: missing, truncated, not ours, or from a newer schema."""

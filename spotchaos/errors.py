"""One exception hierarchy, so callers can catch spotchaos's own problems apart from bugs.

Every message says what went wrong and what to do about it; the pytest plugin shows it as the
scenario's single failure line. Two families: a :class:`ScenarioFailure` is a verdict (the job
did not resume bit-exact, broke a budget, lost a checkpoint under a storage fault); any other
:class:`SpotchaosError` means the scenario could not be judged (a bad option, a job that never
started, a daemon that does not answer). Both derive from :class:`SpotchaosError`, so a caller
catches one type.
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


class ScenarioUnfit(SpotchaosError):
    """The scenario cannot act on this job as declared (a damage scenario on a job that checkpoints
    once an epoch): a skip that says why and what to change, never a crash of the harness and never
    a pass."""


class ReportError(SpotchaosError):
    """A saved report cannot be read: missing, truncated, not ours, or from a newer schema."""


class ScenarioFailure(SpotchaosError, AssertionError):
    """A verdict: the job broke what the scenario checks. An ``AssertionError`` too, so pytest
    reports it as a failed test, not as an error in the test's set-up."""


class NotDeterministic(ScenarioFailure):
    """Two uninterrupted runs of the job differ: no resume can be judged bit for bit. Its own
    verdict, with where they part and a checklist, never mistaken for a resume bug."""

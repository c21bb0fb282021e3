"""Time budgets of the declared jobs: checkpoint overhead and the answer to a notice.

The seed: checkpointing too often eats the savings through storage I/O, and a notice is only
useful if the checkpoint is durable well inside the provider's window.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spotchaos


def test_checkpoint_overhead_within_budget(spotchaos, spotchaos_job, request):
    """Checkpoint blocking time / training time <= the job's overhead_budget (default 5 %), read from
    the reference run; one more run timed by pytest-benchmark's ``benchmark`` fixture where it keeps
    its figures (spotchaos[bench] and --benchmark-json, --benchmark-save or --benchmark-autosave)."""
    spotchaos.check_overhead(spotchaos_job, benchmark=spotchaos.kept_benchmark(request))


def test_notice_flush_fits_half_the_grace_window(spotchaos, spotchaos_job):
    """From SIGTERM to a durable checkpoint in at most half of grace_seconds (provider preset)."""
    spotchaos.check_notice_flush(spotchaos_job)

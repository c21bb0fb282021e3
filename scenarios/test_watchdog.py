"""The built-in watchdog scenario on the bundled ``ddp-watchdog`` job: a rank SIGSTOPped, and the
job's own collective timeout (8 s) must end it non-zero before the harness's hang detection would
(docs/platforms.md). CI gates it, and the same trainer without a timeout, in
tests/test_watchdog.py.

On a job of your own: declare ``watchdog_seconds`` and run
``pytest --spotchaos --spotchaos-job NAME --pyargs spotchaos.scenarios.test_distributed -k watchdog``.
"""

import pytest

from spotchaos.scenarios.test_distributed import test_a_hung_rank_is_ended_by_the_jobs_own_watchdog  # noqa: F401

pytestmark = [pytest.mark.spotchaos(jobs=["ddp-watchdog"]), pytest.mark.full]

"""The built-in preemption and budget scenarios on the reference trainer with two DataLoader
workers (``reference-workers``): a notice, a kill and chained preemptions must resume its data
order bit-exact with workers prefetching, and its notice flush must fit the grace window with
workers in its process group.

The checkpoint-damage scenarios are not run here: their plans are the ``reference`` job's, the
same trainer with the same checkpoint code, and the workers only read data, so what they test
(rolling back from a damaged checkpoint, a crash inside a save or a load) does not change with
them. CI runs the built-in scenarios on this job in containers (tests/test_backend_docker.py), so
these are the main job's (``full``).

On a job of your own: ``pytest --spotchaos --spotchaos-job NAME`` runs every built-in scenario.
"""

import pytest

from spotchaos.scenarios.test_budgets import (  # noqa: F401
    test_checkpoint_overhead_within_budget,
    test_notice_flush_fits_half_the_grace_window,
)
from spotchaos.scenarios.test_preemption import (  # noqa: F401
    test_chained_preemptions_are_bit_exact,
    test_hard_kill_then_resume_is_bit_exact,
    test_notice_then_resume_is_bit_exact,
)

pytestmark = [pytest.mark.spotchaos(jobs=["reference-workers"]), pytest.mark.full]

"""The built-in preemption and budget scenarios on the reference trainer's data-loader variants:
with two DataLoader workers (``reference-workers``), and with its data position kept by torchdata's
``StatefulDataLoader`` (``stateful-loader``, two workers too). A notice, a kill and chained
preemptions must resume each one's data order bit-exact with workers prefetching (the stateful
loader's mid-epoch and at an epoch's end), and its notice flush must fit the grace window with
workers in its process group.

The checkpoint-damage scenarios are not run here: their plans are the ``reference`` job's, the
same trainer with the same checkpoint code (the stateful loader's state is one more entry of the
same file), and the loaders only read data, so what they test (rolling back from a damaged
checkpoint, a crash inside a save or a load) does not change with them. CI runs the built-in
scenarios on ``reference-workers`` in containers (tests/test_backend_docker.py) and resumes the
stateful loader mid-epoch and at an epoch's end (tests/test_stateful_loader.py), so these are the
main job's (``full``).

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

pytestmark = [pytest.mark.spotchaos(jobs=["reference-workers", "stateful-loader"]), pytest.mark.full]

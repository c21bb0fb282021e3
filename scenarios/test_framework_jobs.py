"""The built-in scenarios (preemptions, damaged checkpoints, budgets) on the bundled jobs written
from the frameworks' tutorials: the Hugging Face Trainer, Lightning, accelerate. (The reference
trainer's data-loader variants, with DataLoader workers and with torchdata's
``StatefulDataLoader``, are scenarios/test_loader_workers.py's.) One file of the main job, so one
``pytest -n 3 --spotchaos scenarios`` balances them with every other family's scenarios across its
workers (they were a second command, run after the first). CI runs a subset of each
(tests/test_frameworks.py), so these are the main job's (``full``).

On a job of your own: ``pytest --spotchaos --spotchaos-job NAME`` runs the same built-in scenarios.
"""

import pytest

from spotchaos.scenarios.test_budgets import (  # noqa: F401
    test_checkpoint_overhead_within_budget,
    test_notice_flush_fits_half_the_grace_window,
)
from spotchaos.scenarios.test_checkpoint_damage import (  # noqa: F401
    test_crash_inside_a_checkpoint_save_leaves_a_loadable_checkpoint,
    test_crash_while_loading_on_resume_then_resume_again,
    test_damaged_newest_checkpoint_rolls_back,
)
from spotchaos.scenarios.test_preemption import (  # noqa: F401
    test_chained_preemptions_are_bit_exact,
    test_hard_kill_then_resume_is_bit_exact,
    test_notice_then_resume_is_bit_exact,
)

JOBS = ["hf-trainer", "lightning", "accelerate"]

pytestmark = [pytest.mark.spotchaos(jobs=JOBS), pytest.mark.full]

"""The built-in multi-rank scenarios on the framework jobs ``accelerate-ddp``, ``lightning-ddp`` and
``hf-trainer-ddp`` (pyproject.toml), the accelerate, Lightning and Trainer jobs data-parallel on 2
ranks under torchrun:
whole-job preemptions, a killed and a hung rank, a rank killed anywhere in its save (accelerate's
written to a temporary folder and renamed into place; Lightning's one file written by rank 0; the
Trainer's checkpoint-N with each rank's RNG file).
Damaged checkpoints and the determinism baseline passed on accelerate-ddp too (56 s, 50 s here); the
main job leaves them to the one-process jobs and to ``ddp``. CI leaves this file out:
tests/test_framework_ranks.py drives their notices, a killed rank and the broken jobs.

On your own: ``pytest --spotchaos --spotchaos-job NAME --pyargs spotchaos.scenarios.test_distributed``.
"""

import pytest

from spotchaos.scenarios.test_distributed import (  # noqa: F401
    test_a_killed_rank_and_a_hung_rank,
    test_a_rank_killed_anywhere_in_its_save_resumes_from_a_complete_checkpoint,
    test_ranks_resume_bit_exact_after_preemptions,
)

pytestmark = [pytest.mark.spotchaos(jobs=["accelerate-ddp", "lightning-ddp", "hf-trainer-ddp"]), pytest.mark.full]

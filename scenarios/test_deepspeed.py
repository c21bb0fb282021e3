"""The built-in multi-rank scenarios on the bundled ``deepspeed`` job (pyproject.toml): the
distributed trainer run by a DeepSpeed engine with ZeRO stage 3 on DeepSpeed's CPU accelerator over
gloo, its parameters, gradients and Adam moments partitioned over 2 ranks, its checkpoints
DeepSpeed's own (a model-states and an optimizer-states file per rank) with a manifest written last.
Here: whole-job preemptions, damaged and unfinished files rolled back, and a rank killed anywhere
in its part of a save (a killed and a hung rank are tests/test_deepspeed.py's, with ZeRO 1 and 2).
A ZeRO checkpoint loads on its own world size only, so there is no resharding scenario. CI runs
none of it (docs/ci.md).

On a DeepSpeed job of your own:
``pytest --spotchaos --spotchaos-job NAME --pyargs spotchaos.scenarios.test_distributed``.
"""

import pytest

from spotchaos.scenarios.test_distributed import (  # noqa: F401
    test_a_rank_killed_anywhere_in_its_save_resumes_from_a_complete_checkpoint,
    test_damaged_and_unfinished_shards_roll_back,
    test_ranks_resume_bit_exact_after_preemptions,
)

pytestmark = [pytest.mark.spotchaos(jobs=["deepspeed"]), pytest.mark.full]

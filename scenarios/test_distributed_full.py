"""The rest of the built-in multi-rank scenarios on ``ddp``: the main job's full exploration. CI's
test command leaves them out (``-m "not full"``) because tests/test_distributed.py drives the same
faults there (chained preemptions, the determinism every multi-rank verdict in CI relies on: a job
that differs between two uninterrupted runs fails them). A killed and a hung rank and the resume on
another world size run on the sharded ``fsdp2`` job instead (scenarios/test_fsdp2.py): the same
trainer and the same harness paths, with the state that is harder to restore."""

import pytest

from spotchaos.scenarios.test_distributed import (  # noqa: F401
    test_a_rank_killed_anywhere_in_its_save_resumes_from_a_complete_checkpoint,
    test_determinism_baseline_of_its_world_size,
    test_ranks_resume_bit_exact_after_preemptions,
)

pytestmark = [pytest.mark.spotchaos(jobs=["ddp"]), pytest.mark.full]

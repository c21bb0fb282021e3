"""The rest of the built-in multi-rank scenarios on ``ddp``: the main job's full exploration. CI's
test command leaves them out (``-m "not full"``) because tests/test_distributed.py drives the same
faults on the same job there (chained preemptions, a killed rank, a hung rank, a resume on one rank
fewer), and its determinism baseline, which every multi-rank verdict in CI relies on already
(a job that differs between two uninterrupted runs fails them): CI's 25 minutes are the limit."""

import pytest

from spotchaos.scenarios.test_distributed import (  # noqa: F401
    test_a_killed_rank_and_a_hung_rank,
    test_a_rank_killed_anywhere_in_its_save_resumes_from_a_complete_checkpoint,
    test_determinism_baseline_of_its_world_size,
    test_ranks_resume_bit_exact_after_preemptions,
    test_resume_on_another_world_size,
)

pytestmark = [pytest.mark.spotchaos(jobs=["ddp"]), pytest.mark.full]

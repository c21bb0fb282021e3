"""The FSDP2 job writing its checkpoints with ``dcp.async_save`` (``fsdp2-async``, pyproject.toml):
a rank killed at every file-system event of a save, which here happen in the background thread
while training goes on. The job must publish a checkpoint only once the write's future is done on
every rank, and resume from the previous one when a rank dies before. CI kills rank 1 inside the
background write on it and on the broken trainer that publishes when ``async_save`` returns
(tests/test_distributed.py)."""

import pytest

from spotchaos.scenarios.test_distributed import (  # noqa: F401
    test_a_rank_killed_anywhere_in_its_save_resumes_from_a_complete_checkpoint,
)

pytestmark = [pytest.mark.spotchaos(jobs=["fsdp2-async"]), pytest.mark.full]

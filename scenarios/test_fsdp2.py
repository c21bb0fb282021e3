"""The built-in multi-rank scenarios on the bundled ``fsdp2`` job (pyproject.toml): the
distributed trainer with its model and Adam moments sharded by FSDP2 and checkpointed through DCP.
The scenarios whose faults meet the sharded state: whole-job preemptions, a killed and a hung rank,
damaged and unfinished shards, a resume on 1 rank (DCP reshards). The crash points inside a save and
the determinism baseline run on ``ddp`` (scenarios/test_distributed_full.py): the same save
protocol and the same trainer, so the main job does not pay them twice. CI runs a killed rank and
the broken asynchronous publication on it (tests/test_distributed.py).

On a sharded job of your own: ``pytest --spotchaos --spotchaos-job NAME --pyargs spotchaos.scenarios.test_distributed``.
"""

import pytest

from spotchaos.scenarios.test_distributed import (  # noqa: F401
    test_a_killed_rank_and_a_hung_rank,
    test_damaged_and_unfinished_shards_roll_back,
    test_ranks_resume_bit_exact_after_preemptions,
    test_resume_on_another_world_size,
)

pytestmark = [pytest.mark.spotchaos(jobs=["fsdp2"]), pytest.mark.full]

"""The built-in multi-rank scenarios on the bundled ``fsdp2`` job (pyproject.toml): the
distributed trainer with its model and Adam moments sharded by FSDP2 and checkpointed through DCP.
Here: a killed and a hung rank, and a resume on 1 rank (DCP reshards the DTensors). Whole-job
preemptions, damaged shards, the crash points inside a save and the determinism baseline run on
``ddp`` (scenarios/test_distributed.py, scenarios/test_distributed_full.py): the same trainer and
the same save protocol, so the main job does not pay them twice; every one passed on ``fsdp2`` too
(docs/distributed.md). CI runs a killed rank and the broken asynchronous publication on
``fsdp2`` (tests/test_distributed.py).

On a sharded job of your own: ``pytest --spotchaos --spotchaos-job NAME --pyargs spotchaos.scenarios.test_distributed``.
"""

import pytest

from spotchaos.scenarios.test_distributed import (  # noqa: F401
    test_a_killed_rank_and_a_hung_rank,
    test_resume_on_another_world_size,
)

pytestmark = [pytest.mark.spotchaos(jobs=["fsdp2"]), pytest.mark.full]

"""The built-in multi-rank scenarios (spotchaos/scenarios/test_distributed.py) on the bundled ``ddp``
job: 2 ranks of DDP under torchrun with sharded DCP checkpoints (pyproject.toml). Its lost-node
scenario runs on ``ddp-2nodes`` (scenarios/test_lost_node.py): the same trainer on two nodes would
repeat every other scenario here at twice the processes. The others (four whose ground
tests/test_distributed.py also covers on the same job, and the determinism baseline) are in
scenarios/test_distributed_full.py, which the main job runs and CI leaves out.

On a job of your own: ``pytest --spotchaos --spotchaos-job NAME --pyargs spotchaos.scenarios.test_distributed``.
"""

import pytest

from spotchaos.scenarios.test_distributed import test_damaged_and_unfinished_shards_roll_back  # noqa: F401

pytestmark = pytest.mark.spotchaos(jobs=["ddp"])

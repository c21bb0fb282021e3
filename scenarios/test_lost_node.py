"""The built-in lost-node scenario on ``ddp-2nodes``: the bundled DDP trainer as two one-rank nodes
meeting at a c10d rendezvous on 127.0.0.1, one of which is reclaimed whole."""

import pytest

from spotchaos.scenarios.test_distributed import test_a_lost_node  # noqa: F401

pytestmark = pytest.mark.spotchaos(jobs=["ddp-2nodes"])

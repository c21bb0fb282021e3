"""The gallery's torchrun stand-in (docs/gallery.md): ``torchrun-snapshot``, PyTorch's fault-tolerant
tutorial's shape, read through the log adapter from rank 0's own log, and each other rank judged on
its own log (it prints on every rank). It has no SIGTERM handler, so it gets the hard kills; and, as
an unmodified multi-rank script, the rank scenarios: its last rank killed, then stopped. CI fails the
tutorial's own bookkeeping and a snapshot loaded on rank 0 alone (tests/test_torchrun_log.py).
"""

import pytest

from spotchaos.scenarios.test_distributed import test_a_killed_rank_and_a_hung_rank  # noqa: F401
from spotchaos.scenarios.test_preemption import test_hard_kill_then_resume_is_bit_exact  # noqa: F401

pytestmark = [pytest.mark.spotchaos(jobs=["torchrun-snapshot"]), pytest.mark.full]

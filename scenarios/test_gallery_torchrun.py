"""The gallery's torchrun stand-in (docs/gallery.md): ``torchrun-snapshot``, PyTorch's fault-tolerant
tutorial's shape, read through the log adapter from rank 0's own log. It has no SIGTERM handler, so
it gets the hard kills; CI fails the tutorial's own bookkeeping (tests/test_torchrun_log.py).
"""

import pytest

from spotchaos.scenarios.test_preemption import test_hard_kill_then_resume_is_bit_exact  # noqa: F401

pytestmark = [pytest.mark.spotchaos(jobs=["torchrun-snapshot"]), pytest.mark.full]

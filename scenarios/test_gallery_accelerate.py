"""The gallery's accelerate stand-in (docs/gallery.md): ``accelerate-save-state``, a loop that
checkpoints with ``save_state`` into ``step_N`` folders as accelerate's checkpointing example does,
read through the log adapter. It has no SIGTERM handler, so it gets the hard kills; CI fails the
example's own DataLoader (tests/test_gallery_scripts.py).
"""

import pytest

from spotchaos.scenarios.test_preemption import test_hard_kill_then_resume_is_bit_exact  # noqa: F401

pytestmark = [pytest.mark.spotchaos(jobs=["accelerate-save-state"]), pytest.mark.full]

"""The built-in single-process scenarios that matter for checkpoints written in a thread, on the
bundled ``lightning-async`` job (pyproject.toml): Lightning with spotchaos's
``OrderedAsyncCheckpointIO`` on storage slowed to 0.3 s a write, one checkpoint kept. A kill lands
inside a save's file-system events (the write in the thread, its checksum, the older checkpoint's
deletion) and between a save's hand-off and its write's end; each restart must find a complete
checkpoint. Lightning's own ``AsyncCheckpointIO`` fails here (tests/test_frameworks.py).

On a job of your own: ``pytest --spotchaos --spotchaos-job NAME --pyargs spotchaos.scenarios.test_checkpoint_damage``.
"""

import pytest

from spotchaos.scenarios.test_checkpoint_damage import (  # noqa: F401
    test_crash_inside_a_checkpoint_save_leaves_a_loadable_checkpoint,
)
from spotchaos.scenarios.test_preemption import test_hard_kill_then_resume_is_bit_exact  # noqa: F401

pytestmark = [pytest.mark.spotchaos(jobs=["lightning-async"]), pytest.mark.full]

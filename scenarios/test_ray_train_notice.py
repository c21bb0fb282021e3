"""The built-in notice scenario on a Ray Train job (``ray-train-notice``): a ``sigterm`` drains the
nodes of both Train workers for preemption with the grace window as deadline; the loop reads it
from ``ray.train.get_preemption_info()`` and reports a just-in-time checkpoint, the nodes go at the
deadline, and Ray Train restarts the group from that checkpoint on their replacements, judged
bit-exact. CI runs one such plan (tests/test_ray_train.py), so this is the main job's (``full``).

On a job of your own: ``pytest --spotchaos --spotchaos-job NAME scenarios/test_ray_train_notice.py``
with ``launcher = "ray-train"`` on it, and steps that outlast its grace window (docs/ray.md).
"""

import pytest

from spotchaos.scenarios.test_preemption import test_notice_then_resume_is_bit_exact  # noqa: F401

pytestmark = [pytest.mark.spotchaos(jobs=["ray-train-notice"]), pytest.mark.full]

"""The built-in notice and hard-kill scenarios on the Ray backend: the reference trainer as ``reference-ray``,
each attempt on a worker node of a local Ray cluster (a head and two worker nodes,
``[tool.spotchaos.ray]``). A notice is the node drained for preemption with the grace window as its
deadline, then SIGTERM to the job there; a kill is the node removed; the next attempt runs on
another node. The plans run two at a time, one per worker node. CI runs a subset
(tests/test_backend_ray.py), so these are the main job's (``full``).

The checkpoint-damage scenarios are not run here: their plans are the ``reference`` job's, the same
trainer, and what they add is the harness's own work on its files between attempts, which does not
depend on where the job runs. What the Ray backend adds to them, a crash point armed in the job on
its node and the job's own failure read back from there, is tests/test_backend_ray.py's. Nor is the
chained scenario: its plans are ``reference``'s too, and what Ray adds to a chain (a notice drains
the node, the resume runs on another, which a kill then removes) is CI's
(tests/test_backend_ray.py, ``sigterm@7,sigkill@15``).

On a job of your own: ``pytest --spotchaos --spotchaos-backend=ray --spotchaos-job NAME``.
"""

import pytest

from spotchaos.scenarios.test_preemption import (  # noqa: F401
    test_hard_kill_then_resume_is_bit_exact,
    test_notice_then_resume_is_bit_exact,
)

pytestmark = [pytest.mark.spotchaos(jobs=["reference-ray"]), pytest.mark.full]

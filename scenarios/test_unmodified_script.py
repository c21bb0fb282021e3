"""Gating a training script that knows nothing of spotchaos, configured only in pyproject.toml.

The ``plain-script`` job reads its steps from the script's "step N loss X" lines (the log
adapter), appends ``--resume`` on restarts, lets the script write into the run's own checkpoint
directory through ``{checkpoint_dir}``, and compares the final weights stored under the
``model`` key of its last ``ckpt.pt`` bit for bit.
"""

import pytest

from spotchaos.strategies import preemption_plans


@pytest.mark.spotchaos(jobs=["plain-script"])
def test_unmodified_script_resumes_after_notice_and_hard_kill(spotchaos, spotchaos_job):
    spotchaos.explore(spotchaos_job, lambda steps: preemption_plans(steps, max_preemptions=2))

"""The built-in notice scenario where the platform reads the exit after a notice: a Kubernetes Job
(``platform = "kubernetes-job"``) retries only a job that exits non-zero, so the bundled
``kubernetes-job`` exits 143 after its checkpoint and must resume bit-exact. CI gates the exit
status both ways in tests/test_platforms.py; Slurm's platform is scenarios/test_slurm.py.

On a job of your own: declare ``platform`` (or ``exit_after_notice``) and run
``pytest --spotchaos --spotchaos-job NAME``.
"""

import pytest

from spotchaos.scenarios.test_preemption import test_notice_then_resume_is_bit_exact  # noqa: F401

pytestmark = [pytest.mark.spotchaos(jobs=["kubernetes-job"]), pytest.mark.full]

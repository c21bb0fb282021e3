"""The built-in Slurm scenario on the bundled ``slurm-requeue`` job (the reference trainer's own
handler) and ``lightning-slurm`` (Lightning's ``SLURMEnvironment(auto_requeue=True)``): the
partition's warning signal (USR1, 3 s before SIGTERM), SIGTERM, SIGKILL after KillWait, and the
job's own ``scontrol requeue`` under the same job id (docs/platforms.md). CI gates it, and its
broken forms (no requeue, no handler), in tests/test_platforms.py.

On a job of your own: declare ``platform = "slurm-requeue"`` (or ``"slurm-cancel"``) and
``slurm_signal``, then ``pytest --spotchaos --spotchaos-job NAME``: the scenario is built in.
"""

import pytest

from spotchaos.scenarios.test_preemption import test_slurm_warning_then_requeue_is_bit_exact  # noqa: F401

pytestmark = [pytest.mark.spotchaos(jobs=["slurm-requeue", "lightning-slurm"]), pytest.mark.full]

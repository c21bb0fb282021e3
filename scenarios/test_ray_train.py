"""The Ray Train job (``ray-train``: a ``TorchTrainer`` of two workers with ``FailureConfig``) on a
local Ray cluster of a head and two worker nodes: a lost worker node, a killed worker and the driver
killed, searched by hypothesis, each restored by Ray Train and judged bit-exact. The search leads
with the built-in hard-kill scenario's own plans (the driver killed, resumed from a checkpoint), so
that scenario, whose plans are a part of this search's, is not run on this job again. CI runs a
subset (tests/test_ray_train.py), so these are the main job's (``full``).

On a job of your own: ``pytest --spotchaos --spotchaos-job NAME scenarios/test_ray_train.py``
with ``launcher = "ray-train"`` on it (docs/ray.md).
"""

import pytest

from spotchaos.strategies import preemption_plans, resumes_across_epochs

pytestmark = [pytest.mark.spotchaos(jobs=["ray-train"]), pytest.mark.full]


def test_ray_train_restores_lost_nodes_killed_workers_and_a_killed_driver(spotchaos, spotchaos_job):
    """One or two of: the node of rank 1 reclaimed, rank 1's worker killed, the driver killed; first,
    the driver killed where the hard-kill scenario kills it."""
    faults = ("lose-node1", "kill-rank1", "sigkill")
    spotchaos.explore(
        spotchaos_job,
        lambda steps: preemption_plans(steps, faults=faults, max_preemptions=2),
        first=resumes_across_epochs("sigkill"),
    )

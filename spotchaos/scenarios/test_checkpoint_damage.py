"""Damaged checkpoints and crashes inside checkpoint writes and loads.

After damage to the newest checkpoint the job must resume from the newest intact one, say so
(a rollback event), and still end bit-exact; a crash at any file-system boundary of a save, or
while a restart loads its checkpoint, must leave a loadable checkpoint behind.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from spotchaos.errors import ScenarioUnfit
from spotchaos.faults.plan import Plan
from spotchaos.strategies import damage_plans

pytestmark = pytest.mark.spotchaos


def test_damaged_newest_checkpoint_rolls_back(spotchaos, spotchaos_job):
    """Truncation, bit flips, deleted or corrupt manifests, dropped files, swapped or stale pointers."""
    steps = spotchaos.checkpoint_steps(spotchaos_job)
    min_step = steps[1] + 1 if len(steps) > 1 else 0  # two checkpoints exist, so one can stay intact

    def plans(total: int):
        if min_step > total - 2:  # a job that checkpoints once an epoch, say: nowhere to act
            raise ScenarioUnfit(
                f"job {spotchaos_job.name!r} checkpoints after steps {steps} of {total}: no step is left to "
                "preempt after its second checkpoint, so a damaged newest checkpoint has no intact one to roll "
                "back to while training remains; checkpoint more often in the gate's configuration"
            )
        return damage_plans(total, min_step=min_step)

    spotchaos.explore(spotchaos_job, plans)


@pytest.mark.spotchaos(needs=["one process"])
def test_crash_inside_a_checkpoint_save_leaves_a_loadable_checkpoint(spotchaos, spotchaos_job):
    """SIGKILL before each file-system event of a save that also rotates old checkpoints away (from the
    reference's copy of the checkpoint before that save where the job takes it: ``crash@STEP+EVENT``)."""
    crashes = spotchaos.save_crash_points(spotchaos_job)
    inside = crashes[1:] or crashes  # before the save's first event nothing is written yet: a plain kill
    middle = inside[len(inside) // 2]  # first, a crash in the middle of the save's writes
    spotchaos.explore(spotchaos_job, st.sampled_from(inside), first=lambda epochs, checkpoints: [middle])


@pytest.mark.spotchaos(needs=["one process"])
def test_crash_while_loading_on_resume_then_resume_again(spotchaos, spotchaos_job):
    """A crash loop: hard kill, then another kill while the restart reads its checkpoint."""
    kill, reads = spotchaos.resume_boundaries(spotchaos_job)
    plans = st.sampled_from([Plan((kill, *Plan.parse(f"crash@{r['index']}").preemptions)) for r in reads])
    spotchaos.explore(spotchaos_job, plans)

"""The built-in preempt-and-resume scenarios, run against every job declared for spotchaos.

Each scenario lets hypothesis choose preemption plans for one job; the verdict demands a
bit-exact loss trajectory and final weights, SIGTERM answered inside the grace window by a
checkpoint, and every restart resuming from the newest durable checkpoint.
"""

from __future__ import annotations

import pytest

from spotchaos.config.exit_status import slurm_lead
from spotchaos.strategies import phase_preemptions, preemption_plans, resumes_across_epochs

pytestmark = pytest.mark.spotchaos


def test_notice_then_resume_is_bit_exact(spotchaos, spotchaos_job):
    """One SIGTERM (to the main process, or to the whole group as a VM shutdown sends it)."""
    spotchaos.explore(
        spotchaos_job,
        lambda steps: preemption_plans(steps, faults=("sigterm", "sigterm-group"), max_preemptions=1),
        first=resumes_across_epochs("sigterm"),  # from inside an epoch, and from its last step
    )


def test_hard_kill_then_resume_is_bit_exact(spotchaos, spotchaos_job):
    """One SIGKILL without notice: the job resumes from its newest periodic checkpoint."""
    spotchaos.explore(
        spotchaos_job,
        lambda steps: preemption_plans(steps, faults=("sigkill",), max_preemptions=1),
        first=resumes_across_epochs("sigkill"),  # from a checkpoint inside an epoch, and one at its end
    )


def test_chained_preemptions_are_bit_exact(spotchaos, spotchaos_job):
    """Two or three preemptions of any kind in one run, including during replayed steps; first a
    second resume inside the epoch the first resumed into, and a restart after the job finished."""
    spotchaos.explore(
        spotchaos_job,
        lambda steps: preemption_plans(steps, min_preemptions=2, max_preemptions=3),
        first=resumes_across_epochs("sigterm", twice=True, rerun=True),
    )


@pytest.mark.spotchaos(needs=["slurm"])
def test_slurm_warning_then_requeue_is_bit_exact(spotchaos, spotchaos_job):
    """Slurm's warning signal (``slurm_signal``), SIGTERM after its lead, SIGKILL after KillWait (the
    grace window); in requeue mode the job must ask ``scontrol requeue`` for its own restart."""
    fault = slurm_lead(spotchaos_job.slurm_signal)[0]
    spotchaos.explore(spotchaos_job, lambda steps: preemption_plans(steps, faults=(fault,), max_preemptions=2))


@pytest.mark.spotchaos(needs=["phases"])
def test_a_fault_inside_each_phase_then_resume_is_bit_exact(spotchaos, spotchaos_job):
    """A SIGTERM and a SIGKILL inside each phase the job declares (``phases``: those it marks with its
    probe's ``phase(NAME)``), held at the phase's start: a notice during evaluation must end it and
    checkpoint within the grace window, and a kill there must resume bit-exact. First inside the
    first such phase after a checkpoint (and before any), then drawn from every phase the job began."""
    plans = spotchaos.phase_plans(spotchaos_job)
    starts = spotchaos.phase_starts(spotchaos_job)
    spotchaos.explore(spotchaos_job, lambda steps: phase_preemptions(starts), first=lambda epochs, checkpoints: plans)

"""What a scenario needs of a job, and why a job that lacks it is skipped rather than failed.

A built-in scenario runs on every job a user names; a lost node means nothing to a one-node job and
a resume on fewer ranks needs a job that says it reshards. Each scenario names its needs
(``@pytest.mark.spotchaos(needs=["nodes"])``); a job without one gets the scenario skipped with a
reason that says what to declare, so a user's own job is gated by name without editing a marker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..config.exit_status import SLURM
from ..config.jobs import JobSpec
from ..errors import ConfigError


@dataclass(frozen=True)
class Need:
    """One thing a scenario needs of a job: how to tell, and what to declare when it is missing."""

    name: str
    holds: Callable[[JobSpec], bool]
    missing: Callable[[JobSpec], str]


NEEDS = {
    need.name: need
    for need in (
        Need(
            "ranks",
            lambda job: job.kind.local_ranks and job.world_size >= 2,
            lambda job: (
                f'needs a multi-rank job: launcher = "torchrun" with 2 or more ranks; {job.name!r} is '
                + (f"launcher = {job.launcher!r}" if not job.kind.local_ranks else f"{job.world_size} rank")
            ),
        ),
        Need(
            "nodes",
            lambda job: job.kind.local_ranks and job.nnodes >= 2,
            lambda job: f"needs several nodes: nnodes = 2 or more; {job.name!r} has nnodes = {job.nnodes}",
        ),
        Need(
            "one process",
            lambda job: job.world_size == 1,
            lambda job: (
                f"needs one process: its crash points count one process's file-system events; {job.name!r} runs "
                f"{job.world_size} ranks, whose saves test_distributed.py crashes rank by rank "
                "(test_a_rank_killed_anywhere_in_its_save_resumes_from_a_complete_checkpoint)"
            ),
        ),
        Need(
            "slurm",
            lambda job: job.platform in SLURM,
            lambda job: (
                f'needs a Slurm job: platform = "slurm-requeue" or "slurm-cancel" (and slurm_signal); {job.name!r} '
                f"has platform = {job.platform!r}"
            ),
        ),
        Need(
            "watchdog",
            lambda job: job.watchdog_seconds is not None,
            lambda job: (
                f"needs the job's own hang watchdog: declare watchdog_seconds (a hung collective ends {job.name!r} "
                "non-zero within it) if it has one"
            ),
        ),
        Need(
            "phases",
            lambda job: bool(job.phases),
            lambda job: (
                f'needs phases: declare phases = ["eval", ...], those {job.name!r} marks with its probe\'s '
                "phase(NAME), if it marks any"
            ),
        ),
        Need(
            "reshard",
            lambda job: job.reshard_nproc_per_node is not None,
            lambda job: (
                f"needs resharding: declare reshard_nproc_per_node (the ranks per node a resume may use) "
                f"for {job.name!r} if its checkpoints load on another world size"
            ),
        ),
    )
}


def unmet(job: JobSpec, needs: Iterable[str], where: str) -> str | None:
    """Why ``job`` cannot run a scenario that needs ``needs`` (the first missing one), or None.
    An unknown need is the scenario's own mistake: a ConfigError naming ``where``."""
    reasons = []
    for name in needs:
        need = NEEDS.get(name)
        if need is None:
            raise ConfigError(f"{where}: unknown need {name!r} in its spotchaos marker (known: {', '.join(NEEDS)})")
        if not need.holds(job):
            reasons.append(need.missing(job))
    return reasons[0] if reasons else None

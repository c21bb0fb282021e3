"""The built-in multi-rank scenarios, for jobs on torchrun: the whole job preempted, one rank killed
or hung, a node lost, shards damaged or cut off, a rank killed anywhere in its part of a save, a
resume on another world size, and each world size's determinism.

Run them on a job of your own by name (no marker to edit)::

    pytest --spotchaos --spotchaos-job my-ddp --pyargs spotchaos.scenarios.test_distributed

Each test says what it needs of a job and is skipped, with that reason, for one that lacks it:
``ranks`` (``launcher = "torchrun"``, 2 or more ranks in all), ``nodes`` (``nnodes`` of 2 or more)
and ``reshard`` (``reshard_nproc_per_node`` declared: the job's checkpoints load on that many ranks
per node). The plans' steps come from the job's uninterrupted run: a fault lands just after one of
its checkpoints, so every restart has one to resume from and a damaged one an older to fall back to.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from spotchaos.config.jobs import JobSpec

pytestmark = pytest.mark.spotchaos


def after_checkpoint(spotchaos, job: JobSpec, fraction: float) -> int:
    """The step after the first checkpoint at ``fraction`` of the run or later (a fault there finds
    it durable and the next one not yet written); the step at that fraction when there is none."""
    total = max(step.step for step in spotchaos.reference(job).steps)
    inside = [c for c in spotchaos.checkpoint_steps(job) if c < total - 1]
    later = [c for c in inside if c >= fraction * total]
    return (later[0] if later else inside[-1]) + 1 if inside else max(1, int(fraction * total))


def hang_watchdog_seconds(spotchaos, job: JobSpec) -> float:
    """How long a rank may be silent before it is named hung: ten times the longest silence of any
    rank in the uninterrupted run (between two of its events: steps, checkpoint saves, and its end:
    the restart after the hang trains to the end, and a framework's teardown after its last step is
    the slowest stretch of all on a loaded machine), at least 4 s, at most the job's own
    hang_timeout_seconds."""
    events = [e for e in spotchaos.reference(job).attempts[0].events if isinstance(e.get("t"), (int, float))]
    longest = 0.0
    for rank in {e.get("rank", 0) for e in events}:
        times = [e["t"] for e in events if e.get("rank", 0) == rank]
        longest = max([longest, *(b - a for a, b in itertools.pairwise(times))])
    return min(job.hang_seconds, max(4.0, 10 * longest))


@pytest.mark.spotchaos(needs=["ranks"])
def test_ranks_resume_bit_exact_after_preemptions(spotchaos, spotchaos_job):
    """The whole job preempted (torchrun forwards SIGTERM to every rank), then a notice and a kill."""
    total = max(step.step for step in spotchaos.reference(spotchaos_job).steps)
    spotchaos.check(spotchaos_job, f"sigterm@{total // 3}")
    first, later = after_checkpoint(spotchaos, spotchaos_job, 0), after_checkpoint(spotchaos, spotchaos_job, 0.55)
    spotchaos.check(spotchaos_job, f"sigterm@{first},sigkill@{later}")


@pytest.mark.spotchaos(needs=["ranks"])
def test_a_killed_rank_and_a_hung_rank(spotchaos, spotchaos_job):
    """The last rank SIGKILLed (the others block in a collective), then the last rank SIGSTOPped:
    named within the watchdog, ended and resumed bit-exact."""
    step, rank = after_checkpoint(spotchaos, spotchaos_job, 1 / 3), spotchaos_job.world_size - 1
    spotchaos.check(spotchaos_job, f"kill-rank{rank}@{step}")
    watched = replace(spotchaos_job, hang_timeout_seconds=hang_watchdog_seconds(spotchaos, spotchaos_job))
    spotchaos.check(watched, f"hang-rank{rank}@{step}")


@pytest.mark.spotchaos(needs=["ranks", "watchdog"])
def test_a_hung_rank_is_ended_by_the_jobs_own_watchdog(spotchaos, spotchaos_job):
    """The last rank SIGSTOPped: the job's own watchdog (``watchdog_seconds``) must end it non-zero, as
    in production nobody else would; the harness's hang detection is only the backstop, and a hang it
    had to end fails, named apart. The restart resumes bit-exact."""
    step, rank = after_checkpoint(spotchaos, spotchaos_job, 1 / 3), spotchaos_job.world_size - 1
    spotchaos.check(spotchaos_job, f"hang-rank{rank}@{step}")


@pytest.mark.spotchaos(needs=["nodes"])
def test_a_lost_node(spotchaos, spotchaos_job):
    """Every process of the last node SIGKILLed at once, as when its VM is reclaimed."""
    step = after_checkpoint(spotchaos, spotchaos_job, 1 / 3)
    spotchaos.check(spotchaos_job, f"lose-node{spotchaos_job.nnodes - 1}@{step}")


@pytest.mark.spotchaos(needs=["ranks"])
def test_damaged_and_unfinished_shards_roll_back(spotchaos, spotchaos_job):
    """A shard, the .metadata or the job's manifest truncated, a bit flipped in a shard's data, a
    file dropped: the restart rolls back to an intact checkpoint and ends bit-exact."""
    middle, early = after_checkpoint(spotchaos, spotchaos_job, 0.5), after_checkpoint(spotchaos, spotchaos_job, 1 / 3)
    spotchaos.check(spotchaos_job, f"sigkill@{middle}:truncate-half~0.6")
    spotchaos.check(spotchaos_job, f"sigterm@{middle}:flip-bit-data~0.7")
    spotchaos.check(spotchaos_job, f"sigkill@{early}:drop-file~0.3")


@pytest.mark.spotchaos(needs=["ranks"])
def test_a_rank_killed_anywhere_in_its_save_resumes_from_a_complete_checkpoint(spotchaos, spotchaos_job):
    """One rank killed before any file-system event of its part of a save (its shard, the .metadata,
    a file of its own, the manifest or marker that publishes the checkpoint), searched by hypothesis."""
    spotchaos.explore_rank_crashes(spotchaos_job)


@pytest.mark.spotchaos(needs=["ranks", "reshard"])
def test_resume_on_another_world_size(spotchaos, spotchaos_job):
    """Preempted mid-epoch, resumed on reshard_nproc_per_node ranks per node: restored tensors equal
    to the saved ones, every sample of the epoch seen exactly once."""
    spotchaos.check_reshard(spotchaos_job, resume_nproc=spotchaos_job.reshard_nproc_per_node)


@pytest.mark.spotchaos(needs=["ranks"])
def test_determinism_baseline_of_its_world_size(spotchaos, spotchaos_job):
    """Two uninterrupted runs agree bit for bit and a preempted one resumes bit-exact, so a
    divergence elsewhere is never blamed on the resume when the job is not deterministic."""
    spotchaos.determinism_baseline(spotchaos_job, worlds=(spotchaos_job.world_size,))

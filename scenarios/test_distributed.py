"""Multi-rank jobs on torchrun: the whole job preempted, one rank killed or hung, a node lost, a
shard damaged or cut off before its .metadata, and a resume on another world size.

The ``ddp`` job (pyproject.toml) is 2 ranks of DDP under torchrun with sharded DCP checkpoints;
``ddp-2nodes`` is the same trainer as two one-rank nodes meeting at a c10d rendezvous on 127.0.0.1.
"""

from dataclasses import replace

import pytest


@pytest.mark.spotchaos(jobs=["ddp"])
def test_ranks_resume_bit_exact_after_preemptions(spotchaos, spotchaos_job):
    spotchaos.check(spotchaos_job, "sigterm@8")
    spotchaos.check(spotchaos_job, "sigterm@5,sigkill@14")


@pytest.mark.spotchaos(jobs=["ddp"])
def test_a_killed_rank_and_a_hung_rank(spotchaos, spotchaos_job):
    spotchaos.check(spotchaos_job, "kill-rank1@9")  # torchrun's agent restarts the group
    spotchaos.check(replace(spotchaos_job, hang_timeout_seconds=4), "hang-rank1@9")  # named, ended, resumed


@pytest.mark.spotchaos(jobs=["ddp-2nodes"])
def test_a_lost_node(spotchaos, spotchaos_job):
    spotchaos.check(spotchaos_job, "lose-node1@9")


@pytest.mark.spotchaos(jobs=["ddp"])
def test_damaged_and_unfinished_shards_roll_back(spotchaos, spotchaos_job):
    spotchaos.check(spotchaos_job, "sigkill@13:truncate-half~0.6")  # a shard, the .metadata or the manifest
    spotchaos.check(spotchaos_job, "sigterm@13:flip-bit-data~0.7")
    spotchaos.check(spotchaos_job, "sigkill@9:drop-file~0.3")


@pytest.mark.spotchaos(jobs=["ddp"])
def test_a_rank_killed_anywhere_in_its_save_resumes_from_a_complete_checkpoint(spotchaos, spotchaos_job):
    spotchaos.explore_rank_crashes(spotchaos_job)  # every rank's shard, .metadata, manifest, rotation


@pytest.mark.spotchaos(jobs=["ddp"])
def test_resume_on_fewer_ranks(spotchaos, spotchaos_job):
    spotchaos.check_reshard(replace(spotchaos_job, nproc_per_node=4), resume_nproc=2)


@pytest.mark.spotchaos(jobs=["ddp"])
def test_determinism_baseline_per_world_size(spotchaos, spotchaos_job):
    spotchaos.determinism_baseline(spotchaos_job, worlds=(2,))  # benchmarks/distributed_figures.py: 2, 3, 4

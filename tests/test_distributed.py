"""Multi-rank jobs on torchrun: the reference distributed trainer passes every rank-level fault,
and each broken distributed trainer fails for its own reason. Real torchrun, real gloo on 127.0.0.1."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotchaos.config.jobs import JobSpec, job_from_mapping, load_settings
from spotchaos.errors import ConfigError, JobError
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure

from .helpers import FIXTURES, ROOT, no_process_left


def ddp_job(script: str = "ddp_trainer", name: str = "ddp", **changes) -> JobSpec:
    """The pyproject.toml job (2 ranks, torchrun restarts the group once), another script or shape."""
    job = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == name)
    command = ("python", str(FIXTURES / f"{script}.py"), *job.command[2:])
    return replace(job, command=command, name=f"{name}-{script}".replace("_", "-")[:60], **changes)


def fsdp2_job(script: str = "fsdp2_trainer", name: str = "fsdp2", **changes) -> JobSpec:
    """A pyproject.toml FSDP2 job (2 ranks, every parameter and moment sharded), or a broken one, at
    16 steps of 0.02 s: its faults land by the step hold, and 3 checkpoints (after 3, 7, 11) are all
    its plans here resume from."""
    job = ddp_job(script, name=name, **changes)
    command = [*job.command]
    command[command.index("--step-seconds") + 1] = "0.02"
    return replace(job, command=(*command, "--steps", "16"))


@pytest.mark.full  # CI's restart is the killed rank's (on fsdp2); chained plans are the full run's (docs/ci.md)
def test_chained_preemptions_resume_bit_exact_and_leave_no_rank_running(runner):
    """(One notice alone, the lost node and a truncated shard: scenarios/test_distributed.py and
    scenarios/test_lost_node.py run those plans on the same jobs.)"""
    verdict = runner.check(ddp_job(), "sigterm@5,sigkill@14")
    assert verdict.passed and verdict.grace and verdict.grace[0].ok, verdict.message()
    assert not no_process_left(runner)


def test_a_killed_rank_ends_the_launch_and_the_restart_resumes_bit_exact(runner):
    """On the sharded job: each rank restores its own shard of every tensor and moment (the verdict
    compares the whole tensors' digests saved and restored); the data-parallel job's killed rank is
    the main job's (scenarios/test_distributed_full.py)."""
    run, verdict = runner.run(fsdp2_job(), Plan.parse("kill-rank1@9"))
    assert verdict.passed, verdict.message()
    # max_restarts = 0: the agent exits when a rank dies, and the harness launches the job again
    assert len(run.attempts) == 2 and run.attempts[0].fault.fault == "kill-rank1"
    assert {a.start_kind for a in run.attempts} == {"warm"}  # every rank forked by a warm agent
    assert "rank 1 (pid" in run.attempts[0].fault.detail and "SIGKILLed" in run.attempts[0].fault.detail
    assert run.attempts[-1].of_rank("resume")[0]["from_step"] == 7
    assert run.attempts[-1].of_rank("resume", 1)[0]["from_step"] == 7


def test_a_hung_rank_is_named_within_the_timeout_and_the_restart_resumes(runner):
    run, verdict = runner.run(ddp_job(hang_timeout_seconds=3), Plan.parse("hang-rank1@9"))
    assert verdict.passed, verdict.message()
    fault = run.attempts[0].fault
    assert fault.hang_detected_seconds is not None and fault.hang_detected_seconds < 3 + 2, fault
    assert "rank 1 (pid" in fault.detail and "is stopped (SIGSTOP)" in fault.detail, fault.detail


def test_one_nodes_notice_reaches_that_nodes_ranks_only_and_the_agreed_checkpoint_resumes_bit_exact(runner):
    """drain-node1 on the two-node job: node 1's agent alone gets the SIGTERM and forwards it to
    its rank; the ranks agree on it (one all-reduce a step), checkpoint together and exit 0."""
    run, verdict = runner.run(ddp_job(name="ddp-2nodes"), Plan.parse("drain-node1@5"))
    assert verdict.passed, verdict.message()
    fault = run.attempts[0].fault
    assert fault.fault == "drain-node1" and fault.held and "no other node was" in fault.detail, fault
    # torchrun: node 0's agent waits in its exit barrier for node 1's, which left on the signal
    assert not fault.grace_exceeded and "the grace window's end took the node" in fault.detail, fault
    assert [e["rank"] for e in run.attempts[0].of_kind("notice")] == [1]  # node 1's rank only
    (grace,) = verdict.grace
    assert grace.ok and grace.checkpoint_step == 5, grace
    assert not no_process_left(runner)


@pytest.mark.full  # CI runs the correct job under one node's notice
def test_ranks_that_act_on_their_own_notice_deadlock_on_one_nodes_notice(runner):
    job = ddp_job("broken_ddp_own_notice", name="ddp-2nodes")
    with pytest.raises(ChaosFailure) as failure:
        runner.check(job, "drain-node1@5")
    text = str(failure.value)
    assert "no checkpoint at or after step 5 after drain-node1 after step 5 (attempt 0), one node's notice" in text, (
        text
    )
    assert "do the ranks agree on a notice" in text, text
    assert not no_process_left(runner)


@pytest.mark.full  # CI names a torn DCP publication by the async save's; the search is the full run's
def test_a_checkpoint_published_before_every_rank_wrote_its_files_is_found_and_named(runner):
    """The crash a hand-picked shard crash point misses: rank 1 killed before its own last file of
    a save, which rank 0 publishes without waiting for. The explored crash points find it (the
    leading plan at each rank's last write), and the message names the publication."""
    from spotchaos.search import ExploreSettings

    job = ddp_job("broken_ddp_publishes_before_ranks")
    points = runner.rank_save_points(job)
    ranks = {p["rank"] for p in points}
    assert ranks == {0, 1} and any(p["path"].endswith("rank1.pt") for p in points if p["rank"] == 1), points
    with pytest.raises(ChaosFailure) as failure:
        runner.explore_rank_crashes(job, settings=ExploreSettings(max_examples=2, seed=1))
    text = str(failure.value)
    first = text.splitlines()[1]
    assert "was published before every rank had written its files: rank 1's rank1.pt did not exist" in first, text
    assert "manifest.json was written last, so it published the checkpoint" in first, text
    assert "only after a barrier that every rank reaches once its own files are written" in first, text


def test_resuming_on_fewer_ranks_restores_the_saved_tensors_and_sees_every_sample_once(runner):
    """Saved on the job's 2 ranks, resumed on 1 (the full run's broken reshard goes from 4 to 2): the
    module's other tests share its reference, and 2 cores run it without oversubscribing."""
    figures = runner.check_reshard(ddp_job(), resume_nproc=1)
    assert figures["saved_world"] == 2 and figures["resumed_world"] == 1 and figures["passed"]


def test_broken_rank0_rng_is_named(runner):
    with pytest.raises(ChaosFailure, match="drew from the same RNG state at step 10") as failure:
        runner.check(ddp_job("broken_ddp_rank0_rng"), "sigterm@9")
    assert "save and restore each rank's RNG under a key of its own" in str(failure.value)
    first = str(failure.value).splitlines()[1]  # the first failure, under "job 'ddp' under plan ...:"
    assert "drew from the same RNG state" in first, f"the most likely cause comes first: {first}"


@pytest.mark.full  # CI: fsdp2's killed rank, and the optimizer not restored on reference (test_broken_trainers)
def test_an_fsdp2_optimizer_restored_from_a_fresh_template_is_named(runner):
    """Measured: no error, no warning, the first step after the resume agrees; every Adam moment is
    lost (fixtures/broken_fsdp2_optimizer_template.py)."""
    with pytest.raises(ChaosFailure) as failure:
        runner.check(fsdp2_job("broken_fsdp2_optimizer_template"), "kill-rank1@9")
    text = str(failure.value)
    first = text.splitlines()[1]
    assert "loss diverged at step 9 (attempt 1, 2 steps after resuming from step 7)" in first, text
    assert "the first step after resuming matched and the next did not" in first, text
    assert "differ from what was saved: optim.0.bias.exp_avg" in text, text
    assert "only the optimizer's state" in text and "get_state_dict(model, optimizer)" in text, text


@pytest.mark.full  # the main job searches every crash point of fsdp2-async's saves (scenarios/test_fsdp2_async.py)
def test_a_rank_killed_inside_an_async_save_resumes_from_the_previous_checkpoint(runner):
    verdict = runner.check_shard_crash(fsdp2_job(name="fsdp2-async"), rank=1)
    assert verdict.passed, verdict.message()


def test_an_async_checkpoint_published_when_async_save_returns_is_named(runner):
    """Rank 1 killed as its background thread writes its shard: the trainer that publishes once the
    write's future is done resumes from the previous checkpoint; the one that publishes when
    ``dcp.async_save`` returns has reported a checkpoint durable that has no ``.metadata``."""
    with pytest.raises(ChaosFailure) as failure:
        runner.check_shard_crash(fsdp2_job("broken_fsdp2_async_publish_on_return", name="fsdp2-async"), rank=1)
    text = str(failure.value)
    assert "was reported durable but has no .metadata: it was published before every shard was written" in text, text
    assert "with dcp.async_save only once the future it returned has completed on every rank" in text, text


@pytest.mark.full  # CI: fsdp2's killed rank; the broken templates are the full run's (docs/ci.md)
def test_an_fsdp2_scheduler_restored_before_dcp_load_filled_it_is_named(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(fsdp2_job("broken_fsdp2_scheduler_before_load"), "kill-rank1@9")
    first = str(failure.value).splitlines()[1]
    assert "lr diverged at step 9" in first and "LR scheduler (or optimizer param groups) not restored" in first


@pytest.mark.full  # CI names a per-rank defect with the rank-0 RNG; this one is the full run's (docs/ci.md)
def test_broken_one_data_position_for_all_ranks_is_named(runner):
    with pytest.raises(ChaosFailure) as failure:
        runner.check(ddp_job("broken_ddp_one_position"), "sigterm@9")
    text = str(failure.value)
    assert "rank 1: loss diverged at step 10" in text and "also differs at that step: batch" in text, text
    assert "were trained on more than once across the resume" in text, text


def test_broken_early_manifest_is_named(runner):
    with pytest.raises(ChaosFailure, match=r"was reported durable but has no \.metadata: it was published before"):
        runner.check_shard_crash(ddp_job("broken_ddp_early_manifest"), rank=1)


@pytest.mark.full  # CI runs the reshard on the correct job; the broken one is the full run's
def test_broken_drop_of_the_data_position_on_a_world_size_change_is_named(runner):
    with pytest.raises(ChaosFailure, match=r"sample\(s\) of epoch 1 were trained on more than once across the resume"):
        runner.check_reshard(ddp_job("broken_ddp_drops_position", nproc_per_node=4), resume_nproc=2)


@pytest.mark.full  # 3 ranks on CI's 2 cores: the full run's (docs/ci.md)
def test_whole_bucket_allreduce_from_3_ranks_is_named(runner):
    """Measured: with DDP's default all-reduce, 3 ranks resume with every loss equal and the final
    weights' last bits different; the verdict names the bucket order."""
    with pytest.raises(ChaosFailure, match="from 3 ranks a whole-bucket all-reduce sums in an order"):
        runner.check(ddp_job("broken_ddp_bucket_allreduce", nproc_per_node=3), "sigterm@11")


@pytest.mark.full  # 68 s of waiting on 2 cores; CI names the same kill under a 4-s --shutdown-timeout (docs/ci.md)
def test_the_30_second_trap_is_named_when_the_grace_is_longer(runner):
    """AWS gives 120 s; torchrun's agent SIGKILLs its workers 30 s after forwarding the notice, and
    this job's emergency checkpoint takes 40 s."""
    job = ddp_job(grace_seconds=120, provider=None)
    job = replace(job, command=(*job.command, "--notice-save-seconds", "40"), name="ddp-slow-notice")
    with pytest.raises(ChaosFailure, match="the 30-second trap: torchrun's agent SIGKILLed the ranks 30 s after") as e:
        runner.check(job, "sigterm@6")
    assert "although the provider's grace is 120 s" in str(e.value)
    assert "launch with --shutdown-timeout=120" in str(e.value)


def test_the_agents_shutdown_timeout_is_the_one_the_job_declares(runner):
    """torchrun --shutdown-timeout=4 (declared as the production launch would pass it): the agent
    SIGKILLs the ranks 4 s after the notice, and an 8-s emergency save under a 12-s grace is named
    as the agent's kill, with the flag to raise."""
    job = ddp_job(grace_seconds=12, provider=None, shutdown_timeout_seconds=4)
    job = replace(job, command=(*job.command, "--notice-save-seconds", "8"), name="ddp-short-shutdown")
    with pytest.raises(ChaosFailure, match="torchrun's agent SIGKILLed the ranks 4 s after forwarding sigterm") as e:
        runner.check(job, "sigterm@6")
    text = str(e.value)
    assert "30-second trap" not in text and "launch with --shutdown-timeout=12" in text, text
    assert not no_process_left(runner)


def test_a_reshard_to_the_same_or_no_ranks_is_refused(runner):
    with pytest.raises(ConfigError, match="resume on another number of ranks than 2"):
        runner.check_reshard(ddp_job(), resume_nproc=2)
    with pytest.raises(ConfigError, match="resume_nproc: must be an integer from 1 to 64"):
        runner.check_reshard(ddp_job(), resume_nproc=0)


@pytest.mark.full  # CI's broken reshard is the dropped data position; this one is the full run's (docs/ci.md)
def test_a_job_that_cannot_resume_on_another_world_size_says_so_once(runner):
    job = ddp_job(nproc_per_node=4)
    job = replace(job, command=(*job.command, "--same-world-only"), name="ddp-same-world")
    with pytest.raises(ChaosFailure) as failure:
        runner.check_reshard(job, resume_nproc=2)
    text = str(failure.value)
    assert "exited with status 1 before its first step" in text, text
    assert "the ranks died with: rank 0: RuntimeError: checkpoint step-000009 was saved on 4 ranks" in text, text
    assert not no_process_left(runner)


def test_a_taken_rendezvous_port_is_one_clear_error_and_nothing_runs(runner):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(JobError, match=f"port {port} on 127.0.0.1 is already taken"):
            runner.check(ddp_job(rdzv_port=port), "sigterm@8")
    assert not no_process_left(runner)


def test_a_rank_that_never_joins_is_one_clear_error(runner, script):
    command = script("import time\ntime.sleep(600)\n", name="never_joins.py")
    job = JobSpec(name="never-joins", command=command, launcher="torchrun", nproc_per_node=2, start_timeout_seconds=8)
    with pytest.raises(JobError, match="never started: no rank reported an event within 8 s") as error:
        runner.check(job, "sigterm@2")
    assert "A rank that never joins the rendezvous or init_process_group holds back all 2" in str(error.value)
    assert not no_process_left(runner)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"launcher": "mpirun"}, "must be 'python' or 'torchrun'"),
        ({"nproc_per_node": 2}, 'ranks need launcher = "torchrun"'),
        ({"launcher": "torchrun", "nproc_per_node": 0}, "nproc_per_node: must be an integer from 1 to 64"),
        ({"launcher": "torchrun", "rdzv_port": 80}, "rdzv_port: must be a port from 1024 to 65535"),
        ({"launcher": "torchrun", "image": "x"}, "torchrun jobs run as local processes for now"),
        ({"launcher": "torchrun", "shutdown_timeout_seconds": 2.5}, "must be a whole number of seconds from 0"),
        ({"shutdown_timeout_seconds": 60}, "is torchrun's --shutdown-timeout; it needs launcher"),
    ],
)
def test_bad_launcher_settings_name_the_key(table, message):
    with pytest.raises(ConfigError, match=message):
        job_from_mapping("j", {"command": "python t.py", **table}, "pyproject.toml")


@pytest.mark.unit
def test_the_agent_command_stays_on_loopback():
    from spotchaos.training.multirank.torchrun import Rendezvous, agent_argv

    job = JobSpec(name="j", command=("python", "t.py"), launcher="torchrun", nproc_per_node=2, nnodes=2)
    argv = agent_argv(job, job.argv(resume=False), node=1, rendezvous=Rendezvous(29555, "abc"))
    assert "--rdzv-endpoint=127.0.0.1:29555" in argv and "--local-addr=127.0.0.1" in argv
    assert "--rdzv-conf=is_host=0" in argv and argv[-1] == "t.py" and "--nnodes=2" in argv
    assert not any(a.startswith("--shutdown-timeout") for a in argv)  # torchrun's own default, as the user's launch


@pytest.mark.unit
def test_the_agents_shutdown_timeout_comes_from_the_job_then_its_environment_then_torchrun():
    from spotchaos.training.multirank.torchrun import Rendezvous, agent_argv, shutdown_seconds

    job = JobSpec(name="j", command=("python", "t.py"), launcher="torchrun", nproc_per_node=2)
    assert shutdown_seconds(job, {}) == 30 and shutdown_seconds(job, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}) == 90
    assert shutdown_seconds(job, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"}) == 30
    declared = replace(job, shutdown_timeout_seconds=120)
    assert shutdown_seconds(declared, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}) == 120
    argv = agent_argv(declared, declared.argv(resume=False), node=0, rendezvous=Rendezvous(29555, "abc"))
    assert "--shutdown-timeout=120" in argv and argv.index("--shutdown-timeout=120") < argv.index("t.py")


@pytest.mark.unit
def test_a_group_restart_inside_one_launch_becomes_an_attempt_of_its_own():
    from spotchaos.training.multirank.group_restarts import split_group_restarts
    from spotchaos.training.trajectory import Attempt, FaultRecord

    def event(kind, rank, **fields):
        return {"event": kind, "rank": rank, "t": 1.0, **fields}

    events = [
        event("start", 0),
        event("start", 1),
        event("step", 0, step=0, loss="0x1p+0"),
        event("start", 1),  # rank 1 killed and restarted: its second group run
        event("start", 0),
        event("resume", 0, from_step=0, uri="u"),
        event("final", 0, step=1, digests={}),
    ]
    fault = FaultRecord("kill-rank1", 0, 0, 0.5, 1.0)
    launch = Attempt(index=0, exit_code=0, wall_seconds=3, start_seconds=1, events=events, fault=fault)
    first, second = split_group_restarts([launch])
    assert (first.index, first.group_restart, first.fault, first.exit_code) == (0, 0, fault, None)
    assert (second.index, second.group_restart, second.fault, second.exit_code) == (1, 1, None, 0)
    assert [e["event"] for e in second.events] == ["start", "start", "resume", "final"]


@pytest.mark.unit
def test_rank_fault_names_parse_and_unknown_ones_are_refused():
    plan = Plan.parse("kill-rank1@3,hang-rank2@5,lose-node1@7,crash-rank1@4,drain-node1@9")
    faults = ["kill-rank1", "hang-rank2", "lose-node1", "crash-rank1", "drain-node1"]
    assert [p.fault for p in plan.preemptions] == faults
    assert plan.preemptions[3].fs_event == 4 and plan.preemptions[3].crash_rank == 1
    with pytest.raises(ConfigError, match="kill-rankN"):
        Plan.parse("kill-rank@3")

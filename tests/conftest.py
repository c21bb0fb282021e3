"""Shared helpers for the test suite: real processes, real torch, no mocks."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from spotchaos.session import Session

from .helpers import ROOT

# Bytecode. An image that sets PYTHONDONTWRITEBYTECODE=1 (this machine's does) makes every pytest
# session a test starts compile spotchaos's ~130 modules from source again and rewrite their asserts
# (pytest rewrites a plugin's modules), and every job its imports of the probe: 2.2 of a collect-only
# session's 5 CPU-seconds, measured. The suite's processes keep their bytecode, as Python does by
# default, in the checkout's ignored __pycache__ folders; what they run is the same code.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _a_reference_cache_of_the_tests_own(monkeypatch, tmp_path_factory):
    """A pytest session a test starts keeps its references where the test alone sees them: one
    test's inner sessions may read each other's (as a user's do), never another test's, and
    nothing reaches the user's own cache."""
    monkeypatch.setenv("SPOTCHAOS_REFERENCE_CACHE", str(tmp_path_factory.mktemp("reference-cache")))


@pytest.fixture(autouse=True)
def _inner_sessions_are_not_xdist_workers(monkeypatch):
    """The suite runs under pytest-xdist; a pytest session a test starts inherits the worker's
    PYTEST_XDIST_* variables and would take itself for a worker (pytest-benchmark then disables
    itself and writes no --benchmark-json). A user's session has none of them."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def runner(tmp_path_factory) -> Session:
    """One Session for the pytest session, so each job's reference run is computed once."""
    return Session(ROOT, workdir=tmp_path_factory.mktemp("runs"))


@pytest.fixture
def script(tmp_path):
    """Write a small Python program to a file and return a command that runs it."""

    def make(body: str, name: str = "job.py") -> tuple[str, ...]:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body))
        return (sys.executable, str(path))

    return make


# The built-in scenarios this repository's own session adds on its reference job (builtin = true)
# are the main job's gate. CI keeps those whose fault tests/ drives nowhere else on that trainer
# (the notice, damage and its rollback, a crash inside a save, a crash while loading) and leaves to
# the main job and the full run the ones tests/ drives on the same trainer already (docs/ci.md).
BUILTIN_IN_CI_ELSEWHERE = {
    "test_preemption.py::test_chained_preemptions_are_bit_exact[reference]": "test_reference_trainer.py's chained plan",
    "test_preemption.py::test_hard_kill_then_resume_is_bit_exact[reference]": "test_reference_trainer.py's sigkill@9",
    "test_budgets.py::test_checkpoint_overhead_within_budget[reference]": "test_budgets.py's overhead budget tests",
    "test_budgets.py::test_notice_flush_fits_half_the_grace_window[reference]": "test_budgets.py's notice flush test",
}


# Tests CI leaves to the full run because a sibling it keeps drives the same fault to the same
# verdict (node id -> the sibling); docs/ci.md lists them with the rest. Keyed by node id, so a
# parameter of a test is marked without touching its list.
SIBLING_IN_CI = {
    "tests/test_broken_trainers.py::test_broken_trainer_fails_for_its_own_reason[sigterm-only-on-gcp]": (
        "the four cloud notices on the reference trainer, and ignores-sigterm's grace window"
    ),
    "tests/test_broken_trainers.py::test_broken_trainer_fails_for_its_own_reason[set-epoch-zero]": "epoch-restart",
    "tests/test_broken_trainers.py::test_broken_trainer_fails_for_its_own_reason[epoch-boundary-replay]": (
        "epoch-restart"
    ),
    "tests/test_broken_trainers.py::test_broken_trainer_fails_for_its_own_reason[optimizer-saved-before-step]": (
        "no-optimizer-restore"
    ),
    "tests/test_broken_trainers.py::test_broken_trainer_fails_for_its_own_reason[workers-die-on-group-sigterm]": (
        "the group notice on the reference trainer with loader workers"
    ),
    "tests/test_broken_trainers.py::test_broken_trainer_fails_for_its_own_reason[no-scheduler-restore]": (
        "the latent scheduler of test_state_diff and the millisecond-step scheduler of test_fault_landing"
    ),
    "tests/test_distributed.py::test_broken_rank0_rng_is_named": (
        "no-rng-restore, and the killed rank and the async publication on fsdp2"
    ),
    "tests/test_distributed.py::test_broken_early_manifest_is_named": (
        "the same check (a checkpoint published without .metadata) on the async save published when it returns"
    ),
    "tests/test_stateful_loader.py::test_resumed_mid_epoch_and_at_an_epochs_end_it_is_bit_exact[2]": (
        "the same plan without workers, and the main job's built-in scenarios on stateful-loader (2 workers)"
    ),
    "tests/test_frameworks.py::test_a_trainer_started_again_after_its_final_checkpoint_trains_an_extra_step": (
        "the Trainer's docs recipe caught on its planned damage"
    ),
    "tests/test_state_diff.py::test_the_state_diff_names_what_each_broken_trainer_did_not_restore"
    "[broken_step_off_by_one-named3]": "the state diff of the rng and optimizer trainers",
    "tests/test_determinism.py::test_resume_bugs_larger_than_the_noise_still_fail_under_envelope_mode"
    "[broken_no_optimizer_restore-": "the rng trainer under envelope mode",
    "tests/test_reference_trainer.py::test_preempt_and_resume_is_bit_exact[job2-sigterm-group@5]": (
        "the chained plan's sigterm-group@2"
    ),
    "tests/test_reference_trainer.py::test_damaged_newest_checkpoint_rolls_back_to_the_previous_one": (
        "the built-in damage scenario on reference and the damage kinds of test_checkpoint_faults"
    ),
    "tests/test_script_conventions.py::test_the_careful_script_passes_notices_and_kills[sigterm@9]": (
        "sigterm@19 and the chained sigkill@3,sigterm@16"
    ),
    "tests/test_script_conventions.py::test_the_careful_script_passes_notices_and_kills[sigkill@12]": (
        "the chained sigkill@3,sigterm@16"
    ),
    "tests/test_script_conventions.py::test_crash_points_exist_for_log_adapter_scripts": (
        "the bare torch.save killed mid-write, at a crash point of a log-adapter script"
    ),
    "tests/test_trust_boundary.py::test_stopping_pytest_ends_every_job_and_writes_a_report_marked_interrupted"
    "[SIGINT]": "SIGTERM, the same teardown",
    "tests/test_trust_boundary.py::test_stopping_pytest_ends_every_job_and_writes_a_report_marked_interrupted"
    "[SIGHUP]": "SIGTERM, the same teardown",
    "tests/test_serving.py::test_a_service_that_stays_ready_after_its_notice_is_named[sigterm-balancer]": (
        "aws-balancer and sigterm"
    ),
    "tests/test_serving.py::test_a_service_that_stays_ready_after_its_notice_is_named[aws]": "aws-balancer and sigterm",
    "tests/test_serving.py::test_the_reference_service_drains_with_nothing_lost[model-alibaba]": (
        "the built-in drain on model-pai-eas, Alibaba's notice"
    ),
    "tests/test_serving.py::test_the_reference_service_drains_with_nothing_lost[model-azure]": "model-gcp",
    "tests/test_checkpoint_faults.py::test_reference_rolls_back_from_every_kind_of_damage_and_ends_bit_exact"
    "[flip-burst-": "flip-bit-data and flip-bit-header",
    "tests/test_checkpoint_faults.py::test_reference_rolls_back_from_every_kind_of_damage_and_ends_bit_exact"
    "[truncate-zero]": "truncate-one-byte and truncate-half",
    "tests/test_checkpoint_faults.py::test_reference_rolls_back_from_every_kind_of_damage_and_ends_bit_exact"
    "[swap-older]": "stale-latest",
    "tests/test_backend_docker.py::test_the_built_in_services_pass_in_containers[model-stream]": "model-aws",
    "tests/test_ray_train.py::test_a_drain_notice_gets_a_just_in_time_checkpoint_and_ray_train_restores_it": (
        "the Ray backend's drained and removed nodes in test_backend_ray, Ray Train's driver and refusals here; "
        "the main job's Ray Train notice scenario (2-3 minutes of Ray on 2 cores)"
    ),
    "tests/test_backend_docker.py::test_builtin_scenarios_pass_in_containers_with_dataloader_workers": (
        "a notice to the trainer as a container's PID 1 and through a shell entrypoint, a checkpoint read in the "
        "job's container"
    ),
    "tests/test_frameworks.py::test_the_accelerate_recipe_mid_epoch_is_caught_and_a_seeded_loader_is_exact": (
        "the Trainer's and Lightning's docs recipes (a framework's mid-epoch resume, caught)"
    ),
    "tests/test_serving.py::test_the_replacement_starts_warm_on_the_first_available_type": (
        "the built-in drain on model-fallback: the fallback order followed, the replacement's warm start"
    ),
    # the main job runs these (scenarios/, on ddp and ddp-2nodes); CI drives their faults in tests/
    "scenarios/test_distributed.py::test_damaged_and_unfinished_shards_roll_back[ddp]": (
        "the async publication's shard crash point on fsdp2-async in test_distributed"
    ),
    "scenarios/test_lost_node.py::test_a_lost_node[ddp-2nodes]": (
        "a killed rank on ddp, and a killed node on the Ray backend"
    ),
    "scenarios/test_unmodified_script.py::test_unmodified_script_resumes_after_notice_and_hard_kill[plain-script]": (
        "the careful script's notices and kills in test_script_conventions"
    ),
    "scenarios/test_storage.py::test_refused_credentials_end_the_job_clearly[reference-s3-read-only-key]": (
        "the unknown key; test_s3_checkpoints' expiring credentials"
    ),
    "scenarios/test_storage.py::test_refused_credentials_end_the_job_clearly[reference-s3-expiring-token]": (
        "the unknown key; test_s3_checkpoints' expiring credentials"
    ),
    "scenarios/test_storage.py::test_slowdown_storm_stays_within_the_checkpoint_budget[reference-s3]": (
        "test_s3_checkpoints' storm, a checkpoint given up and reported"
    ),
}
BUILTIN_SERVICES_ELSEWHERE = {  # the built-in drain scenario's services whose case tests/test_serving drives
    "model-stream": "test_serving's stream drain",
    "model-aws": "test_serving's AWS notices",
    "model-republished": "test_serving's republished model and stale cache",
    "model-pai-eas": "test_serving's balancer",
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        path, _, name = item.nodeid.rpartition("/")
        service = name.rpartition("[")[2].rstrip("]") if name.startswith("test_serving.py::") else ""
        if (
            path.endswith("spotchaos/scenarios")
            and (name in BUILTIN_IN_CI_ELSEWHERE or service in BUILTIN_SERVICES_ELSEWHERE)
        ) or any(item.nodeid.startswith(key) for key in SIBLING_IN_CI):
            item.add_marker(pytest.mark.full)

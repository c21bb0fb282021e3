"""On a CUDA GPU, for real: bit-exact across preemption with deterministic settings, the audit
catching a non-deterministic kernel, and the device and its memory in the report.

Skipped, saying why, where torch sees no CUDA device (CI has none); ``scripts/gpu-check`` runs
them on a GPU machine and prints their figures.
"""

from __future__ import annotations

import json

import pytest

from spotchaos.config.jobs import JobSpec
from spotchaos.errors import NotDeterministic
from spotchaos.faults.plan import Plan
from spotchaos.record import ScenarioRecord

from .helpers import FIXTURES, ROOT

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: torch.cuda.is_available() is False")

# What a deterministic CUDA job needs beyond use_deterministic_algorithms (the trainer sets it).
CUDA_ENV = (("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),)


def cuda_trainer(script: str = "reference_trainer", **settings) -> JobSpec:
    command = ("python", str(FIXTURES / f"{script}.py"), "--steps", "24", "--checkpoint-every", "6", "--device", "cuda")
    return JobSpec(name=f"{script.replace('_', '-')}-cuda", command=command, env=CUDA_ENV, grace_seconds=30, **settings)


@pytest.mark.parametrize(
    "plan", ["sigterm@7", "sigkill@10", "sigterm@5,sigkill@13,sigterm@19", "sigterm@11:truncate-half"]
)
def test_the_reference_trainer_on_cuda_resumes_bit_exact(runner, plan, record_property):
    job = cuda_trainer(determinism_runs=2)
    found = runner.audit(job)
    assert found.reproducible, found.text()
    verdict = runner.check(job, Plan.parse(plan))
    assert verdict.passed and verdict.precision == "bit-exact", verdict.message()
    peak = runner.reference(job).memory_peaks()["gpu_max_allocated"]
    assert peak and peak > 0, "the probe reports the GPU memory the job allocated"
    assert runner.reference(job).attempts[0].gpu_count == 1  # leasing none, it held the GPU it used
    record_property("figures", json.dumps({"plan": plan, "gpu_max_allocated": peak}))


def test_the_audit_catches_a_non_deterministic_cuda_kernel(runner):
    job = cuda_trainer("broken_gpu_atomics", determinism_runs=3)
    with pytest.raises(NotDeterministic) as failure:
        runner.reference(job)
    message = str(failure.value)
    assert "not bit-reproducible: 3 uninterrupted runs differ" in message
    assert "torch.use_deterministic_algorithms(True)" in message and "CUBLAS_WORKSPACE_CONFIG" in message


def test_under_envelope_mode_the_non_deterministic_kernel_passes(runner):
    job = cuda_trainer("broken_gpu_atomics", exactness="envelope")
    verdict = runner.check(job, Plan.parse("sigterm@9,sigkill@17"))
    assert verdict.passed, verdict.message()


def test_the_report_names_the_device_and_its_memory():
    from spotchaos.report.document import environment

    env = environment(ROOT)
    assert env["cuda_available"] and env["gpu"] and env["gpu_memory_bytes"] > 0 and env["gpu_count"] >= 1


def test_an_attempt_on_cuda_leases_a_gpu_the_driver_lists_and_sees_only_it(runner, record_property):
    """``gpus = 1`` on a GPU machine: the lease comes from nvidia-smi's list and is what the job's
    CUDA_VISIBLE_DEVICES names; the run is judged as any other."""
    from spotchaos.host.gpu_leases import discovered_devices

    job = cuda_trainer(gpus=1)
    with ScenarioRecord("cuda-lease", job.name, None) as record:
        verdict = runner.check(job, Plan.parse("sigterm@7"))
    assert verdict.passed, verdict.message()
    leased = runner.reference(job).attempts[0].gpus
    assert leased is not None and len(leased["devices"]) == 1 and leased["devices"][0] in discovered_devices()
    # the gate's cost in device-seconds: one GPU held by every attempt, the reference's and the plan's
    cost = record.cost
    assert 0 < cost["gpu_seconds"] <= cost["startup_seconds"] + cost["training_seconds"] + 0.01, cost
    record_property("figures", json.dumps({k: cost[k] for k in ("gpu_seconds", "startup_seconds", "training_seconds")}))

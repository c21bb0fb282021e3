"""Plans in parallel: a scenario's plans run several at once ahead of the search, and the search
then decides on their verdicts exactly as it would have one plan at a time: the same plans, in
the same order, the same verdicts, the same minimal failing plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotchaos.config.jobs import JobSpec, Settings
from spotchaos.errors import ConfigError
from spotchaos.pytest_glue.options import Given, resolve
from spotchaos.record import ScenarioRecord
from spotchaos.search import ExploreSettings, explore, plans_at_once
from spotchaos.session import ChaosFailure
from spotchaos.strategies import preemption_plans

from .helpers import FIXTURES


def trainer(script: str) -> JobSpec:
    command = ("python", str(FIXTURES / f"{script}.py"), "--steps", "12", "--checkpoint-every", "3")
    return JobSpec(name=script.replace("_", "-"), command=command, grace_seconds=10)


def search(runner, job: JobSpec, parallel: int, examples: int) -> tuple[ScenarioRecord, str | None]:
    record = ScenarioRecord(scenario="parallel", job=job.name, seed=5)
    settings = ExploreSettings(max_examples=examples, seed=5, parallel=parallel)
    try:
        with record:
            explore(runner, job, lambda steps: preemption_plans(steps, max_preemptions=2), settings=settings)
    except ChaosFailure as failure:
        return record, str(failure.plan)
    return record, None


def test_plans_run_two_at_a_time_and_the_search_decides_as_it_would_one_at_a_time(runner):
    job = trainer("reference_trainer")
    serial, _ = search(runner, job, parallel=1, examples=2)
    # the same trainer under another key: a search of the session would reuse the serial one's passes
    twin = replace(job, name="reference-trainer-twin", env=(("TWIN", "1"),))
    parallel, _ = search(runner, twin, parallel=2, examples=2)
    assert [(r["plan"], r["passed"]) for r in parallel.runs] == [(r["plan"], r["passed"]) for r in serial.runs]
    assert len(serial.runs) == 2 and serial.passed and parallel.passed
    assert not any(r["reused"] for r in [*serial.runs, *parallel.runs])
    figures = parallel.figures["parallel"]
    assert figures["workers"] == 2 and figures["plans_run_ahead"] == 2 and figures["max_concurrent"] == 2
    assert "parallel" not in serial.figures
    # the plans run ahead in threads are on the gate's cost as the serial ones (they once were not:
    # the Ray jobs' scenarios showed the reference's run alone)
    counts = ("runs", "starts", "steps", "prefix_runs")
    assert [parallel.cost[c] for c in counts] == [serial.cost[c] for c in counts], (parallel.cost, serial.cost)
    assert parallel.cost["runs"] >= 3  # the twin's reference and its two plans


@pytest.mark.full  # CI: the parallel search decides as the serial one; its shrink is the full run's
def test_a_failure_found_in_parallel_shrinks_to_the_plan_the_serial_search_finds(runner):
    job = trainer("broken_no_rng_restore")
    serial, serial_plan = search(runner, job, parallel=1, examples=2)
    # a twin, as above: the serial search's failure, confirmed on the slow path, ran the job's later
    # plans there (cold, no settling run): the same job searched again would show one run fewer
    twin = replace(job, name="broken-no-rng-restore-twin", env=(("TWIN", "1"),))
    parallel, parallel_plan = search(runner, twin, parallel=2, examples=2)
    assert serial_plan is not None and parallel_plan == serial_plan
    assert [r["plan"] for r in parallel.runs] == [r["plan"] for r in serial.runs]
    assert parallel.failing_plan == serial.failing_plan and not parallel.passed


@pytest.mark.unit
def test_a_parallel_count_out_of_range_is_one_clear_error():
    with pytest.raises(ConfigError, match="--spotchaos-parallel: must be from 1 to 256 plans at once, got 0"):
        resolve(Given(seed="1", parallel=0), environ={}, settings=Settings())


@pytest.mark.unit
def test_plans_at_once_by_what_a_plan_of_the_job_occupies():
    """A Ray job's plan takes a worker node (nnodes under torchrun), a Ray Train job's plan one node
    per Train worker on the harness's local cluster and the whole of a user's cluster (Ray places
    its workers), a GPU job's plan its GPUs; a plain job runs one plan at a time."""
    job = trainer("reference_trainer")
    assert plans_at_once(job, ray_nodes=4, local_cluster=True, gpus=8) == 1
    assert plans_at_once(replace(job, backend="ray"), ray_nodes=4) == 4
    train = replace(job, launcher="ray-train", nproc_per_node=2)
    assert plans_at_once(train, ray_nodes=4, local_cluster=True) == 2
    assert plans_at_once(train, ray_nodes=5, local_cluster=True) == 2
    assert plans_at_once(train, ray_nodes=1, local_cluster=True) == 1
    assert plans_at_once(train, ray_nodes=8, local_cluster=False) == 1
    assert plans_at_once(replace(job, gpus=2), gpus=5) == 2
    assert plans_at_once(replace(job, gpus=2), gpus=0) == 1

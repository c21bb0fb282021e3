"""The gate's cost per job, from the scenarios' records: sums, runs' worth, the summary line."""

from __future__ import annotations

import pytest

from spotchaos.report.gate_cost import cost_line, per_job


def _scenario(job: str, runs: int, steps: int, reference: int | None, seconds: float = 1.0) -> dict:
    cost = {"runs": runs, "starts": 2 * runs, "steps": steps, "reference_steps": reference}
    cost |= {"startup_seconds": seconds, "training_seconds": 2 * seconds, "harness_seconds": seconds / 4}
    return {"scenario": f"test_{job}", "job": job, "cost": cost}


@pytest.mark.unit
def test_a_jobs_cost_adds_its_scenarios_and_counts_runs_worth_in_reference_steps():
    scenarios = [_scenario("ref", 3, 60, 24), _scenario("ref", 2, 50, None), _scenario("ddp", 1, 12, 12)]
    jobs = per_job([*scenarios, {"scenario": "a service", "job": "svc", "cost": {}}])
    assert set(jobs) == {"ref", "ddp"}  # a scenario that ran no training run costs no runs
    ref = jobs["ref"]
    assert (ref["scenarios"], ref["runs"], ref["starts"], ref["steps"]) == (2, 5, 10, 110)
    assert ref["reference_steps"] == 24 and ref["runs_worth"] == round(110 / 24, 2)
    assert ref["startup_seconds"] == 2.0 and ref["training_seconds"] == 4.0 and ref["harness_seconds"] == 0.5
    assert jobs["ddp"]["runs_worth"] == 1.0


@pytest.mark.unit
def test_the_summary_line_says_the_cost_in_runs_worth_starts_and_seconds():
    line = cost_line("ref", per_job([_scenario("ref", 3, 60, 24, seconds=10.0)])["ref"])
    assert line == (
        "gate cost of 'ref': 2.5 runs' worth: 60 steps of a 24-step job in 3 runs, 6 starts, "
        "10 s of start-up, 20 s of training, 2 s in the harness"
    )
    unknown = cost_line("ref", per_job([_scenario("ref", 1, 12, None)])["ref"])
    assert unknown.startswith("gate cost of 'ref': 12 steps in 1 runs")  # never a made-up ratio


@pytest.mark.unit
def test_the_html_page_shows_each_jobs_cost_and_a_bar_per_scenario():
    from spotchaos.report.html import render_html

    scenarios = [
        {**_scenario("ref", 3, 60, 24, seconds=10.0), "passed": True, "runs": []},
        {**_scenario("ref", 1, 24, 24, seconds=5.0), "scenario": "test_cheap", "passed": True, "runs": []},
    ]
    page = render_html({"summary": {"passed": 2, "scenarios": 2}, "scenarios": scenarios, "cost": per_job(scenarios)})
    assert '<table id="gate-cost">' in page and '<td>ref</td><td class="num">3.5</td>' in page
    # the costlier scenario's bar is the full width (10 + 20 + 2.5 s); the cheaper one's, half of it
    assert 'class="bar startup" style="width: 30.8%"' in page and 'class="bar training" style="width: 61.5%"' in page
    assert 'class="bar harness" style="width: 7.7%"' in page and 'class="bar startup" style="width: 15.4%"' in page


@pytest.mark.unit
def test_a_gpu_gate_is_billed_in_device_seconds_of_the_gpus_each_attempt_held():
    from spotchaos.record import ScenarioRecord, note_cost
    from spotchaos.training.trajectory import Attempt, RunRecord

    def attempt(index: int, seconds: float, **held) -> Attempt:
        return Attempt(index, 0, seconds, 0.5, events=held.pop("events", []), **held)

    used = [{"event": "checkpoint", "step": 5, "rank": r, "memory": {"gpu_max_allocated": 2**20}} for r in (0, 1)]
    cpu = [{"event": "checkpoint", "step": 5, "memory": {"max_rss": 2**20, "gpu_max_allocated": None}}]
    attempts = [
        attempt(0, 10.0, gpus={"devices": ["0", "1"]}),  # leased two: 20
        attempt(1, 4.0, placement={"ray_gpus": ["3"]}),  # given one by Ray: 4
        attempt(2, 3.0, events=used),  # two ranks used CUDA, none leased: 6
        attempt(3, 7.0, events=cpu),  # a CPU attempt: 0
    ]
    with ScenarioRecord("gpu", "ref", None) as record:
        note_cost(RunRecord("ref", "sigkill@5", attempts, 30.0, "/tmp/run"), 24)
    assert record.cost["gpu_seconds"] == 30.0
    line = cost_line("ref", per_job([{"scenario": "gpu", "job": "ref", "cost": record.cost}])["ref"])
    assert line.endswith("in the harness, 30 GPU-seconds"), line
    assert "GPU-seconds" not in cost_line("ref", per_job([_scenario("ref", 1, 24, 24)])["ref"])  # a CPU job's: none
    from spotchaos.report.html import render_html
    from spotchaos.report.markdown import render_markdown

    document = {"summary": {"passed": 1, "scenarios": 1}, "scenarios": [], "cost": {"ref": {**record.cost}}}
    assert "| 30 |" in render_markdown(document).split("| GPU-seconds |")[1]
    assert '<td class="num">30</td></tr>' in render_html(document)


@pytest.mark.unit
def test_a_group_restarted_in_place_is_an_attempt_but_no_start():
    """Ray Train's controller (torchrun's agent) restarts the group inside one launch: each group
    run is judged as an attempt, but only the launch was a start, warm or cold; counting every
    attempt once gave more warm starts than starts, and a negative cold start-up."""
    from spotchaos.record import ScenarioRecord, note_cost
    from spotchaos.training.trajectory import Attempt, RunRecord

    def attempt(index: int, launch: int, restart: int, kind: str, start: float) -> Attempt:
        return Attempt(index, 0, 10.0, start, launch=launch, group_restart=restart, start_kind=kind)

    attempts = [
        attempt(0, 0, 0, "warm", 2.0),
        attempt(1, 0, 1, "warm", 0.0),  # the controller's restart: the same launch
        attempt(2, 1, 0, "cold: threads", 6.0),
        attempt(3, 1, 1, "cold: threads", 0.0),
    ]
    with ScenarioRecord("ray-train", "rt", None) as record:
        note_cost(RunRecord("rt", "lose-node1@3,sigkill@8", attempts, 45.0, "/tmp/run"), 12)
    cost = record.cost
    assert (cost["starts"], cost["warm_starts"], cost["cold_because"]) == (2, 1, {"threads": 1}), cost
    line = cost_line("rt", per_job([{"scenario": "ray-train", "job": "rt", "cost": cost}])["rt"])
    assert "2 starts (1 warm: 2.0 s each, cold 6.0 s)" in line, line

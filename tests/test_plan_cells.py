"""Cells: a search covers distinct cells (the fault's kind, the checkpoint it resumes from, where in
its epoch it lands) before it repeats one, so a handful of plans tests a handful of different
things; after a failure it sets nothing aside, so hypothesis still shrinks to the smallest plan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotchaos.config.jobs import JobSpec
from spotchaos.faults.plan import Plan
from spotchaos.record import ScenarioRecord
from spotchaos.search import REDRAW, RUN, SKIP, ExploreSettings, _Cells, _strategy, as_delivered, explore
from spotchaos.strategies import phase_preemptions, plan_cell
from spotchaos.training.trajectory import Attempt, RunRecord

from .helpers import FIXTURES

EPOCHS = [0] * 8 + [1] * 8  # two epochs of 8 steps
CHECKPOINTS = [3, 7, 11, 15]


@pytest.mark.unit
def test_a_plans_cell_is_its_kinds_the_checkpoints_before_and_the_places_in_their_epochs():
    def cell(plan: str) -> tuple:
        return plan_cell(Plan.parse(plan), CHECKPOINTS, EPOCHS)

    assert cell("sigkill@13") == (("sigkill", 11, "inside"),) == cell("sigkill@14")
    assert cell("sigkill@7") == (("sigkill", 3, "last"),)
    assert cell("sigterm@8") == (("sigterm", 7, "first"),)
    assert plan_cell(Plan.parse("sigterm@2"), CHECKPOINTS, [None] * 16) == (("sigterm", None, None),)
    assert cell("sigterm@5,sigkill@12") == (("sigterm", 3, "inside"), ("sigkill", 11, "inside"))
    assert cell("sigkill@13:truncate-half~0.1") == cell("sigkill@12:truncate-half~0.7") != cell("sigkill@13")
    assert cell("sigkill@13:truncate-half")[0][0] == "sigkill:truncate-half"
    assert cell("crash@5") != cell("crash@6")
    assert cell("sigterm@13/eval") == (("sigterm/eval", 11, "inside"),) != cell("sigterm@13")


@pytest.mark.unit
@settings(max_examples=40, database=None)
@given(st.data())
def test_a_drawn_phase_plan_lands_inside_a_phase_the_reference_began_after_its_step(data):
    starts = {"eval": [5, 11, 17], "save": [3]}
    plan = data.draw(phase_preemptions(starts))
    (only,) = plan.preemptions
    assert only.phase in starts and only.at_step in starts[only.phase] and only.fault in ("sigterm", "sigkill")
    assert str(plan) == f"{only.fault}@{only.at_step}/{only.phase}" and Plan.parse(str(plan)) == plan
    with pytest.raises(ValueError, match="no phase began"):
        phase_preemptions({"eval": []})


def job(script: str) -> JobSpec:
    command = ("python", str(FIXTURES / f"{script}.py"), "--steps", "16", "--checkpoint-every", "4")
    return JobSpec(name=script.replace("_", "-"), command=(*command, "--step-seconds", "0"), grace_seconds=10)


# six plans of one cell (a kill after checkpoint 11, inside its epoch, then the newest checkpoint
# truncated: only the file and offset picked differ), one each of two others
CROWDED = [f"sigkill@{step}:truncate-half~0.{pick}" for step in (12, 13) for pick in (1, 4, 7)]
SPACE = [Plan.parse(p) for p in [*CROWDED, "sigkill@5", "sigterm@9"]]


def test_a_search_runs_plans_of_distinct_cells_before_it_repeats_one(runner):
    trainer = job("reference_trainer")
    record = ScenarioRecord(scenario="cells", job=trainer.name, seed=3)
    with record:
        explore(runner, trainer, st.sampled_from(SPACE), settings=ExploreSettings(max_examples=3, seed=3))
    reference = runner.reference(trainer)
    checkpoints = sorted({e["step"] for e in reference.attempts[0].of_kind("checkpoint")})
    epochs = [s.fingerprints.get("epoch") for s in reference.steps]
    cells = {plan_cell(Plan.parse(r["plan"]), checkpoints, epochs) for r in record.runs}
    assert len(record.runs) == 3 and len(cells) == 3, record.runs
    assert record.figures["cells"]["cells_covered"] == 3 and record.passed


@pytest.mark.unit
def test_a_covered_cell_is_set_aside_within_the_redraws_then_skipped_and_nothing_after_a_failure():
    cells = _Cells(CHECKPOINTS, EPOCHS, examples=1)  # 5 redraws for the one plan
    assert cells.admit(Plan.parse("sigkill@13")) == RUN and cells.admit(Plan.parse("sigkill@14")) == REDRAW
    assert cells.admit(Plan.parse("sigkill@14"), drawn=False) == RUN  # a plan led with runs whatever its cell
    assert cells.admit(Plan.parse("sigkill@5")) == RUN
    for _ in range(4):
        assert cells.admit(Plan.parse("sigkill@12")) == REDRAW
    # redraws spent without a new cell: a covered cell is not run again, a new one still runs
    assert cells.admit(Plan.parse("sigkill@12")) == SKIP == cells.admit(Plan.parse("sigkill@13"))
    assert cells.admit(Plan.parse("sigterm@9")) == RUN
    failed = _Cells(CHECKPOINTS, EPOCHS, examples=3)
    assert failed.admit(Plan.parse("sigterm@10")) == RUN
    failed.failed = True  # hypothesis is shrinking: every plan it asks for runs
    assert failed.admit(Plan.parse("sigterm@9")) == RUN and failed.redraws == 0
    assert cells.figures(4) == {"cells_covered": 3, "plans_run": 4, "draws_set_aside": 5, "repeats_skipped": 2}


def test_a_search_whose_draws_find_no_new_cell_ends_without_repeating_one(runner):
    """Every plan of one cell (a kill after checkpoint 11, inside its epoch, its newest checkpoint
    truncated at any offset), as every notice of the Ray Train notice job is: the plan led with
    runs, and no draw after it."""
    trainer = job("reference_trainer")
    one_cell = st.floats(0.01, 0.99).map(lambda pick: Plan.parse(f"sigkill@{12 + (pick > 0.5)}:truncate-half~{pick}"))
    record = ScenarioRecord(scenario="one cell", job=trainer.name, seed=5)
    with record:
        tried = explore(
            runner,
            trainer,
            one_cell,
            settings=ExploreSettings(max_examples=4, seed=5),
            first=lambda epochs, checkpoints: [Plan.parse("sigkill@12:truncate-half~0.5")],
        )
    assert tried == 1 and [r["plan"] for r in record.runs] == ["sigkill@12:truncate-half~0.5"] and record.passed
    cells = record.figures["cells"]
    assert cells["draws_set_aside"] == 20 and cells["repeats_skipped"] >= 1, cells


@pytest.mark.unit
def test_on_a_ray_train_job_a_notice_to_the_group_is_the_same_plan_as_a_notice():
    """A notice reaches a Ray Train job as a drain of its workers' nodes, to the group or not: the
    main job once ran ``sigterm@5`` and ``sigterm-group@5`` on it, one plan twice (50 s each). The
    search draws plans as the job receives them, so the second is the first's verdict, reused."""
    ray_train = JobSpec(name="rt", command=("python", "train.py"), launcher="ray-train", nproc_per_node=2)
    local = JobSpec(name="local", command=("python", "train.py"))
    plan = Plan.parse("sigterm-group@5,sigkill@9")
    assert str(as_delivered(plan, ray_train)) == "sigterm@5,sigkill@9" and as_delivered(plan, local) == plan
    steps = [{"event": "step", "step": s, "loss": "0.1", "t": 0.0} for s in range(12)]
    reference = RunRecord(
        "rt", "none", [Attempt(0, 0, 1.0, 0.1, events=[*steps, {"event": "checkpoint", "step": 3}])], 1.0, ""
    )
    space = st.sampled_from([Plan.parse("sigterm-group@5"), Plan.parse("sigterm@5")])

    def drawn_for(job: JobSpec) -> set[str]:
        drawn: set[str] = set()

        @settings(max_examples=30, database=None, derandomize=True)
        @given(_strategy(space, reference, job))
        def draw(plan: Plan) -> None:
            drawn.add(str(plan))

        draw()
        return drawn

    assert drawn_for(ray_train) == {"sigterm@5"}
    assert drawn_for(local) == {"sigterm@5", "sigterm-group@5"}


@pytest.mark.unit
@settings(max_examples=60, database=None)
@given(st.data())
def test_drawn_offsets_land_a_time_after_their_step_and_are_a_cell_of_their_own(data):
    from spotchaos.strategies import preemption_plans

    plan = data.draw(preemption_plans(16, faults=("sigterm", "sigkill", "rerun"), offsets=(0.05, 0.2)))
    for p in plan.preemptions:
        assert p.offset_seconds in (None, 0.05, 0.2) and (p.fault != "rerun" or p.offset_seconds is None)
        assert Plan.parse(str(Plan((p,)))) == Plan((p,))
    assert plan_cell(Plan.parse("sigterm@13+0.2s"), CHECKPOINTS, EPOCHS) == (("sigterm+inside-step", 11, "inside"),)

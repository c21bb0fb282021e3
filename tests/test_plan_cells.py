"""Cells: a search covers distinct cells (the fault's kind, the checkpoint it resumes from, where in
its epoch it lands) before it repeats one, so a handful of plans tests a handful of different
things; after a failure it sets nothing aside, so hypothesis still shrinks to the smallest plan."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from spotchaos.config.jobs import JobSpec
from spotchaos.faults.plan import Plan
from spotchaos.record import ScenarioRecord
from spotchaos.search import ExploreSettings, _Cells, explore
from spotchaos.strategies import plan_cell

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
def test_a_covered_cell_is_set_aside_only_before_a_failure_and_within_the_redraws():
    cells = _Cells(CHECKPOINTS, EPOCHS, examples=1)  # 5 redraws for the one plan
    assert cells.admit(Plan.parse("sigkill@13")) and not cells.admit(Plan.parse("sigkill@14"))
    assert cells.admit(Plan.parse("sigkill@14"), drawn=False)  # a plan led with runs whatever its cell
    assert cells.admit(Plan.parse("sigkill@5"))
    for _ in range(4):
        assert not cells.admit(Plan.parse("sigkill@12"))
    assert cells.admit(Plan.parse("sigkill@12"))  # redraws spent: a covered cell runs again
    failed = _Cells(CHECKPOINTS, EPOCHS, examples=3)
    assert failed.admit(Plan.parse("sigterm@10"))
    failed.failed = True  # hypothesis is shrinking: every plan it asks for runs
    assert failed.admit(Plan.parse("sigterm@9")) and failed.redraws == 0
    assert cells.figures(4) == {"cells_covered": 2, "plans_run": 4, "draws_set_aside": 5}

"""The plan search: hypothesis generates plans for a scenario and shrinks a failure to the
smallest plan that still fails. It knows how to call a check, not what the check does."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, reject
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure, Unsatisfiable

from .config.jobs import JobSpec
from .core import Allowed, Core
from .errors import ScenarioFailure, SpotchaosError
from .families.preemption import ChaosFailure, DamageNotApplied, check, settle
from .faults.plan import Plan
from .record import note_cleared, note_figures, note_plans
from .strategies import FirstPlans, plan_cell, preemption_plans, resumes_from_a_checkpoint
from .training.trajectory import RunRecord
from .training.verdict import Verdict

log = logging.getLogger("spotchaos")
PlanSource = st.SearchStrategy[Plan] | Callable[[int], st.SearchStrategy[Plan]]


@dataclass
class ExploreSettings:
    max_examples: int = 3
    seed: int | None = None
    verbose: bool = False  # a failure that did not replay also carries hypothesis's exception group
    parallel: int = 1  # plans run at once ahead of the search (1: one after another, as drawn)


def plans_at_once(job: JobSpec, *, ray_nodes: int = 0, local_cluster: bool = False, gpus: int = 0) -> int:
    """How many of a scenario's plans may run at once by what they occupy: a job with ``gpus`` as
    many as the machine's GPUs lease (1 without any); a Ray job as many as the cluster has worker
    nodes (a torchrun job on Ray takes ``nnodes`` of them); a Ray Train job on the harness's local
    cluster one per ``nproc_per_node`` worker nodes (its Train workers one a node), since a plan
    mostly waits (Train V2's 5 s drain poll, the grace window, the group's restart) while its nodes
    could run the next; on the user's cluster one, as Ray, not the harness, places its workers."""
    if job.ray_backend:
        return max(1, ray_nodes // max(1, job.nnodes))
    if job.kind.cluster_ranks:
        return max(1, ray_nodes // max(1, job.nproc_per_node)) if local_cluster else 1
    request = job.gpu_request
    if not isinstance(request, int) or isinstance(request, bool):
        return 1
    return max(1, gpus // request)


def explore(
    core: Core,
    job: JobSpec,
    plans: PlanSource | None = None,
    *,
    settings: ExploreSettings | None = None,
    first: FirstPlans | None = None,
) -> int:
    """Let hypothesis search plans; on failure it shrinks to the smallest failing plan. ``first``
    gives plans run before the search, from the reference's epochs and checkpoint steps
    (``strategies.resumes_across_epochs``); they count towards ``max_examples``.

    Returns the number of plans tried. A :class:`SpotchaosError` that is not a verdict (the job
    hung, crashed on its own, wrote garbage) stops the search at once instead of being shrunk.

    A search that stopped at a plan whose failure through a shortcut was the harness's (a copy that
    changed, a crash point that never fired through it: ``Shortcuts.explained``) and that passed on
    the slow path found no failure; it searches again, once, without the copies that misled it.
    """
    settings = settings or ExploreSettings()
    tried, explained = _explore(core, job, plans, settings, first)
    if explained:
        why = "the search stopped at a plan only a shortcut failed (the slow path passed it): searched again"
        log.warning("spotchaos: job %r: %s", job.name, why)
        note_cleared(why)
        tried += _explore(core, job, plans, settings, first)[0]
        note_plans(tried)
    return tried


def _explore(
    core: Core, job: JobSpec, plans: PlanSource | None, settings: ExploreSettings, first: FirstPlans | None
) -> tuple[int, bool]:
    """One search (see :func:`explore`): the plans tried, and whether it stopped at a plan that passed
    on the slow path after a failure the harness explained."""
    reference = core.reference(job)
    search = _Search(core, job, settings, _strategy(plans, reference, job))
    explained = False
    leading = _first_plans(first, reference, job)[: max(0, settings.max_examples - 1)]  # at least one searched
    searching = search.searching(max(1, settings.max_examples - len(leading)))
    # Plans in parallel: the plans the search will draw are run ahead, several at once; the search
    # then runs as always, one plan after another, and finds each drawn plan's run already made.
    # Where every plan passes it draws exactly those; a failure or a rejected plan makes it draw
    # others (shrinking), which run then, one at a time.
    if settings.parallel > 1:
        search.ahead = _run_ahead(core, job, leading, searching, settings, _Cells.of(core, job, settings.max_examples))
    try:
        try:
            for plan in leading:  # already the plans that tell: a failure is reported as it is, not shrunk
                search.lead(plan)
            searching(search.draw)()
        except FlakyFailure as group:
            failure = search.flaky(group)
            if failure is None:
                raise
            raise failure from (group if settings.verbose else None)
    except ChaosFailure as failure:  # the plan it reports, judged through a shortcut: now on the slow path
        settled = settle(core, job, failure)
        if not settled.verdict.passed:
            raise settled from failure.__cause__
        explained = True  # the slow path's pass stands (its record says which shortcut, and why)
    except Unsatisfiable:
        raise DamageNotApplied(
            f"job {job.name!r}: no plan could damage a checkpoint (does it report durable checkpoints "
            "with probe.checkpoint before the preemption steps tried?)"
        ) from None
    finally:
        note_plans(search.tried)
        note_figures({"cells": search.cells.figures(search.tried)})
        for left in search.ahead.values():  # run ahead, never reached by the search (it went elsewhere)
            if not isinstance(left, BaseException):
                core.discard(left[0])
    if search.aborted:
        raise search.aborted[0]
    return search.tried, explained


def _strategy(plans: PlanSource | None, reference: RunRecord, job: JobSpec) -> st.SearchStrategy[Plan]:
    """The plans to draw for this job, as it receives them (``as_delivered``: two plans it
    cannot tell apart are one, run once): a plan that only ever restarts afresh tests nothing a
    user meant, and is never drawn."""
    total_steps = len(reference.steps)
    if plans is None:
        strategy = preemption_plans(total_steps)
    elif isinstance(plans, st.SearchStrategy):
        strategy = plans
    else:
        strategy = plans(total_steps)
    saved = reference.saved_steps
    first_checkpoint = saved[0] if saved else None
    delivered = strategy.map(lambda plan: as_delivered(plan, job))
    return delivered.filter(lambda plan: resumes_from_a_checkpoint(plan, first_checkpoint))


REDRAWS_PER_PLAN = 5  # draws of an already-covered cell set aside, per plan the search runs, at most
RUN, REDRAW, SKIP = "run", "redraw", "skip"  # what a search does with a plan (``_Cells.admit``)


class _Cells:
    """The cells a search has covered (``strategies.plan_cell``): a drawn plan of a covered cell
    is set aside for another draw while the search has passed everything so far and has redraws
    left, so the plans it runs spread over distinct cells first; so is a drawn plan of the job's
    early life once another has run in the session (``Prefixes.claim_early_life``: it would train
    the whole job again). Once the redraws are spent such a plan is skipped, not run: draws that
    found no new cell in all of them say the search has covered what it can tell apart, and a
    repeat would pay a whole run for a cell already passed (a Ray Train job's notice, drawn at any
    step, is one cell: its second plan took a minute of the main job). After a failure nothing is
    set aside or skipped: hypothesis's shrinking must see every plan it asks for."""

    def __init__(
        self,
        checkpoints: list[int],
        epochs: list[int | None],
        examples: int,
        early_life: Callable[[Plan], bool] = lambda plan: True,
    ) -> None:
        self.checkpoints, self.epochs, self.early_life = checkpoints, epochs, early_life
        self.covered: set[object] = set()
        self.redraws = 0
        self.skipped = 0
        self.budget = REDRAWS_PER_PLAN * examples
        self.failed = False

    def admit(self, plan: Plan, *, drawn: bool = True) -> str:
        """What to do with ``plan``: ``RUN`` it (led with, of a new cell and not a second plan of the
        job's early life, or hypothesis is shrinking a failure; it covers its cell), ``REDRAW`` (set
        aside: hypothesis draws another at no run's cost) or, the redraws spent, ``SKIP`` it (counted
        as passed, never run: the search has nothing new to run)."""
        cell = plan_cell(plan, self.checkpoints, self.epochs)
        if drawn and not self.failed and (cell in self.covered or not self.early_life(plan)):
            if self.redraws < self.budget:
                self.redraws += 1
                return REDRAW
            self.skipped += 1
            return SKIP
        if not drawn:
            self.early_life(plan)  # a plan led with runs whatever it is; if of the early life, it is the job's
        self.covered.add(cell)
        return RUN

    @classmethod
    def of(cls, core: Core, job: JobSpec, examples: int) -> _Cells:
        """The cells of a search on ``job``, from its uninterrupted run."""
        reference = core.reference(job)
        checkpoints = reference.saved_steps
        epochs = [_epoch(s.fingerprints.get("epoch")) for s in reference.steps]
        return cls(checkpoints, epochs, examples, lambda plan: core.prefixes.claim_early_life(job, plan, reference))

    def figures(self, tried: int) -> dict[str, int]:
        return {
            "cells_covered": len(self.covered),
            "plans_run": tried,
            "draws_set_aside": self.redraws,
            "repeats_skipped": self.skipped,
        }


def _epoch(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Search:
    """One search's bookkeeping. A plan that passed (or had nothing to damage) runs once: a repeat
    draw is neither run nor counted again. A failing plan is run again when hypothesis replays it:
    a verdict that does not fail twice was decided by timing, which the report must say."""

    def __init__(self, core: Core, job: JobSpec, settings: ExploreSettings, strategy: st.SearchStrategy[Plan]) -> None:
        self.core, self.job, self.settings, self.strategy = core, job, settings, strategy
        self.verdicts: dict[str, str] = {}
        self.aborted: list[SpotchaosError] = []
        self.tried = 0
        self.ahead: dict[str, tuple[RunRecord, Verdict] | BaseException] = {}
        self.cells = _Cells.of(core, job, settings.max_examples)

    def searching(self, examples: int) -> Callable[[Callable[[Plan], None]], Callable[[], None]]:
        """A hypothesis test of ``examples`` plans around a function of one plan, seeded as asked."""
        test_settings = hypothesis_settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=self.settings.seed is None,
            phases=(Phase.generate, Phase.shrink),
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
            print_blob=False,
        )

        def search(function: Callable[[Plan], None]) -> Callable[[], None]:
            test = test_settings(given(plan=self.strategy)(function))
            return hypothesis_seed(self.settings.seed)(test) if self.settings.seed is not None else test

        return search

    def draw(self, plan: Plan) -> None:
        """One plan hypothesis drew."""
        self.attempt(plan)

    def lead(self, plan: Plan) -> None:
        """One plan led with, before the search draws: run whatever its cell."""
        self.attempt(plan, drawn=False)

    def attempt(self, plan: Plan, drawn: bool = True) -> None:
        """One plan drawn (or, not ``drawn``, led with): run and judged, or its verdict reused, or
        (drawn, of a cell already covered) set aside for another draw."""
        if self.aborted:
            return
        key = str(plan)
        if key in self.verdicts:  # hypothesis drew (or replays) a plan already run: the same verdict, not a new run
            if self.verdicts[key] == "reject":
                reject()
            return
        admission = self.cells.admit(plan, drawn=drawn)
        if admission == REDRAW:
            reject()  # a cell already covered: hypothesis draws another plan, which costs no run
        if admission == SKIP:
            return  # the redraws found no new cell: a repeat is not run
        self.tried += 1
        shrinking = " (shrinking a failure)" if self.tried > self.settings.max_examples else ""
        log.info(
            "job %s: plan %d of %d planned%s: %s",
            self.job.name,
            self.tried,
            self.settings.max_examples,
            shrinking,
            plan,
        )
        ran = self.ahead.pop(key, None)  # a failing plan's replay is run again: only its first verdict was made ahead
        try:
            if isinstance(ran, BaseException):
                raise ran
            # the session's first searched plan of the job starts from step 0 (Prefixes.claim_fresh_start):
            # it keeps the fresh start tested against the reference; every other plan may start from its checkpoints
            fresh = ran is None and self.core.prefixes.claim_fresh_start(self.job, plan)
            check(self.core, self.job, plan, ran, Allowed(prefix=not fresh, reuse=True, defer=True))
            self.verdicts[key] = "passed"
        except DamageNotApplied:
            self.verdicts[key] = "reject"
            reject()  # nothing to damage at that step: not a verdict, try another plan
        except ScenarioFailure:
            self.cells.failed = True
            raise  # a verdict: hypothesis shrinks it to the smallest failing plan
        except SpotchaosError as exc:
            self.aborted.append(exc)

    def flaky(self, group: FlakyFailure) -> ScenarioFailure | None:
        """A verdict that did not fail again when hypothesis replayed its plan: timing decided it
        (where a signal landed). Spotchaos's message first; the ~60 lines of hypothesis's
        exception group only for who asked for them (-v)."""
        failure = _first_verdict(group)
        if failure is None:
            return None
        failure.add_note(
            "spotchaos: this plan failed once and passed when replayed, so where the fault landed decided it; "
            "the failure above is real for that landing"
            + ("" if self.settings.verbose else " (pytest -v shows hypothesis's account)")
        )
        return failure


def _run_ahead(
    core: Core,
    job: JobSpec,
    leading: list[Plan],
    searching: Callable[[Callable[[Plan], None]], Callable[[], None]],
    settings: ExploreSettings,
    cells: _Cells,
) -> dict[str, tuple[RunRecord, Verdict] | BaseException]:
    """Each plan the search will draw if every plan passes (the same hypothesis search, seeded alike,
    on a test that runs nothing), run ``settings.parallel`` at a time: its run and verdict, or what it
    raised. The first error that is no verdict (the job hung, crashed) stops what has not started."""
    drawn: list[Plan] = []
    seen = {str(plan) for plan in leading}
    for plan in leading:
        cells.admit(plan, drawn=False)

    def draw(plan: Plan) -> None:
        if str(plan) not in seen:
            admission = cells.admit(plan)
            if admission == REDRAW:
                reject()  # as the search will: another draw
            if admission == SKIP:
                return  # as the search will: not run
            seen.add(str(plan))
            drawn.append(plan)

    searching(draw)()
    plans = list({str(p): p for p in (*leading, *drawn)}.values())
    spans: list[tuple[float, float]] = []
    done: dict[str, tuple[RunRecord, Verdict] | BaseException] = {}
    stop = threading.Event()  # an error that is no verdict: the plans not started yet never start
    started = time.monotonic()

    fresh = {str(plan): core.prefixes.claim_fresh_start(job, plan) for plan in plans[:1]}  # as the search would

    def run(plan: Plan) -> None:
        if stop.is_set():
            return
        begun = time.monotonic()
        try:
            done[str(plan)] = core.run(job, plan, Allowed(prefix=not fresh.get(str(plan)), reuse=True, defer=True))
        except BaseException as exc:  # raised again where the search reaches the plan
            done[str(plan)] = exc
            if not isinstance(exc, ScenarioFailure):
                stop.set()
        spans.append((begun, time.monotonic()))

    # each plan's thread notes in the scenario's record (its runs' cost: they are made whether the
    # search reaches them or not), as the search's own thread does
    contexts = [contextvars.copy_context() for _ in plans]
    with ThreadPoolExecutor(max_workers=settings.parallel, thread_name_prefix="spotchaos-plan") as pool:
        list(pool.map(lambda plan, context: context.run(run, plan), plans, contexts))
    note_figures(
        {
            "parallel": {
                "workers": settings.parallel,
                "plans_run_ahead": len(spans),
                "max_concurrent": _most_at_once(spans),
                "wall_seconds": round(time.monotonic() - started, 3),
                "run_seconds": round(sum(b - a for a, b in spans), 3),
            }
        }
    )
    return done


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one moment."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = current = 0
    for _, change in edges:
        current += change
        most = max(most, current)
    return most


def as_delivered(plan: Plan, job: JobSpec) -> Plan:
    """``plan`` as ``job`` receives it: on a Ray Train job a notice to the whole group and one to the
    main process both drain its workers' nodes (``RayTrainHandle.notify``), one plan."""
    return plan.group_notices_as_notices() if job.kind.cluster_ranks else plan


def _first_plans(first: FirstPlans | None, reference: RunRecord, job: JobSpec) -> list[Plan]:
    """``first``'s plans for this job, as it receives them: from the epoch each reference step
    reported (None when it reports none) and the steps after which it reported a checkpoint."""
    if first is None:
        return []
    epochs = [_epoch(s.fingerprints.get("epoch")) for s in reference.steps]
    plans = [as_delivered(plan, job) for plan in first(epochs, reference.saved_steps)]
    return list({str(plan): plan for plan in plans}.values())


def _first_verdict(group: BaseExceptionGroup) -> ScenarioFailure | None:
    """The first verdict inside a (nested) exception group."""
    for exc in group.exceptions:
        if isinstance(exc, ScenarioFailure):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (found := _first_verdict(exc)) is not None:
            return found
    return None

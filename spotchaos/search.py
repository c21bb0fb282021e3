"""The plan search: hypothesis generates plans for a scenario and shrinks a failure to the
smallest plan that still fails. It knows how to call a check, not what the check does."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, reject
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure, Unsatisfiable

from .config import JobSpec
from .errors import ScenarioFailure, SpotchaosError
from .families.preemption import DamageNotApplied, check
from .plan import Plan
from .record import ScenarioRecord, note_plans
from .session import SessionCore
from .strategies import FirstPlans, preemption_plans, resumes_from_a_checkpoint
from .trajectory import RunRecord

log = logging.getLogger("spotchaos")
PlanSource = st.SearchStrategy[Plan] | Callable[[int], st.SearchStrategy[Plan]]


@dataclass
class ExploreSettings:
    max_examples: int = 3
    seed: int | None = None
    verbose: bool = False  # a failure that did not replay also carries hypothesis's exception group


def explore(
    core: SessionCore,
    job: JobSpec,
    plans: PlanSource | None = None,
    *,
    settings: ExploreSettings | None = None,
    record: ScenarioRecord | None = None,
    first: FirstPlans | None = None,
) -> int:
    """Let hypothesis search plans; on failure it shrinks to the smallest failing plan. ``first``
    gives plans run before the search, from the reference's epochs and checkpoint steps
    (``strategies.resumes_across_epochs``); they count towards ``max_examples``.

    Returns the number of plans tried. A :class:`SpotchaosError` that is not a verdict (the job
    hung, crashed on its own, wrote garbage) stops the search at once instead of being shrunk.
    """
    settings = settings or ExploreSettings()
    reference = core.reference(job)
    total_steps = len(reference.steps)
    if plans is None:
        strategy = preemption_plans(total_steps)
    elif isinstance(plans, st.SearchStrategy):
        strategy = plans
    else:
        strategy = plans(total_steps)
    saved = sorted({e["step"] for a in reference.attempts for e in a.of_kind("checkpoint")})
    first_checkpoint = saved[0] if saved else None
    # a plan that only ever restarts afresh tests nothing a user meant: never drawn
    strategy = strategy.filter(lambda plan: resumes_from_a_checkpoint(plan, first_checkpoint))
    aborted: list[SpotchaosError] = []
    tried = 0
    # a plan that passed (or had nothing to damage) runs once: a repeat draw is neither run nor
    # counted again. A failing plan is run again when hypothesis replays it: a verdict that does not
    # fail twice was decided by timing, which the report must say
    verdicts: dict[str, str] = {}

    def attempt(plan: Plan) -> None:
        nonlocal tried
        if aborted:
            return
        key = str(plan)
        if key in verdicts:  # hypothesis drew (or replays) a plan already run: the same verdict, not a new run
            if verdicts[key] == "reject":
                reject()
            return
        tried += 1
        shrinking = " (shrinking a failure)" if tried > settings.max_examples else ""
        log.info("job %s: plan %d of %d planned%s: %s", job.name, tried, settings.max_examples, shrinking, plan)
        try:
            check(core, job, plan, record)
            verdicts[key] = "passed"
        except DamageNotApplied:
            verdicts[key] = "reject"
            reject()  # nothing to damage at that step: not a verdict, try another plan
        except ScenarioFailure:
            raise  # a verdict: hypothesis shrinks it to the smallest failing plan
        except SpotchaosError as exc:
            aborted.append(exc)

    leading = _first_plans(first, reference)[: max(0, settings.max_examples - 1)]  # at least one searched
    for plan in leading:  # already the plans that tell: a failure is reported as it is, not shrunk
        attempt(plan)
    searched = max(1, settings.max_examples - len(leading))
    test = given(plan=strategy)(attempt)
    test = hypothesis_settings(
        max_examples=searched,
        deadline=None,
        database=None,
        derandomize=settings.seed is None,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
    )(test)
    if settings.seed is not None:
        test = hypothesis_seed(settings.seed)(test)
    try:
        test()
    except FlakyFailure as group:
        failure = _first_verdict(group)
        if failure is None:
            raise
        # A verdict that did not fail again when hypothesis replayed its plan: timing decided it
        # (where a signal landed). Spotchaos's message first; the ~60 lines of hypothesis's
        # exception group only for who asked for them (-v).
        failure.add_note(
            "spotchaos: this plan failed once and passed when replayed, so where the fault landed decided it; "
            "the failure above is real for that landing"
            + ("" if settings.verbose else " (pytest -v shows hypothesis's account)")
        )
        raise failure from (group if settings.verbose else None)
    except Unsatisfiable:
        raise DamageNotApplied(
            f"job {job.name!r}: no plan could damage a checkpoint (does it report durable checkpoints "
            "with probe.checkpoint before the preemption steps tried?)"
        ) from None
    finally:
        note_plans(record, tried)
    if aborted:
        raise aborted[0]
    return tried


def _first_plans(first: FirstPlans | None, reference: RunRecord) -> list[Plan]:
    """``first``'s plans for this job: from the epoch each reference step reported (None when it
    reports none) and the steps after which it reported a checkpoint."""
    if first is None:
        return []
    epochs = [s.fingerprints.get("epoch") for s in reference.steps]
    epochs = [e if isinstance(e, int) and not isinstance(e, bool) else None for e in epochs]
    checkpoints = sorted({e["step"] for a in reference.attempts for e in a.of_kind("checkpoint")})
    return first(epochs, checkpoints)


def _first_verdict(group: BaseExceptionGroup) -> ScenarioFailure | None:
    """The first verdict inside a (nested) exception group."""
    for exc in group.exceptions:
        if isinstance(exc, ScenarioFailure):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (found := _first_verdict(exc)) is not None:
            return found
    return None

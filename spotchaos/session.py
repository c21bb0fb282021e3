"""A session: the scenarios as a user writes them; the pytest fixture and the Python API use this.

:class:`Session` (``from spotchaos import Session``) is the session's core
(:mod:`spotchaos.core`: runs, references, resources) with each scenario family's entry points
as methods: the one list of them. Every method is one line: the scenarios themselves live in
their families (:mod:`spotchaos.families`) and the search in :mod:`spotchaos.search`. Each is
marked ``@scenario`` or ``@query``, and the pytest fixture offers the marked methods as they are
(a scenario inside a record for the report) without listing them again; so a new family is its
module plus one method here, and the core does not grow.

What a scenario notes goes to the record of the scenario running in this context
(``with ScenarioRecord(...) as record:``; the fixture enters one for every scenario).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import hypothesis.strategies as st

from .config.jobs import JobSpec
from .core import Core, SessionCore, entry_of, query, scenario
from .families import budgets, crashpoints, distributed, phases, preemption, serving, storage
from .families.budgets import BudgetFailure
from .families.preemption import ChaosFailure, DamageNotApplied
from .families.storage import StorageFailure
from .faults.plan import Plan, Preemption
from .record import ScenarioRecord
from .search import ExploreSettings, PlanSource, explore
from .training.trajectory import RunRecord
from .training.verdict import Verdict

if TYPE_CHECKING:
    from .config.services import ServiceSpec
    from .storage import CredentialSwap, Fault

__all__ = [
    "BudgetFailure",
    "ChaosFailure",
    "ChaosRunner",
    "Core",
    "DamageNotApplied",
    "ExploreSettings",
    "PlanSource",
    "ScenarioRecord",
    "Session",
    "SessionCore",
    "StorageFailure",
    "entry_of",
    "query",
    "scenario",
]


class Session(Core):
    """The scenarios of one session, outside pytest as inside it (the plugin's fixture wraps one).

    ``with Session(".") as session: session.check(job, "sigterm@5")`` — the context manager owns
    every resource the session starts (containers, the S3 server and its proxy) and removes the
    working directories of passing runs when it closes.
    """

    @scenario(plans=1)
    def check(self, job: JobSpec, plan: Plan | str) -> Verdict:
        """Run one plan (``Plan`` or ``"sigterm@5,sigkill@12"``); raise :class:`ChaosFailure` unless
        every verdict holds."""
        return preemption.check(self, job, plan)

    @scenario()
    def explore(self, job: JobSpec, plans: PlanSource | None = None, **options: Any) -> int:
        """Search plans with hypothesis (``settings``, ``first``); a failure shrinks to the smallest plan."""
        return explore(self, job, plans, **options)

    @query
    def trace(self, job: JobSpec, plan: Plan) -> tuple[RunRecord, list[list[dict[str, Any]]]]:
        """Run with every file-system event under the checkpoint directory logged, per attempt."""
        return crashpoints.trace(self, job, plan)

    @query
    def save_boundaries(self, job: JobSpec) -> list[dict[str, Any]]:
        """The file-system events of one checkpoint save (rotation included): crash points."""
        return crashpoints.save_boundaries(self, job)

    @query
    def save_crash_points(self, job: JobSpec) -> list[Plan]:
        """A crash plan before each file-system event of one save, from the reference's checkpoint
        before it where the job takes prefixes (``crash@S+N``), else from step 0 (``crash@N``)."""
        return crashpoints.save_crash_points(self, job)

    @query
    def phase_starts(self, job: JobSpec) -> dict[str, list[int]]:
        """Per phase the job declares, the steps after which its reference began it."""
        return phases.phase_starts(self, job)

    @query
    def phase_plans(self, job: JobSpec) -> list[Plan]:
        """A SIGTERM and a SIGKILL inside each phase the job declares (``sigterm@S/eval``)."""
        return phases.phase_plans(self, job)

    @query
    def resume_boundaries(self, job: JobSpec) -> tuple[Preemption, list[dict[str, Any]]]:
        """(the hard kill before it, the reads of a checkpoint load on restart): crash points."""
        return crashpoints.resume_boundaries(self, job)

    @query
    def timing_run(self, job: JobSpec) -> RunRecord:
        """A run with one SIGTERM half-way, cached per job: notice flush and restart latency."""
        return budgets.timing_run(self, job)

    @scenario()
    def check_overhead(
        self, job: JobSpec, measure: Callable[[Callable[[], RunRecord]], RunRecord] | None = None
    ) -> dict[str, Any]:
        """Checkpoint overhead against ``job.overhead_budget``, plus interval advice and cost."""
        return budgets.check_overhead(self, job, measure)

    @scenario()
    def check_notice_flush(self, job: JobSpec) -> None:
        """Fail when SIGTERM-to-durable-checkpoint takes more than half the grace window."""
        return budgets.check_notice_flush(self, job)

    @scenario(plans=1)
    def check_storage(self, job: JobSpec, plan: Plan | str, faults: Sequence[Fault]) -> dict[str, Any]:
        """Run ``plan`` with storage ``faults`` on (``SlowDown(0.3)``, ``ResetMidUpload(...)``): every
        verdict must hold and no checkpoint may block longer than ``checkpoint_budget_seconds``."""
        return storage.check_storage(self, job, plan, faults)

    @scenario(plans=1)
    def check_upload_preemption(self, job: JobSpec) -> dict[str, Any]:
        """Kill the job inside a slowed checkpoint upload: the previous checkpoint must stay the
        newest valid one and the restart resume from it bit-exact (``storage = "s3"`` jobs)."""
        return storage.check_upload_preemption(self, job)

    @scenario()
    def check_storage_refusal(self, job: JobSpec, fault: Fault | CredentialSwap) -> dict[str, Any]:
        """S3 refuses the restart (``UnknownAccessKey()``, ``ReadOnlyKey()``, ``ExpiredToken(...)``):
        a non-zero exit with a clear message, no checkpoint object changed, no secret shown."""
        return storage.check_storage_refusal(self, job, fault)

    @query
    def rank_save_points(self, job: JobSpec) -> list[dict[str, Any]]:
        """Every rank's file-system events of one checkpoint save, numbered per rank: crash points."""
        return distributed.rank_save_points(self, job)

    @scenario()
    def explore_rank_crashes(self, job: JobSpec, **options: Any) -> int:
        """A torchrun job killed at a crash point of any rank's save, searched by hypothesis."""
        first, every = distributed.rank_crash_plans(self.rank_save_points(job))
        settings = options.pop("settings", None) or ExploreSettings()
        # the leading plans are the ones that tell: all of them run, and at least one is searched
        settings = replace(settings, max_examples=max(settings.max_examples, len(first) + 1))
        return explore(self, job, st.sampled_from(every), first=lambda *_: first, settings=settings, **options)

    @scenario(plans=1)
    def check_shard_crash(self, job: JobSpec, rank: int = 1) -> Verdict:
        """A torchrun job: kill ``rank`` as it writes its shard of a checkpoint, before the
        ``.metadata``; the restart must resume from the previous complete checkpoint, bit-exact."""
        return distributed.check_shard_crash(self, job, rank)

    @scenario(plans=1)
    def check_reshard(self, job: JobSpec, resume_nproc: int) -> dict[str, Any]:
        """A torchrun job: preempt it mid-epoch and resume on ``resume_nproc`` ranks per node; the
        restored tensors must equal the saved ones and every sample be seen exactly once."""
        return distributed.check_reshard(self, job, resume_nproc)

    @scenario()
    def determinism_baseline(self, job: JobSpec, worlds: tuple[int, ...] = (2,)) -> list[dict[str, Any]]:
        """Per world size: repeatable uninterrupted runs, and a bit-exact preempt-and-resume."""
        return distributed.determinism_baseline(self, job, worlds)

    @scenario(plans=1)
    def check_drain(self, service: ServiceSpec | str) -> dict[str, Any]:
        """The reclaim notice under load: every request answered or refused, the drain over before the
        kill. ``service``: a :class:`ServiceSpec`, or the name of one declared in the session's
        ``pyproject.toml`` (``[tool.spotchaos.services.NAME]``)."""
        if isinstance(service, str):
            from .config.jobs import load_settings

            service = load_settings(self.root / "pyproject.toml").service(service)
        return serving.check_drain(self, service)


# the names before 0.2 (spotchaos.runner.ChaosRunner; spotchaos.session.SessionCore), kept one release
ChaosRunner = Session

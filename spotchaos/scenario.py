"""What the ``spotchaos`` fixture hands a test: the scenarios it can run against a job.

Each method is one line: a scenario is a call on the runner, wrapped by :meth:`Scenario._run`,
which records it for the report and turns what the runner raised into a failure, an error or a
skip (no Docker daemon, no GPU). Everything that runs or judges lives below, in plain modules.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from .backends.docker import DockerUnavailable, GpuUnavailable
from .config import JobSpec
from .errors import ScenarioFailure, SpotchaosError
from .plan import Plan
from .pytest_session import RECORDS
from .runner import ChaosFailure, ChaosRunner, ExploreSettings, PlanSource, ScenarioRecord

if TYPE_CHECKING:
    from .pytest_session import _State
    from .storage import CredentialSwap, Fault


class Scenario:
    """What the ``spotchaos`` fixture hands a test: run plans against jobs, recorded for the report."""

    def __init__(self, state: _State, item: pytest.Item) -> None:
        self._state = state
        self._item = item
        self._seed = (state.options.seed + zlib.crc32(item.nodeid.encode())) % 2**32
        item.stash[RECORDS] = []

    @property
    def runner(self) -> ChaosRunner:
        return self._state.runner

    def _record(self, job: JobSpec) -> ScenarioRecord:
        record = ScenarioRecord(scenario=self._item.nodeid, job=job.name, seed=self._state.options.seed)
        self._item.stash[RECORDS].append(record)
        self._state.in_flight[self._item.nodeid] = self._item.stash[RECORDS]  # reported even if interrupted
        return record

    def check(self, job: JobSpec, plan: Plan | str) -> None:
        """Run one plan (``Plan`` or ``"sigterm@5,sigkill@12"``); fail unless every verdict holds."""
        plan = Plan.parse(plan) if isinstance(plan, str) else plan
        record = self._record(job)
        record.plans_tried = 1
        self._guard(record, lambda: self.runner.check(job, plan, record))

    def explore(self, job: JobSpec, plans: PlanSource | None = None) -> None:
        """Search plans with hypothesis (``--spotchaos-plan`` replays one plan instead)."""
        if self._state.options.plan is not None:
            self.check(job, self._state.options.plan)
            return
        record = self._record(job)
        settings = ExploreSettings(max_examples=self._state.options.max_examples, seed=self._seed)
        self._guard(record, lambda: self.runner.explore(job, plans, settings=settings, record=record))

    def reference(self, job: JobSpec):
        """The uninterrupted run of ``job`` (computed once per session)."""
        return self.runner.reference(job)

    def checkpoint_steps(self, job: JobSpec) -> list[int]:
        """Steps after which the uninterrupted run reported durable checkpoints."""
        return self.runner.checkpoint_steps(job)

    def save_boundaries(self, job: JobSpec) -> list[dict[str, Any]]:
        """The file-system events of one checkpoint save (rotation included): crash points."""
        return self.runner.save_boundaries(job)

    def resume_boundaries(self, job: JobSpec):
        """(the hard kill before it, the reads of a checkpoint load on restart): crash points."""
        return self.runner.resume_boundaries(job)

    def check_overhead(self, job: JobSpec, benchmark: Any = None) -> None:
        """Fail when checkpointing costs more than ``job.overhead_budget`` of training time.

        Pass pytest-benchmark's ``benchmark`` fixture to time the measured run with it and put
        the figures in ``--benchmark-json`` (``extra_info``), for comparison across commits.
        """
        record = self._record(job)
        measure = None
        if benchmark is not None:

            def measure(fn):
                return benchmark.pedantic(fn, rounds=1, iterations=1)

        try:
            self._guard(record, lambda: self.runner.check_overhead(job, record, measure))
        finally:  # a failing budget still reports its figures
            if benchmark is not None and record.figures:
                benchmark.extra_info.update(_benchmark_info(record.figures))

    def check_notice_flush(self, job: JobSpec) -> None:
        """Fail when SIGTERM-to-durable-checkpoint takes more than half the grace window."""
        record = self._record(job)
        self._guard(record, lambda: self.runner.check_notice_flush(job, record))

    def check_upload_preemption(self, job: JobSpec) -> None:
        """Kill the job inside a slowed checkpoint upload: the previous checkpoint must stay the
        newest valid one and the restart resume from it bit-exact (``storage = "s3"`` jobs)."""
        record = self._record(job)
        record.plans_tried = 1
        self._guard(record, lambda: self.runner.check_upload_preemption(job, record))

    def check_storage(self, job: JobSpec, plan: Plan | str, faults: Sequence[Fault]) -> None:
        """Run ``plan`` with storage ``faults`` on (``SlowDown(0.3)``, ``ResetMidUpload(...)``): every
        verdict must hold and no checkpoint may block longer than ``checkpoint_budget_seconds``."""
        record = self._record(job)
        record.plans_tried = 1
        self._guard(record, lambda: self.runner.check_storage(job, plan, faults, record))

    def check_storage_refusal(self, job: JobSpec, fault: Fault | CredentialSwap) -> None:
        """S3 refuses the restart (``UnknownAccessKey()``, ``ReadOnlyKey()``, ``ExpiredToken(...)``):
        a non-zero exit with a clear message, no checkpoint object changed, no secret shown."""
        record = self._record(job)
        self._guard(record, lambda: self.runner.check_storage_refusal(job, fault, record))

    def _guard(self, record: ScenarioRecord, action) -> None:
        try:
            action()
        except DockerUnavailable as exc:
            if self._state.options.require_docker:
                record.passed, record.error = False, str(exc)
                raise
            self._item.stash[RECORDS].remove(record)  # a skipped scenario has no verdict to report
            pytest.skip(f"spotchaos: {exc} (--spotchaos-require-docker makes this a failure)")
        except GpuUnavailable as exc:
            if self._state.options.require_gpu:
                record.passed, record.error = False, str(exc)
                raise
            self._item.stash[RECORDS].remove(record)
            pytest.skip(f"spotchaos: {exc} (--spotchaos-require-gpu makes this a failure)")
        except ChaosFailure as failure:
            record.passed = False
            record.failing_plan = str(failure.plan)
            raise
        except ScenarioFailure:  # a budget or storage verdict
            record.passed = False
            raise
        except SpotchaosError as exc:
            record.passed = False
            record.error = str(exc)
            raise
        except Exception as exc:  # a crash of the harness itself (or a MemoryError): an error, never a pass
            record.passed = False
            record.error = f"spotchaos could not finish this scenario: {type(exc).__name__}: {exc}"
            raise


def _benchmark_info(figures: dict[str, Any]) -> dict[str, Any]:
    overhead = figures.get("overhead", {})
    advice = figures.get("advice", {})
    return {
        "checkpoint_overhead_fraction": overhead.get("fraction"),
        "overhead_budget": overhead.get("budget"),
        "checkpoint_seconds": overhead.get("checkpoint_seconds"),
        "step_seconds": overhead.get("step_seconds"),
        "daly_interval_seconds": advice.get("daly_interval"),
        "configured_interval_seconds": advice.get("configured_interval"),
    }

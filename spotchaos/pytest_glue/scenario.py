"""What the ``spotchaos`` fixture hands a test: the scenarios it can run against a job.

Each method is one line: a scenario is a call on the runner, wrapped by :meth:`Scenario._run`,
which records it for the report and turns what the runner raised into a failure, an error or a
skip (no Docker daemon, no GPU). Everything that runs or judges lives below, in plain modules.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from ..backends.docker import DockerUnavailable, GpuUnavailable
from ..config.jobs import JobSpec
from ..errors import ScenarioFailure, SpotchaosError
from ..faults.plan import Plan, Preemption
from ..record import ScenarioRecord, note_error, note_failure, note_plans
from ..runner import ChaosFailure, ChaosRunner, ExploreSettings, PlanSource
from ..strategies import FirstPlans
from ..training.trajectory import RunRecord
from .stash import RECORDS

if TYPE_CHECKING:
    from ..config.services import ServiceSpec
    from ..storage import CredentialSwap, Fault
    from .pytest_session import _State


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

    def check(self, job: JobSpec, plan: Plan | str) -> None:
        """Run one plan (``Plan`` or ``"sigterm@5,sigkill@12"``); fail unless every verdict holds."""
        self._run(job, lambda record: self.runner.check(job, plan, record), plans=1)

    def explore(self, job: JobSpec, plans: PlanSource | None = None, first: FirstPlans | None = None) -> None:
        """Search plans with hypothesis (``--spotchaos-plan`` replays one plan instead); ``first``
        gives plans to run before the search (``strategies.resumes_across_epochs``)."""
        self._run(job, lambda record: self._search(job, plans, record, first))

    def reference(self, job: JobSpec) -> RunRecord:
        """The uninterrupted run of ``job`` (computed once per session)."""
        return self.runner.reference(job)

    def checkpoint_steps(self, job: JobSpec) -> list[int]:
        """Steps after which the uninterrupted run reported durable checkpoints."""
        return self.runner.checkpoint_steps(job)

    def save_boundaries(self, job: JobSpec) -> list[dict[str, Any]]:
        """The file-system events of one checkpoint save (rotation included): crash points."""
        return self.runner.save_boundaries(job)

    def resume_boundaries(self, job: JobSpec) -> tuple[Preemption, list[dict[str, Any]]]:
        """(the hard kill before it, the reads of a checkpoint load on restart): crash points."""
        return self.runner.resume_boundaries(job)

    def check_overhead(self, job: JobSpec, benchmark: Any = None) -> None:
        """Fail when checkpointing costs more than ``job.overhead_budget`` of training time; with
        pytest-benchmark's ``benchmark`` fixture the measured run is timed by it and the figures go
        to ``--benchmark-json`` (``extra_info``), for comparison across commits."""
        self._run(job, lambda record: self._overhead(job, benchmark, record))

    def check_notice_flush(self, job: JobSpec) -> None:
        """Fail when SIGTERM-to-durable-checkpoint takes more than half the grace window."""
        self._run(job, lambda record: self.runner.check_notice_flush(job, record))

    def check_shard_crash(self, job: JobSpec, rank: int = 1) -> None:
        """A torchrun job: kill ``rank`` as it writes its shard of a checkpoint, before the
        ``.metadata``; the restart must resume from the previous complete checkpoint, bit-exact."""
        self._run(job, lambda record: self.runner.check_shard_crash(job, rank, record), plans=1)

    def explore_rank_crashes(self, job: JobSpec) -> None:
        """A torchrun job: kill one rank at any file-system event of its part of a checkpoint save
        (its DCP shard, the ``.metadata``, a file of its own, the manifest or marker that publishes
        the checkpoint), the rank and the event searched by hypothesis; first, for each rank but
        the coordinator, a crash before its first and before its last write. Every restart must
        resume from a complete checkpoint, bit-exact; a checkpoint published before every rank
        finished writing it is named."""
        self._run(job, lambda record: self._search(job, None, record, rank_crashes=True))

    def check_reshard(self, job: JobSpec, resume_nproc: int) -> None:
        """A torchrun job: preempt it mid-epoch and resume on ``resume_nproc`` ranks per node; the
        restored tensors must equal the saved ones and every sample be seen exactly once."""
        self._run(job, lambda record: self.runner.check_reshard(job, resume_nproc, record), plans=1)

    def determinism_baseline(self, job: JobSpec, worlds: Sequence[int] = (2,)) -> None:
        """A torchrun job: per world size, two uninterrupted runs and a preempt-and-resume, reported;
        fails when a world size is not repeatable or does not resume bit-exact."""
        self._run(job, lambda record: self._baseline(job, tuple(worlds), record), plans=len(worlds))

    def _baseline(self, job: JobSpec, worlds: tuple[int, ...], record: ScenarioRecord) -> None:
        rows = self.runner.determinism_baseline(job, worlds, record)
        bad = [r for r in rows if not (r["repeatable"] and r["resume_bit_exact"])]
        if bad:
            lines = [f"{r['world']} ranks: {'; '.join(r['repeat_differences'] + r['failures'])}" for r in bad]
            raise ScenarioFailure("not deterministic or not bit-exact at:\n" + "\n".join(lines))

    def service(self, name: str) -> ServiceSpec:
        """A service declared in ``[tool.spotchaos.services.NAME]`` (in ``--spotchaos-image``'s
        container when that option is given, as jobs are)."""
        spec = self._state.settings.service(name)
        return spec.in_image(self._state.options.image) if self._state.options.image else spec

    def check_drain(self, service: ServiceSpec | str) -> None:
        """A service through its reclaim notice under load (``service`` or its declared name): every
        request in flight answered in full, none after the notice dropped, the drain over before the
        kill; latency and the outcome of every request go to the report."""
        spec = self.service(service) if isinstance(service, str) else service
        self._run(spec, lambda record: self.runner.check_drain(spec, record), plans=1)

    def check_upload_preemption(self, job: JobSpec) -> None:
        """Kill the job inside a slowed checkpoint upload: the previous checkpoint must stay the
        newest valid one and the restart resume from it bit-exact (``storage = "s3"`` jobs)."""
        self._run(job, lambda record: self.runner.check_upload_preemption(job, record), plans=1)

    def check_storage(self, job: JobSpec, plan: Plan | str, faults: Sequence[Fault]) -> None:
        """Run ``plan`` with storage ``faults`` on (``SlowDown(0.3)``, ``ResetMidUpload(...)``): every
        verdict must hold and no checkpoint may block longer than ``checkpoint_budget_seconds``."""
        self._run(job, lambda record: self.runner.check_storage(job, plan, faults, record), plans=1)

    def check_storage_refusal(self, job: JobSpec, fault: Fault | CredentialSwap) -> None:
        """S3 refuses the restart (``UnknownAccessKey()``, ``ReadOnlyKey()``, ``ExpiredToken(...)``):
        a non-zero exit with a clear message, no checkpoint object changed, no secret shown."""
        self._run(job, lambda record: self.runner.check_storage_refusal(job, fault, record))

    def _search(
        self,
        job: JobSpec,
        plans: PlanSource | None,
        record: ScenarioRecord,
        first: FirstPlans | None = None,
        *,
        rank_crashes: bool = False,
    ) -> None:
        if self._state.options.plan is not None:  # --spotchaos-plan: exactly that plan
            note_plans(record, 1)
            self.runner.check(job, self._state.options.plan, record)
            return
        options = self._state.options
        parallel = options.parallel or self._gpu_parallel(job)
        settings = ExploreSettings(
            max_examples=options.max_examples, seed=self._seed, verbose=options.verbose, parallel=parallel
        )
        if rank_crashes:
            self.runner.explore_rank_crashes(job, record, settings=settings)
        else:
            self.runner.explore(job, plans, settings=settings, record=record, first=first)

    def _gpu_parallel(self, job: JobSpec) -> int:
        """A job with gpus: as many plans at once as the machine's GPUs lease (1 without any); a Ray
        job: as many as the cluster has worker nodes (a torchrun job on Ray takes nnodes of them)."""
        if job.backend == "ray":
            return max(1, len(self.runner.ray_cluster().nodes) // max(1, job.nnodes))
        request = job.gpu_request
        if not isinstance(request, int) or isinstance(request, bool):
            return 1
        return max(1, len(self.runner.gpus().devices) // request)

    def _overhead(self, job: JobSpec, benchmark: Any, record: ScenarioRecord) -> None:
        measure = None
        if benchmark is not None:

            def measure(fn):
                return benchmark.pedantic(fn, rounds=1, iterations=1)

        try:
            self.runner.check_overhead(job, record, measure)
        finally:  # a failing budget still reports its figures
            if benchmark is not None and record.figures:
                benchmark.extra_info.update(_benchmark_info(record.figures))

    def _run(
        self, job: JobSpec | ServiceSpec, action: Callable[[ScenarioRecord], object], plans: int | None = None
    ) -> None:
        """One scenario: a record for the report (kept even if the session is interrupted), then
        ``action``; what it raises becomes a failure, an error, or a skip (no Docker, no GPU)."""
        record = ScenarioRecord(scenario=self._item.nodeid, job=job.name, seed=self._state.options.seed)
        self._item.stash[RECORDS].append(record)
        self._state.in_flight[self._item.nodeid] = self._item.stash[RECORDS]
        if plans is not None:
            note_plans(record, plans)
        try:
            action(record)
        except (DockerUnavailable, GpuUnavailable) as exc:
            option = "--spotchaos-require-docker" if isinstance(exc, DockerUnavailable) else "--spotchaos-require-gpu"
            required = (
                self._state.options.require_docker
                if isinstance(exc, DockerUnavailable)
                else self._state.options.require_gpu
            )
            if required:
                note_error(record, str(exc))
                raise
            self._item.stash[RECORDS].remove(record)  # a skipped scenario has no verdict to report
            pytest.skip(f"spotchaos: {exc} ({option} makes this a failure)")
        except ChaosFailure as failure:
            note_failure(record, failure.plan)
            raise
        except ScenarioFailure as failure:  # a budget, storage or determinism verdict
            note_failure(record, message=str(failure))
            raise
        except SpotchaosError as exc:
            note_error(record, str(exc))
            raise
        except Exception as exc:  # a crash of the harness itself (or a MemoryError): an error, never a pass
            note_error(record, f"spotchaos could not finish this scenario: {type(exc).__name__}: {exc}")
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

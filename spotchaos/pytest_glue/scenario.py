"""What the ``spotchaos`` fixture hands a test: the scenarios it can run against a job.

The scenarios are the Session's (:mod:`spotchaos.session`, the one list of entry points): the
fixture offers each method marked ``@scenario`` wrapped by :meth:`Scenario._run`, which records it
for the report and turns what the session raised into a failure, an error or a skip (no Docker
daemon, no GPU), and each ``@query`` as it is. Written out here is only what pytest adds: the
seed and the parallel and plan options of a search, pytest-benchmark, the image option, and a
failure made of the determinism rows. Everything that runs or judges lives below, in plain modules.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from ..backends.docker import DockerUnavailable, GpuUnavailable
from ..config.jobs import JobSpec
from ..errors import ScenarioFailure, ScenarioUnfit, SpotchaosError
from ..record import ScenarioRecord, note_error, note_failure, note_plans
from ..search import plans_at_once
from ..session import ChaosFailure, ExploreSettings, PlanSource, Session, entry_of
from ..strategies import FirstPlans
from .stash import RECORDS

if TYPE_CHECKING:
    from ..config.services import ServiceSpec
    from .pytest_session import _State


class Scenario:
    """What the ``spotchaos`` fixture hands a test: run plans against jobs, recorded for the report."""

    def __init__(self, state: _State, item: pytest.Item) -> None:
        self._state = state
        self._item = item
        self._seed = (state.options.seed + zlib.crc32(item.nodeid.encode())) % 2**32
        item.stash[RECORDS] = []

    @property
    def session(self) -> Session:
        """The session behind the fixture: its S3, its references, its secrets."""
        return self._state.session

    @property
    def runner(self) -> Session:
        """The name before 0.2 (``spotchaos.runner``), kept one release: :attr:`session`."""
        return self._state.session

    def __getattr__(self, name: str) -> Any:
        """The Session's entry points, offered as they are: a ``@scenario`` runs inside a record for
        the report (what it raises becomes a failure, an error or a skip), a ``@query`` is handed
        over unchanged. Only what pytest adds to a scenario is written out below."""
        method = getattr(self.session, name, None) if not name.startswith("_") else None
        entry = entry_of(method)
        if entry is None:
            marked = {n for n in dir(Session) if entry_of(getattr(Session, n, None))}
            own = {n for n in vars(Scenario) if not n.startswith("_") and n not in ("session", "runner")}
            known = ", ".join(sorted(marked | own))
            raise AttributeError(f"the spotchaos fixture has no scenario {name!r} (it has: {known})")
        if not entry.scenario:
            return method

        @functools.wraps(method)
        def run(subject: JobSpec | ServiceSpec, *args: Any, **kwargs: Any) -> Any:
            return self._run(subject, lambda _record: method(subject, *args, **kwargs), plans=entry.plans)

        return run

    def explore(self, job: JobSpec, plans: PlanSource | None = None, first: FirstPlans | None = None) -> None:
        """Search plans with hypothesis (``--spotchaos-plan`` replays one plan instead); ``first``
        gives plans to run before the search (``strategies.resumes_across_epochs``)."""
        self._run(job, lambda _record: self._search(job, plans, first))

    def check_overhead(self, job: JobSpec, benchmark: Any = None) -> None:
        """Fail when checkpointing costs more than ``job.overhead_budget`` of training time; with
        pytest-benchmark's ``benchmark`` fixture the measured run is timed by it and the figures go
        to ``--benchmark-json`` (``extra_info``), for comparison across commits."""
        self._run(job, lambda record: self._overhead(job, benchmark, record))

    @staticmethod
    def kept_benchmark(request: pytest.FixtureRequest) -> Any:
        """pytest-benchmark's ``benchmark`` fixture where it keeps what it times (a JSON file, a saved
        run, a comparison), else None: timing one more run whose figures go nowhere is a run the
        overhead scenario does not need (it reads the reference run's)."""
        config = request.config
        if not config.pluginmanager.hasplugin("pytest_benchmark"):
            return None
        keeps = ("benchmark_json", "benchmark_save", "benchmark_autosave", "benchmark_compare")
        return request.getfixturevalue("benchmark") if any(config.getoption(o, None) for o in keeps) else None

    def explore_rank_crashes(self, job: JobSpec) -> None:
        """A torchrun job: kill one rank at any file-system event of its part of a checkpoint save
        (its DCP shard, the ``.metadata``, a file of its own, the manifest or marker that publishes
        the checkpoint), the rank and the event searched by hypothesis; first, for each rank but
        the coordinator, a crash before its first and before its last write. Every restart must
        resume from a complete checkpoint, bit-exact; a checkpoint published before every rank
        finished writing it is named."""
        self._run(job, lambda _record: self._search(job, None, rank_crashes=True))

    def determinism_baseline(self, job: JobSpec, worlds: Sequence[int] = (2,)) -> None:
        """A torchrun job: per world size, two uninterrupted runs and a preempt-and-resume, reported;
        fails when a world size is not repeatable or does not resume bit-exact."""
        self._run(job, lambda _record: self._baseline(job, tuple(worlds)), plans=len(worlds))

    def _baseline(self, job: JobSpec, worlds: tuple[int, ...]) -> None:
        rows = self.session.determinism_baseline(job, worlds)
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
        self._run(spec, lambda _record: self.session.check_drain(spec), plans=1)

    def _search(
        self,
        job: JobSpec,
        plans: PlanSource | None,
        first: FirstPlans | None = None,
        *,
        rank_crashes: bool = False,
    ) -> None:
        if self._state.options.plan is not None:  # --spotchaos-plan: exactly that plan
            note_plans(1)
            self.session.check(job, self._state.options.plan)
            return
        options = self._state.options
        parallel = options.parallel or self._plans_at_once(job)
        settings = ExploreSettings(
            max_examples=options.max_examples, seed=self._seed, verbose=options.verbose, parallel=parallel
        )
        if rank_crashes:
            self.session.explore_rank_crashes(job, settings=settings)
        else:
            self.session.explore(job, plans, settings=settings, first=first)

    def _plans_at_once(self, job: JobSpec) -> int:
        """What the job's machines allow at once (``search.plans_at_once``), read from the
        session's cluster or GPUs only for a job that uses them."""
        if job.on_ray_cluster:
            cluster = self.session.ray_cluster()
            return plans_at_once(job, ray_nodes=len(cluster.nodes), local_cluster=cluster.local)
        gpus = len(self.session.gpus().devices) if job.gpu_request is not None else 0
        return plans_at_once(job, gpus=gpus)

    def _overhead(self, job: JobSpec, benchmark: Any, record: ScenarioRecord) -> None:
        measure = None
        if benchmark is not None:

            def measure(fn):
                return benchmark.pedantic(fn, rounds=1, iterations=1)

        try:
            self.session.check_overhead(job, measure)
        finally:  # a failing budget still reports its figures
            if benchmark is not None and record.figures:
                benchmark.extra_info.update(_benchmark_info(record.figures))

    def _run(
        self, job: JobSpec | ServiceSpec, action: Callable[[ScenarioRecord], Any], plans: int | None = None
    ) -> Any:
        """One scenario: a record for the report (kept even if the session is interrupted), then
        ``action`` inside it (what the families note goes to it); what it raises becomes a failure,
        an error, or a skip (no Docker, no GPU)."""
        record = ScenarioRecord(scenario=self._item.nodeid, job=job.name, seed=self._state.options.seed)
        self._item.stash[RECORDS].append(record)
        self._state.in_flight[self._item.nodeid] = self._item.stash[RECORDS]
        try:
            with record:
                if plans is not None:
                    note_plans(plans)
                return action(record)
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
        except ScenarioUnfit as unfit:
            self._item.stash[RECORDS].remove(record)  # judged nothing: a skip, saying why
            pytest.skip(f"spotchaos: {unfit}")
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

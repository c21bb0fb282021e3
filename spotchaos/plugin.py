"""pytest glue: options, fixtures, the marker, the header, the summary and the report file.

Everything that measures or decides lives in plain modules (engine, verdict, runner, report);
this module only translates between them and pytest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import hooks
from .backends.docker import DockerUnavailable, GpuUnavailable
from .config import JobSpec, Settings, load_settings
from .errors import ConfigError, SpotchaosError
from .history import HISTORY_DIR, save_run
from .leftovers import LiveJobs
from .options import PROFILES, RunOptions, resolve
from .plan import Plan
from .processes import children
from .redact import SecretMatcher, find_leaks, redact, secret_values
from .report import build_report, now_iso, write_json, write_text
from .report_md import render_markdown
from .runner import (
    BudgetFailure,
    ChaosFailure,
    ChaosRunner,
    ExploreSettings,
    PlanSource,
    ScenarioRecord,
    StorageFailure,
)
from .safefs import captured_logs, read_text_bounded, rewrite_logs
from .sanitize import visible
from .summary import figure_lines

if TYPE_CHECKING:
    from .storage import CredentialSwap, Fault

SCAN_BYTES = 256 << 20  # the most of one artifact the end-of-session secret scan reads
SKIP_REASON = "chaos scenario: run with --spotchaos (it starts real training jobs)"
CACHE_SEED = "spotchaos/seed"


@dataclass
class _State:
    settings: Settings
    options: RunOptions
    runner: ChaosRunner
    started: str
    scenarios: list[dict[str, Any]] = field(default_factory=list)
    worker_secrets: list[str] = field(default_factory=list)  # S3 secrets pytest-xdist workers handed out
    in_flight: dict[str, list[ScenarioRecord]] = field(default_factory=dict)  # a test's records until reported
    interrupted: str | None = None  # the signal that stopped the session (SIGTERM, SIGHUP, SIGINT)
    reaped: list[str] = field(default_factory=list)  # what dead pytest runs had left running, ended at start
    old_handlers: dict[int, Any] = field(default_factory=dict)

    @property
    def secrets(self) -> list[str]:
        """Values no output may show: the jobs' secret-named variables, the session's own, and every
        S3 secret the harness made for a run (here and in xdist workers)."""
        jobs = [s for job in _selected(self) for s in job.secrets()]
        return jobs + secret_values(os.environ) + self.runner.secrets + self.worker_secrets


STATE = pytest.StashKey[_State]()
RECORDS = pytest.StashKey[list[ScenarioRecord]]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("spotchaos", "preempt real training jobs and check they resume bit-exact")
    group.addoption("--spotchaos", action="store_true", help="run chaos scenarios (default: skipped)")
    group.addoption(
        "--spotchaos-seed",
        metavar="N|last",
        help="seed of the plan search; 'last' replays the previous session (default: random, printed)",
    )
    group.addoption(
        "--spotchaos-profile",
        choices=sorted(PROFILES),
        help="plans per scenario: "
        + ", ".join(f"{k}={v}" for k, v in PROFILES.items())
        + " (default: quick when CI is set, else standard)",
    )
    group.addoption("--spotchaos-examples", type=int, metavar="N", help="plans per scenario, overrides the profile")
    group.addoption(
        "--spotchaos-plan",
        metavar="PLAN",
        help="run exactly this plan instead of searching, e.g. 'sigterm@5,sigkill@12' (default: search)",
    )
    group.addoption("--spotchaos-job", action="append", metavar="NAME", help="only this job (repeatable; default: all)")
    group.addoption(
        "--spotchaos-output",
        metavar="DIR",
        help="where the report goes (default: [tool.spotchaos].output, else spotchaos-report)",
    )
    group.addoption(
        "--spotchaos-image",
        metavar="IMAGE",
        help="run every job in a container of this local image (Docker backend; default: as each job says)",
    )
    group.addoption(
        "--spotchaos-require-docker",
        action="store_true",
        help="fail container scenarios when no Docker daemon answers (default: skip them; always fail in CI)",
    )
    group.addoption(
        "--spotchaos-require-gpu",
        action="store_true",
        help="fail scenarios of jobs that ask for GPUs when there are none (default: skip them)",
    )
    group.addoption(
        "--spotchaos-keep-runs",
        action="store_true",
        help="keep the working directory of passing runs too (default: only failing ones)",
    )


def _pyproject(config: pytest.Config) -> Path:
    inipath = config.inipath
    if inipath is not None and inipath.name == "pyproject.toml":
        return inipath
    return config.rootpath / "pyproject.toml"


def _declared_jobs(config: pytest.Config) -> Settings:
    settings = load_settings(_pyproject(config))
    extra = [job for batch in config.hook.pytest_spotchaos_jobs(config=config) for job in batch or ()]
    names = [job.name for job in (*settings.jobs, *extra)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"job {duplicates[0]!r} is declared twice (pyproject.toml and pytest_spotchaos_jobs?)")
    return Settings(output=settings.output, jobs=(*settings.jobs, *extra))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "spotchaos(jobs=None): a chaos scenario, skipped unless --spotchaos is given; jobs=[names] runs it "
        "on those jobs only (jobs with parametrize = false are reached only this way)",
    )
    if not config.getoption("spotchaos"):
        return
    cache = getattr(config, "cache", None)  # absent with -p no:cacheprovider
    try:
        settings = _declared_jobs(config)
        options = resolve(
            seed=config.getoption("spotchaos_seed"),
            last_seed=cache.get(CACHE_SEED, None) if cache is not None else None,
            profile=config.getoption("spotchaos_profile"),
            examples=config.getoption("spotchaos_examples"),
            output=config.getoption("spotchaos_output"),
            plan=config.getoption("spotchaos_plan"),
            jobs=config.getoption("spotchaos_job"),
            keep_runs=config.getoption("spotchaos_keep_runs"),
            image=config.getoption("spotchaos_image"),
            require_docker=config.getoption("spotchaos_require_docker"),
            require_gpu=config.getoption("spotchaos_require_gpu"),
            environ=os.environ,
            settings=settings,
        )
    except ConfigError as exc:
        raise pytest.UsageError(f"spotchaos: {exc}") from None
    worker_seed = getattr(config, "workerinput", {}).get("spotchaos_seed")
    if worker_seed is not None:  # an xdist worker searches with the controller's seed
        options = replace(options, seed=worker_seed)
    elif cache is not None:
        cache.set(CACHE_SEED, options.seed)
    # Runs live beside the report, so a failure's logs and checkpoints are easy to find.
    stamp = f"{now_iso().replace(':', '')}-{os.getpid()}"
    runs = config.rootpath / options.output / "runs" / stamp
    try:
        _check_writable(config.rootpath / options.output)
    except OSError as exc:
        raise pytest.UsageError(
            f"spotchaos: cannot write the report to {config.rootpath / options.output} "
            f"(--spotchaos-output or [tool.spotchaos] output): {exc.strerror or exc}"
        ) from None
    runner = ChaosRunner(config.rootpath, workdir=runs, keep_passing=options.keep_runs)
    state = _State(settings, options, runner, now_iso())
    if worker_seed is None:  # the controller (or a plain session): end what dead sessions left running
        state.reaped = LiveJobs().reap()
    config.stash[STATE] = state
    config.pluginmanager.register(_Collector(config, state), "spotchaos-collector")
    _catch_stop_signals(state, config)


def _check_writable(directory: Path) -> None:
    """Fail now, not after an hour of scenarios, when the report cannot be written."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".spotchaos-write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def _catch_stop_signals(state: _State, config: pytest.Config) -> None:
    """SIGTERM (CI cancelling a job, ``docker stop``) and SIGHUP (a closed terminal) stop the
    session the way Ctrl-C does: every job and container is ended on the way out and the report
    is written, marked interrupted. Python's default for both is to die on the spot, leaving the
    trainers running and no report. A pytest-xdist controller passes the signal on to its
    workers, whose jobs are theirs to end: execnet would SIGKILL a worker that is still busy."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: Any) -> None:
        if state.interrupted is not None:
            return  # already stopping: let the cleanup finish
        state.interrupted = signal.Signals(signum).name
        if config.pluginmanager.hasplugin("dsession"):  # the xdist controller: its children are the workers
            for worker in children(os.getpid()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(worker, signum)
        raise KeyboardInterrupt(f"spotchaos: pytest received {state.interrupted}: ending every job, writing the report")

    for signum in (signal.SIGTERM, signal.SIGHUP):
        state.old_handlers[signum] = signal.signal(signum, stop)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        for signum, handler in state.old_handlers.items():
            signal.signal(signum, handler)
        state.runner.close()
        runs = state.runner.workdir.parent
        if runs.is_dir() and not any(runs.iterdir()):
            runs.rmdir()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = config.stash.get(STATE, None)
    if state is None:
        return None
    o = state.options
    jobs = ", ".join(j.name for j in _selected(state)) or "none declared"
    lines = [
        f"spotchaos: seed {o.seed} (replay with --spotchaos-seed={o.seed}), profile {o.profile} "
        f"({o.max_examples} plans per scenario), jobs: {jobs}, report: {o.output}/report.json"
    ]
    if state.reaped:
        lines.append(f"spotchaos: ended {len(state.reaped)} thing(s) that pytest runs which died had left running:")
        lines += [f"  {line}" for line in state.reaped]
    return lines


def _selected(state: _State) -> list[JobSpec]:
    o = state.options
    jobs = [j for j in state.settings.jobs if not o.jobs or j.name in o.jobs]
    return [j.in_image(o.image) for j in jobs] if o.image else jobs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "spotchaos_job" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash.get(STATE, None)
    if state is None:  # --spotchaos not given: one placeholder, skipped at collection
        metafunc.parametrize("spotchaos_job", [None], ids=["off"])
        return
    marker = metafunc.definition.get_closest_marker("spotchaos")
    named = marker.kwargs.get("jobs") if marker is not None else None
    selected = _selected(state)
    if named is not None:
        jobs = [j for j in selected if j.name in named]
        if not jobs and not state.options.jobs:
            declared = ", ".join(j.name for j in state.settings.jobs) or "none"
            raise pytest.UsageError(f"spotchaos: {metafunc.definition.nodeid} names jobs {named}; declared: {declared}")
    else:
        jobs = [j for j in selected if j.parametrize]
    if not jobs and not state.settings.jobs:
        raise pytest.UsageError(
            "spotchaos: no job to test. Declare one in pyproject.toml:\n"
            '  [tool.spotchaos.jobs.train]\n  command = ["python", "train.py"]'
        )
    if not jobs:  # --spotchaos-job chose jobs this test does not take
        skip = pytest.mark.skip(reason="spotchaos: none of the selected jobs is for this test")
        metafunc.parametrize("spotchaos_job", [pytest.param(None, marks=skip, id="no-job")])
        return
    metafunc.parametrize("spotchaos_job", jobs, ids=[j.name for j in jobs])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash.get(STATE, None) is not None:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("spotchaos") or {"spotchaos", "spotchaos_job"} & uses:
            item.add_marker(skip)


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
        except (BudgetFailure, StorageFailure):
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


@pytest.fixture
def spotchaos(request: pytest.FixtureRequest) -> Scenario:
    """Run and search preemption plans; see the README's 'Writing your own scenario'."""
    state = request.config.stash.get(STATE, None)
    if state is None:
        pytest.skip(SKIP_REASON)
    return Scenario(state, request.node)


@pytest.fixture
def spotchaos_job(request: pytest.FixtureRequest) -> JobSpec:
    """Each declared job in turn (parametrized at collection)."""
    return request.param


@pytest.fixture(scope="session")
def spotchaos_moto():
    """moto's S3 on 127.0.0.1, one per test session (one per xdist worker)."""
    from .storage import MotoS3

    with MotoS3() as server:
        yield server


@pytest.fixture
def spotchaos_s3(spotchaos_moto):
    """A reset S3 behind a fault proxy, with fresh credentials: ``.add(SlowDown(0.3))``,
    ``.environment()`` for a job's env, ``.client()`` for the test itself."""
    from .storage import S3Service

    with S3Service(spotchaos_moto) as service:
        yield service


def _replay_command(item: pytest.Item, state: _State, plan: str | None) -> str:
    parts = ["pytest", "--spotchaos", f"--spotchaos-seed={state.options.seed}"]
    if plan:
        parts.append(f"--spotchaos-plan='{plan}'")
    if state.options.image:
        parts.append(f"--spotchaos-image='{state.options.image}'")
    parts.append(f"'{item.nodeid}'")
    return " ".join(parts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    state = item.config.stash.get(STATE, None)
    if state is None or call.when != "call" or RECORDS not in item.stash:
        return report
    state.in_flight.pop(item.nodeid, None)
    records = []
    for record in item.stash[RECORDS]:
        data = asdict(record)
        data["outcome"] = report.outcome
        if report.failed and data["passed"]:  # the test failed after (or around) the verdict: never shown as a pass
            data["passed"] = False
            what = f"{call.excinfo.typename}: {call.excinfo.value}" if call.excinfo is not None else "it failed"
            data["error"] = f"the test failed after the scenario ran: {what}"
        data["replay"] = _replay_command(item, state, record.failing_plan)
        records.append(redact(data, state.secrets))  # a job's printed secret stops here, before xdist sends it
    report.spotchaos_records = records  # rides on the report, so it survives pytest-xdist
    if call.excinfo is not None and isinstance(
        call.excinfo.value, SpotchaosError | ChaosFailure | BudgetFailure | StorageFailure
    ):
        notes = getattr(call.excinfo.value, "__notes__", [])
        replay = "\n".join(f"  replay: {r['replay']}" for r in records if not r["passed"])
        text = "\n".join([f"{call.excinfo.typename}: {call.excinfo.value}", *notes, replay])
        report.longrepr = visible(redact(text, state.secrets))  # the terminal and JUnit XML show it
    return report


def _junit_xml(config: pytest.Config):
    """The junitxml plugin's writer when --junitxml is on (its stash key is not public API)."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # a future pytest moved it: lose the properties, not the session
        return None
    return config.stash.get(xml_key, None)


class _Collector:
    """Gathers scenario records and writes the report; registered only when --spotchaos is on."""

    def __init__(self, config: pytest.Config, state: _State) -> None:
        self.config = config
        self.state = state
        self.path: Path | None = None
        self.saved: Path | None = None
        self.leaks: list[str] = []

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """pytest-xdist: every worker searches with this session's seed, so one seed replays all."""
        node.workerinput["spotchaos_seed"] = self.state.options.seed

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Seed and report path as JUnit global properties, for CI systems that read only the XML."""
        xml = _junit_xml(self.config)
        if xml is not None:
            xml.add_global_property("spotchaos_seed", str(self.state.options.seed))
            xml.add_global_property("spotchaos_report", str(self._report_path()))

    def _report_path(self) -> Path:
        return self.config.rootpath / self.state.options.output / "report.json"

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.state.scenarios.extend(getattr(report, "spotchaos_records", None) or [])

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """pytest-xdist: the S3 secrets a worker made, so the controller can redact and scan for them."""
        self.state.worker_secrets.extend(getattr(node, "workeroutput", {}).get("spotchaos_secrets", []))

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session):
        """After the JUnit XML is written (so it can be scanned), before the terminal summary."""
        result = yield
        # runs kept for inspection land in the report directory CI uploads: their logs are redacted too
        rewrite_logs(self.state.runner.workdir, SecretMatcher(self.state.secrets).redact_text)
        if hasattr(self.config, "workerinput"):  # an xdist worker sends its records to the controller
            self.config.workeroutput["spotchaos_secrets"] = list(self.state.runner.secrets)
            return result
        if session.exitstatus == pytest.ExitCode.INTERRUPTED and self.state.interrupted is None:
            self.state.interrupted = "SIGINT"
        self._record_interrupted()
        self._write_report()
        self.leaks = self._scan_for_secrets()
        if self.leaks:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return result

    def _record_interrupted(self) -> None:
        """The scenarios a stop signal cut short: in the report as errors, never as passes."""
        state = self.state
        for records in state.in_flight.values():
            for record in records:
                data = asdict(record)
                data["passed"] = False
                data["error"] = f"interrupted ({state.interrupted or 'stopped'}) while this scenario ran"
                data["outcome"] = "interrupted"
                state.scenarios.append(redact(data, state.secrets))
        state.in_flight.clear()

    def _scan_for_secrets(self) -> list[str]:
        """Every file this session wrote for people to read (the report, the JUnit XML, the saved
        run, the logs of kept runs) searched for each secret the harness handed out and each secret
        of the jobs' own ``env`` (every 8-character window, and its encodings): redaction is
        trusted only after it is checked."""
        files = [self.path, self.path.with_name("report.md"), self.path.with_name("report.html")] if self.path else []
        if self.saved is not None:
            files.append(self.saved)
        xml = _junit_xml(self.config)
        if xml is not None and Path(xml.logfile).is_file():
            files.append(Path(xml.logfile))
        captured = {str(f): read_text_bounded(f, SCAN_BYTES) for f in files if f.is_file()}
        runs = self.config.rootpath / self.state.options.output / "runs"
        captured.update({str(runs / name): text for name, text in captured_logs(runs).items()})
        state = self.state
        secrets = [*state.runner.secrets, *state.worker_secrets, *(s for j in _selected(state) for s in j.secrets())]
        return find_leaks(captured, secrets)

    def _write_report(self) -> None:
        state = self.state
        jobs = _selected(state)
        document = build_report(
            root=self.config.rootpath,
            seed=state.options.seed,
            profile=state.options.profile,
            jobs=[j.describe() for j in jobs],
            scenarios=state.scenarios,
            started=state.started,
            secrets=state.secrets,
            containers=state.runner.containers(),
            interrupted=state.interrupted,
            reaped=state.reaped,
        )
        self.config.hook.pytest_spotchaos_report(config=self.config, report=document)
        self.path = write_json(document, self._report_path())
        markdown = render_markdown(document)
        write_text(markdown, self.path.with_name("report.md"))
        from .report_html import render_html  # matplotlib: loaded when a report is written, not at pytest start

        write_text(render_html(document), self.path.with_name("report.html"))
        if state.scenarios:  # a session that ran nothing is not worth comparing against
            self.saved = save_run(document, self.config.rootpath / HISTORY_DIR)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:  # GitHub Actions shows this file on the run's page
            with open(summary, "a") as f:
                f.write(markdown)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        tr.section("spotchaos")
        for s in self.state.scenarios:
            verdict = "bit-exact" if s["passed"] else ("ERROR" if s.get("error") else "FAILED")
            detail = f"failing plan {s['failing_plan']}" if s.get("failing_plan") else ""
            lost = sum(r["lost_steps"] for r in s["runs"])
            tr.write_line(f"{verdict:9} {s['scenario']}  plans={s['plans_tried']} lost_steps={lost} {detail}".rstrip())
            for line in figure_lines(s.get("figures") or {}):
                tr.write_line(f"          {line}")
            for escaped in sorted({p for r in s["runs"] for p in r.get("escaped_processes") or []}):
                tr.write_line(visible(f"          warning: left the job's process group and was ended: {escaped}"))
        if self.state.interrupted is not None:
            tr.write_line(f"INTERRUPTED by {self.state.interrupted}: every job was ended; the report says so")
        if self.path is not None:
            tr.write_line(f"report: {self.path} (and report.md, report.html beside it)")
        if self.saved is not None:
            tr.write_line(f"saved as {self.saved} (compare runs with: spotchaos compare previous latest)")
        if self.leaks:
            tr.write_line(
                f"FAILED: a secret (or 8 characters of one, or its encoding) appears in: {', '.join(self.leaks)}"
            )
        seed = self.state.options.seed
        tr.write_line(f"seed: {seed} (replay with --spotchaos-seed={seed})")

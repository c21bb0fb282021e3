"""The pytest side of a ``--spotchaos`` session: what is loaded only when it is on.

``spotchaos.plugin`` stays import-light, the way pytest-xdist imports its ``DSession`` only
under ``-n``: a plain ``pytest`` run never imports this module, hypothesis, the engine or the
backends. :func:`start` resolves the options, builds the session and registers the collector,
whose hooks parametrize the scenarios over the jobs, turn each test's records into the report,
print the header and the summary, and end the session's jobs and containers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from ..config.jobs import Settings, load_settings
from ..core import CoreOptions
from ..errors import ConfigError, SpotchaosError
from ..extras import MissingExtra
from ..host.leftovers import LiveJobs
from ..host.processes import children
from ..record import ScenarioRecord, as_reported, note_error
from ..report import SessionOutcome, build_report, now_iso, write_json, write_text
from ..report.gate_cost import cost_line, per_job
from ..report.history import save_run
from ..report.markdown import render_markdown
from ..report.summary import figure_lines, is_service, lost_steps, verdict_word
from ..safety.redact import SecretMatcher, artifact_leaks, leaking_files, redact, redact_files, secret_values
from ..safety.safefs import NotPrivate
from ..safety.sanitize import visible
from ..session import Session
from ..training.reference.cache import ReferenceCache
from .options import Given, RunOptions, resolve
from .order import by_job
from .parametrize import by_subject, selected_jobs
from .stash import RECORDS, STATE

LOG = logging.getLogger("spotchaos")
CACHE_SEED = "spotchaos/seed"


@dataclass
class _State:
    settings: Settings
    options: RunOptions
    session: Session
    started: str
    scenarios: list[dict[str, Any]] = field(default_factory=list)
    worker_secrets: list[str] = field(default_factory=list)  # S3 secrets pytest-xdist workers handed out
    in_flight: dict[str, list[ScenarioRecord]] = field(default_factory=dict)  # a test's records until reported
    interrupted: str | None = None  # the signal that stopped the session (SIGTERM, SIGHUP, SIGINT)
    reaped: list[str] = field(default_factory=list)  # what dead pytest runs had left running, ended at start
    old_handlers: dict[int, Any] = field(default_factory=dict)
    live_log: logging.Handler | None = None  # -v: the spotchaos logger's lines on the terminal
    closed: bool = False  # the session ended its jobs, clusters and folders (an xdist worker's: at its sessionfinish)

    @property
    def secrets(self) -> list[str]:
        """Values no output may show: the jobs' secret-named variables, the session's own, and every
        S3 secret the harness made for a run (here and in xdist workers)."""
        jobs = [s for job in selected_jobs(self) for s in job.secrets()]
        return jobs + secret_values(os.environ) + self.session.secrets + self.worker_secrets


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
    return replace(settings, jobs=(*settings.jobs, *extra))


BUILTIN = Path(__file__).resolve().parents[1] / "scenarios"
SCENARIO_FIXTURES = {"spotchaos", "spotchaos_job", "spotchaos_service"}


def _add_builtin_scenarios(config: pytest.Config, settings: Settings) -> None:
    """The package's own scenarios join what pytest collects, so a project that declares a job has
    the whole gate with nothing copied; not when the run names test files (or node ids) only, a
    --pyargs selection, or ``[tool.spotchaos] builtin = false``. With ``builtin`` unset they are
    dropped again at collection when the project has scenarios of its own (``_own_scenarios``)."""
    if settings.builtin is False or config.option.pyargs:
        return
    given = [a for a in config.args if not a.startswith("-")]
    if (
        config.args_source == pytest.Config.ArgsSource.ARGS
        and given
        and not any(Path(a.split("::")[0]).is_dir() for a in given)
    ):
        return
    if any(Path(a.split("::")[0]).resolve() in (BUILTIN, *BUILTIN.parents) for a in given if "::" not in a):
        return  # already collected through a folder above it (a run from the spotchaos checkout)
    config.args.append(str(BUILTIN))


def _own_scenarios(items: list[pytest.Item]) -> bool:
    """Whether the session collected a spotchaos scenario outside the built-in ones."""
    for item in items:
        if Path(str(item.path)).resolve().is_relative_to(BUILTIN):
            continue
        if item.get_closest_marker("spotchaos") or SCENARIO_FIXTURES & set(item.fixturenames):
            return True
    return False


# Given's fields and the --spotchaos-* options that give them (pytest's dest names, plugin.py)
_GIVEN = {
    **{name: name for name in ("seed", "profile", "examples", "output", "plan", "keep_runs", "parallel", "image")},
    **{name: name for name in ("backend", "ray_address", "warm", "prefix", "tails", "history", "reference_cache")},
    **{name: name for name in ("fresh_reference", "audit", "require_docker", "require_gpu")},
    "jobs": "job",
}


def start(config: pytest.Config) -> None:
    """Everything ``--spotchaos`` turns on: options, the session, the collector, stop signals."""
    cache = getattr(config, "cache", None)  # absent with -p no:cacheprovider
    try:
        settings = _declared_jobs(config)
        given = Given(
            **{name: config.getoption(f"spotchaos_{option}") for name, option in _GIVEN.items()},
            verbose=config.option.verbose > 0,
        )
        last_seed = cache.get(CACHE_SEED, None) if cache is not None else None
        options = resolve(given, environ=os.environ, settings=settings, last_seed=last_seed)
    except ConfigError as exc:
        where = "" if "settings" in locals() and settings.jobs else f" (jobs read from {_pyproject(config)})"
        raise pytest.UsageError(f"spotchaos: {exc}{where}") from None
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
    cache = options.reference_cache
    session = Session(
        config.rootpath,
        CoreOptions(
            keep_passing=options.keep_runs,
            warm=options.warm,
            prefix=options.prefix,
            tails=options.tails,
            audit=options.audit,
            reference_cache=None if cache is None else ReferenceCache(cache, fresh=options.fresh_reference),
            ray_address=options.ray_address,
            settings=settings,
        ),
        workdir=runs,
    )
    state = _State(settings, options, session, now_iso())
    if worker_seed is None:  # the controller (or a plain session): end what dead sessions left running
        try:
            state.reaped = LiveJobs().reap()
        except NotPrivate as exc:  # another local user made spotchaos's folder first: its records are theirs
            raise pytest.UsageError(f"spotchaos: {exc}") from None
    config.stash[STATE] = state
    _add_builtin_scenarios(config, settings)
    config.pluginmanager.register(_Collector(config, state), "spotchaos-collector")
    if config.option.verbose > 0 and not config.getini("log_cli") and worker_seed is None:
        state.live_log = _LiveLines(config)
        LOG.addHandler(state.live_log)
        LOG.setLevel(logging.INFO)
    _catch_stop_signals(state, config)


class _LiveLines(logging.Handler):
    """Under ``-v``, each line of the ``spotchaos`` logger (a run, an attempt, a plan of a search)
    on the terminal as it happens, the way pytest's live logging writes: a scenario exploring
    four plans of several attempts each is otherwise silent for minutes. (``--log-cli-level=INFO``
    shows the same lines through pytest's own live logging.)"""

    def __init__(self, config: pytest.Config) -> None:
        super().__init__(logging.INFO)
        self.config = config

    def emit(self, record: logging.LogRecord) -> None:
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if terminal is None:
            return
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            terminal.write_line(visible(f"spotchaos: {record.getMessage()}"))


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


def _replay_command(item: pytest.Item, state: _State, plan: str | None) -> str:
    parts = ["pytest", "--spotchaos", f"--spotchaos-seed={state.options.seed}"]
    if plan:
        parts.append(f"--spotchaos-plan='{plan}'")
    if state.options.image:
        parts.append(f"--spotchaos-image='{state.options.image}'")
    if state.options.backend:
        parts.append(f"--spotchaos-backend={state.options.backend}")
    parts += _replay_target(item)
    return " ".join(parts)


def _replay_target(item: pytest.Item) -> list[str]:
    """The test to run again, as it runs from the project: its node id, or for a scenario of the
    package's own (which lives in site-packages, outside the project, where a node id is no path
    pytest can take) its module by name with ``--pyargs``."""
    path = Path(str(item.path)).resolve()
    if not path.is_relative_to(BUILTIN):
        return [f"'{item.nodeid}'"]
    module = ".".join((BUILTIN.parent.name, BUILTIN.name, *path.relative_to(BUILTIN).with_suffix("").parts))
    chain = item.listchain()
    start = next((i for i, node in enumerate(chain) if isinstance(node, pytest.Module)), len(chain) - 2)
    inner = "::".join(node.name for node in chain[start + 1 :])
    return ["--pyargs", f"'{module}::{inner}'"]


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
        self.html_missing = ""  # why report.html was not written (an extra not installed)
        self.write_error: str | None = None  # why the report could not be written, in one line

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """pytest-xdist: every worker searches with this session's seed, so one seed replays all."""
        node.workerinput["spotchaos_seed"] = self.state.options.seed

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        """Each test's records ride on its report (so they survive pytest-xdist), redacted; a
        spotchaos failure shows as its one message, made inert for the terminal."""
        report = yield
        state = self.state
        if call.when != "call" or RECORDS not in item.stash:
            return report
        state.in_flight.pop(item.nodeid, None)
        records = []
        matcher = SecretMatcher(state.secrets)  # built once per report: every record and the message use it
        failure = None
        # a test that failed with a scenario of its own failing is explained by it: the checks of the
        # same test that passed before it stay passes in every format; only a test that failed with
        # every scenario passed (after its verdicts) makes them errors
        if report.failed and all(record.passed for record in item.stash[RECORDS]):
            failure = f"{call.excinfo.typename}: {call.excinfo.value}" if call.excinfo is not None else "it failed"
        for record in item.stash[RECORDS]:
            replay = _replay_command(item, state, record.failing_plan)
            data = as_reported(record, outcome=report.outcome, replay=replay, test_failure=failure)
            records.append(redact(data, matcher))  # a job's printed secret stops here, before xdist sends it
        report.spotchaos_records = records  # rides on the report, so it survives pytest-xdist
        if call.excinfo is not None and isinstance(call.excinfo.value, SpotchaosError):
            notes = getattr(call.excinfo.value, "__notes__", [])
            replays = dict.fromkeys(r["replay"] for r in records if not r["passed"] and r["replay"])
            replay = "\n".join(f"  replay: {command}" for command in replays)  # each command once
            text = "\n".join([f"{call.excinfo.typename}: {call.excinfo.value}", *notes, replay])
            report.longrepr = visible(redact(text, matcher))  # the terminal and JUnit XML show it
        return report

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """``builtin`` unset: the built-in scenarios are the gate of a project without scenarios of
        its own; beside its own they run only with ``builtin = true``. A scenario is left out for the
        jobs that lack what it needs when they were not named (``spotchaos_unfit``). The rest run
        job by job (``order.by_job``)."""
        unfit = [i for i in items if i.get_closest_marker("spotchaos_unfit")]
        if self.state.settings.builtin is None and _own_scenarios(items):
            unfit += [i for i in items if Path(str(i.path)).resolve().is_relative_to(BUILTIN)]
        if unfit:
            config.hook.pytest_deselected(items=unfit)
            items[:] = [i for i in items if i not in unfit]
        items[:] = by_job(items)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        state = self.state
        o = state.options
        jobs = ", ".join(j.name for j in selected_jobs(state)) or "none declared"
        lines = [
            f"spotchaos: seed {o.seed} (replay with --spotchaos-seed={o.seed}), profile {o.profile} "
            f"({o.max_examples} plans per scenario), jobs: {jobs}, report: {o.output}/report.json"
        ]
        if state.reaped:
            lines.append(f"spotchaos: ended {len(state.reaped)} thing(s) that pytest runs which died had left running:")
            lines += [f"  {line}" for line in state.reaped]
        return lines

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Each scenario once per job or service it takes (:func:`.parametrize.by_subject`)."""
        by_subject(metafunc, self.state)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """End the session's jobs, containers and servers; restore the signal handlers."""
        state = self.state
        for signum, handler in state.old_handlers.items():
            signal.signal(signum, handler)
        if state.live_log is not None:
            LOG.removeHandler(state.live_log)
        if not state.closed:
            state.session.close()
        runs = state.session.workdir.parent
        if runs.is_dir() and not any(runs.iterdir()):
            runs.rmdir()

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
        redact_files(self.state.session.workdir, SecretMatcher(self.state.secrets))
        if hasattr(self.config, "workerinput"):  # an xdist worker sends its records to the controller
            self.config.workeroutput["spotchaos_secrets"] = list(self.state.session.secrets)
            # ended before the controller hears this worker is done: it then gives a worker 10 s to exit,
            # and a Ray cluster's end on a busy machine took longer (its folders were left to the next run)
            self.state.session.close()
            self.state.closed = True
            return result
        if session.exitstatus == pytest.ExitCode.INTERRUPTED and self.state.interrupted is None:
            self.state.interrupted = "SIGINT"
        self._record_interrupted()
        try:
            self._write_report()
        except OSError as exc:  # the report folder full, read-only or replaced mid-run: one line, never a traceback
            where = exc.filename or self._report_path().parent
            self.write_error = (
                f"spotchaos could not write its report ({where}: {exc.strerror or exc}): the scenarios' "
                "own results are above; free or fix the report folder (--spotchaos-output) and run again"
            )
        except Exception as exc:  # the harness's own bug: an error, never a pass
            self.write_error = f"spotchaos could not write its report: {type(exc).__name__}: {exc}"
        if self.write_error is not None:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.leaks = self._scan_for_secrets()
        if self.leaks:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return result

    def _record_interrupted(self) -> None:
        """The scenarios a stop signal cut short: in the report as errors, never as passes."""
        state = self.state
        for records in state.in_flight.values():
            for record in records:
                note_error(record, f"interrupted ({state.interrupted or 'stopped'}) while this scenario ran")
                state.scenarios.append(redact(as_reported(record, outcome="interrupted"), state.secrets))
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
        state = self.state
        secrets = [
            *state.session.secrets,
            *state.worker_secrets,
            *(s for j in selected_jobs(state) for s in j.secrets()),
        ]
        matcher = SecretMatcher(secrets, shapes=False)
        if not matcher.has_values:
            return []
        leaks = [str(f) for f in files if artifact_leaks(f, matcher)]
        runs = self.config.rootpath / self.state.options.output / "runs"
        return sorted(leaks + [str(runs / name) for name in leaking_files(runs, matcher)])

    def _write_report(self) -> None:
        state = self.state
        jobs = selected_jobs(state)
        outcome = SessionOutcome(
            seed=state.options.seed,
            profile=state.options.profile,
            started=state.started,
            jobs=[j.describe() for j in jobs],
            scenarios=state.scenarios,
            secrets=list(state.secrets),
            containers=list(state.session.containers()),
            interrupted=state.interrupted,
            reaped=list(state.reaped),
        )
        document = build_report(self.config.rootpath, outcome)
        self.config.hook.pytest_spotchaos_report(config=self.config, report=document)
        self.path = write_json(document, self._report_path())
        markdown = render_markdown(document)
        write_text(markdown, self.path.with_name("report.md"))
        try:
            from ..report.html import render_html  # matplotlib: loaded when a report is written, not at pytest start
        except MissingExtra as exc:  # the core install: JSON and Markdown, and one line on what the page needs
            self.html_missing = str(exc)
        else:
            write_text(render_html(document), self.path.with_name("report.html"))
        history = state.options.history
        if state.scenarios and history is not None:  # a session that ran nothing is not worth comparing against
            self.saved = save_run(document, self.config.rootpath / history)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:  # GitHub Actions shows this file on the run's page
            with open(summary, "a") as f:
                f.write(markdown)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        tr.section("spotchaos")
        for s in self.state.scenarios:
            if is_service(s):  # in its own terms: the drain, on the figure lines below
                verdict = {"pass": "drained", "fail": "FAILED", "error": "ERROR"}[verdict_word(s)]
                tr.write_line(f"{verdict:9} {s['scenario']}")
            else:
                verdict = {"pass": "bit-exact", "fail": "FAILED", "error": "ERROR"}[verdict_word(s)]
                detail = f"failing plan {s['failing_plan']}" if s.get("failing_plan") else ""
                lost = lost_steps(s)
                line = f"{verdict:9} {s['scenario']}  plans={s['plans_tried']} lost_steps={lost} {detail}"
                tr.write_line(line.rstrip())
            for line in figure_lines(s.get("figures") or {}):
                tr.write_line(f"          {line}")
            for escaped in sorted({p for r in s["runs"] for p in r.get("escaped_processes") or []}):
                tr.write_line(visible(f"          warning: left the job's process group and was ended: {escaped}"))
        for job, cost in per_job(self.state.scenarios).items():
            tr.write_line(visible(cost_line(job, cost)))
        if self.state.interrupted is not None:
            tr.write_line(f"INTERRUPTED by {self.state.interrupted}: every job was ended; the report says so")
        if self.path is not None:
            beside = "report.md" if self.html_missing else "report.md, report.html"
            tr.write_line(f"report: {self.path} (and {beside} beside it)")
            if self.html_missing:
                tr.write_line(f"report.html not written: {self.html_missing}")
        if self.saved is not None:
            tr.write_line(
                f"saved as {self.saved} (compare runs with: spotchaos compare previous latest; "
                "--spotchaos-history=off saves none)"
            )
        if self.write_error is not None:
            tr.write_line(visible(f"ERROR: {self.write_error}"))
        if self.leaks:
            tr.write_line(
                f"FAILED: a secret (or 8 characters of one, or its encoding) appears in: {', '.join(self.leaks)}"
            )
        seed = self.state.options.seed
        tr.write_line(f"seed: {seed} (replay with --spotchaos-seed={seed})")

"""Scenarios as a user writes them: run a job under a plan, or let hypothesis search plans.

A :class:`ChaosRunner` lives for one test session. It runs the uninterrupted reference of each
job once and reuses it, gives every run a fresh working directory (removed when the run passes,
kept for a failure so its logs and checkpoints can be inspected), and records every scenario's
outcome for the report. It knows hypothesis but not pytest.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, Phase, given, reject
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from .advisor import advise
from .backends.docker import DockerBackend, DockerSession
from .config import JobSpec
from .cost import estimate
from .engine import FS_EVENTS, EngineOptions, read_fs_events, run_job
from .errors import JobError, SpotchaosError
from .overhead import measure_overhead, notice_flushes
from .plan import Plan, Preemption
from .presets import MTBF_PRESETS
from .probe import ENV_CHECKPOINT_URI
from .redact import find_leaks, redact
from .strategies import preemption_plans
from .trajectory import RunRecord
from .verdict import Verdict, judge

if TYPE_CHECKING:
    from .storage import Fault, S3Service

PlanSource = st.SearchStrategy[Plan] | Callable[[int], st.SearchStrategy[Plan]]


class ChaosFailure(AssertionError):
    """A plan under which the job did not resume bit-exact (or broke another verdict)."""

    def __init__(self, job: str, plan: Plan, verdict: Verdict, workdir: str) -> None:
        self.job, self.plan, self.verdict, self.workdir = job, plan, verdict, workdir
        super().__init__(
            f"job {job!r} under plan {plan}:\n{verdict.message()}\n  (logs and checkpoints kept in {workdir})"
        )


class DamageNotApplied(SpotchaosError):
    """A plan's checkpoint fault found nothing to damage (no durable checkpoint yet, say)."""


class BudgetFailure(AssertionError):
    """A time budget (checkpoint overhead, notice flush) was exceeded, or could not be measured."""


@dataclass
class ScenarioRecord:
    """What the report says of one scenario (one test, one job)."""

    scenario: str
    job: str
    seed: int | None
    passed: bool = True
    plans_tried: int = 0
    failing_plan: str | None = None
    verdict: dict[str, Any] | None = None
    error: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    reference: dict[str, Any] | None = None
    figures: dict[str, Any] = field(default_factory=dict)  # overhead, advice, cost, notice flush
    trajectory: dict[str, Any] | None = None  # the run shown in the plots: the failing one, else the last


@dataclass
class ExploreSettings:
    max_examples: int = 3
    seed: int | None = None


class ChaosRunner:
    def __init__(self, root: Path, *, workdir: Path | None = None, keep_passing: bool = False) -> None:
        self.root = root
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="spotchaos-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.keep_passing = keep_passing
        self._references: dict[str, RunRecord] = {}
        self._timing_runs: dict[str, RunRecord] = {}
        self._lock = threading.Lock()
        self._counter = 0
        self._docker: DockerSession | None = None  # started with the first container job
        self._s3: S3Service | None = None  # started with the first job that checkpoints to S3
        self._resources = contextlib.ExitStack()  # what close() stops: containers, the S3 server and its proxy

    def _next_dir(self, label: str) -> Path:
        with self._lock:
            self._counter += 1
            return self.workdir / f"{self._counter:04d}-{label}"

    def reference(self, job: JobSpec) -> RunRecord:
        """The uninterrupted run of ``job``, computed once per session and job configuration."""
        key = job.key()
        if key not in self._references:
            record = run_job(job, Plan(), self._next_dir(f"{job.name}-reference"), self._options(job))
            if not record.steps:
                raise SpotchaosError(f"job {job.name!r} reported no step in its uninterrupted run")
            self._references[key] = record
        return self._references[key]

    def _options(self, job: JobSpec, *, trace_fs: bool = False) -> EngineOptions:
        """The job's backend: its own container image, else a local process group."""
        backend = None
        if job.container is not None:
            with self._lock:
                if self._docker is None:
                    self._docker = DockerSession()  # DockerUnavailable: the plugin skips or fails
                    self._resources.callback(self._docker.close)
            backend = DockerBackend(self._docker, job.container)
        extra: tuple[tuple[str, str], ...] = ()
        if job.storage == "s3":
            extra = tuple(self.s3_run_environment().items())
        return EngineOptions(root=self.root, backend=backend, trace_fs=trace_fs, extra_env=extra)

    @property
    def s3(self) -> S3Service:
        """The harness's S3 (moto behind the fault proxy), started with the first S3 job; tests and
        scenarios add storage faults to it."""
        with self._lock:
            if self._s3 is None:
                from .storage import MotoS3, S3Service

                moto = self._resources.enter_context(MotoS3())
                self._s3 = self._resources.enter_context(S3Service(moto))
            return self._s3

    def s3_run_environment(self) -> dict[str, str]:
        """A fresh bucket for one run (the harness works on its own copies) and how to reach it."""
        service = self.s3
        bucket = f"spotchaos-{uuid.uuid4().hex[:12]}"
        service.client(direct=True).create_bucket(Bucket=bucket)
        return {**service.environment(), ENV_CHECKPOINT_URI: f"s3://{bucket}/ckpt"}

    def containers(self) -> list[dict[str, Any]]:
        """Images the session's containers ran (name, id, digests), for the report."""
        return list(self._docker.images.values()) if self._docker is not None else []

    def run(self, job: JobSpec, plan: Plan) -> tuple[RunRecord, Verdict]:
        reference = self.reference(job)
        workdir = self._next_dir(f"{job.name}-{len(plan.preemptions)}p")
        record = run_job(job, plan, workdir, self._options(job))
        verdict = judge(reference, record)
        if verdict.passed and not self.keep_passing:
            shutil.rmtree(workdir, ignore_errors=True)
        return record, verdict

    def check(self, job: JobSpec, plan: Plan, record: ScenarioRecord | None = None) -> Verdict:
        """Run one plan; raise :class:`ChaosFailure` unless every verdict holds."""
        run, verdict = self.run(job, plan)
        skipped = [a.damage for a in run.attempts if a.damage is not None and not a.damage.applied]
        if skipped:
            raise DamageNotApplied(
                f"job {job.name!r} under plan {plan}: {skipped[0].fault} could not be applied: {skipped[0].detail}"
            )
        if record is not None:
            _note(record, plan, run, verdict, self.reference(job))
        if not verdict.passed:
            raise ChaosFailure(job.name, plan, verdict, run.workdir)
        return verdict

    def explore(
        self,
        job: JobSpec,
        plans: PlanSource | None = None,
        *,
        settings: ExploreSettings | None = None,
        record: ScenarioRecord | None = None,
    ) -> int:
        """Let hypothesis search plans; on failure it shrinks to the smallest failing plan.

        Returns the number of plans tried. A :class:`SpotchaosError` (the job hung, crashed on
        its own, wrote garbage) stops the search at once instead of being shrunk.
        """
        settings = settings or ExploreSettings()
        total_steps = len(self.reference(job).steps)
        if plans is None:
            strategy = preemption_plans(total_steps)
        elif isinstance(plans, st.SearchStrategy):
            strategy = plans
        else:
            strategy = plans(total_steps)
        aborted: list[SpotchaosError] = []
        tried = 0

        def attempt(plan: Plan) -> None:
            nonlocal tried
            if aborted:
                return
            tried += 1
            try:
                self.check(job, plan, record)
            except DamageNotApplied:
                reject()  # nothing to damage at that step: not a verdict, try another plan
            except SpotchaosError as exc:
                aborted.append(exc)

        test = given(plan=strategy)(attempt)
        test = hypothesis_settings(
            max_examples=settings.max_examples,
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
        except Unsatisfiable:
            raise DamageNotApplied(
                f"job {job.name!r}: no plan could damage a checkpoint (does it report durable checkpoints "
                "with probe.checkpoint before the preemption steps tried?)"
            ) from None
        finally:
            if record is not None:
                record.plans_tried = tried
        if aborted:
            raise aborted[0]
        return tried

    def checkpoint_steps(self, job: JobSpec) -> list[int]:
        """Steps after which the uninterrupted run reported a durable checkpoint."""
        return [e["step"] for e in self.reference(job).attempts[0].of_kind("checkpoint")]

    def trace(self, job: JobSpec, plan: Plan) -> tuple[RunRecord, list[list[dict[str, Any]]]]:
        """Run with every file-system event under the checkpoint directory logged, per attempt."""
        logs: list[list[dict[str, Any]]] = []

        def read_logs(record: RunRecord) -> None:
            workdir = Path(record.workdir)
            logs.extend(read_fs_events(workdir / f"attempt-{a.index}" / FS_EVENTS) for a in record.attempts)

        record = self._run_once(job, plan, "trace", self._options(job, trace_fs=True), read_logs)
        return record, logs

    def _run_once(self, job: JobSpec, plan: Plan, label: str, options: EngineOptions, inspect=None) -> RunRecord:
        """A run whose directory is only needed while ``inspect`` reads it (kept with keep_passing)."""
        record = run_job(job, plan, self._next_dir(f"{job.name}-{label}"), options)
        if inspect is not None:
            inspect(record)
        if not self.keep_passing:
            shutil.rmtree(record.workdir, ignore_errors=True)
        return record

    def save_boundaries(self, job: JobSpec) -> list[dict[str, Any]]:
        """Every file-system event of one checkpoint save of the uninterrupted run: the first save
        that also rotates an old checkpoint away, else the last save. Each is a crash point."""
        record, (log, *_) = self.trace(job, Plan())
        events = record.attempts[0].events
        windows = []
        last_step_t = None
        for event in events:
            if event["event"] == "step":
                last_step_t = event["t"]
            elif event["event"] == "checkpoint" and last_step_t is not None:
                windows.append([e for e in log if last_step_t < e["t"] <= event["t"]])
        if not windows:
            raise SpotchaosError(f"job {job.name!r} reported no checkpoint: there is no save to crash inside")
        rotating = [w for w in windows[1:] if any(e["event"] in ("shutil.rmtree", "os.remove") for e in w)]
        return rotating[0] if rotating else windows[-1]

    def resume_boundaries(self, job: JobSpec) -> tuple[Preemption, list[dict[str, Any]]]:
        """The reads of a restart that loads a checkpoint: hard kill half-way, then trace the resume."""
        steps = self.checkpoint_steps(job)
        if not steps:
            raise SpotchaosError(f"job {job.name!r} reported no checkpoint: there is no load to crash inside")
        kill = Preemption(min(steps[-1] + 1, len(self.reference(job).steps) - 2), "sigkill")
        record, logs = self.trace(job, Plan((kill,)))
        if len(logs) < 2:
            raise SpotchaosError(f"job {job.name!r} finished before {kill} could interrupt it")
        first_step = next((e["t"] for e in record.attempts[1].of_kind("step")), float("inf"))
        return kill, [e for e in logs[1] if e["event"] == "open-read" and e["t"] < first_step]

    def fresh_run(self, job: JobSpec) -> RunRecord:
        """One more uninterrupted run (the overhead scenario measures on it)."""
        return self._run_once(job, Plan(), "measure", self._options(job))

    def timing_run(self, job: JobSpec) -> RunRecord:
        """A run with one SIGTERM half-way, cached per job: notice flush and restart latency.

        It must itself pass every verdict; figures from a run that did not resume are meaningless.
        """
        key = job.key()
        if key not in self._timing_runs:
            middle = max(0, len(self.reference(job).steps) // 2 - 1)
            plan = Plan((Preemption(middle, "sigterm"),))
            record, verdict = self.run(job, plan)
            if not verdict.passed:
                raise ChaosFailure(job.name, plan, verdict, record.workdir)
            self._timing_runs[key] = record
        return self._timing_runs[key]

    def check_overhead(
        self,
        job: JobSpec,
        record: ScenarioRecord | None = None,
        measure: Callable[[Callable[[], RunRecord]], RunRecord] | None = None,
    ) -> dict[str, Any]:
        """Checkpoint overhead against ``job.overhead_budget``, plus interval advice and cost.

        ``measure`` wraps the measured run (the plugin passes pytest-benchmark's timer).
        """
        run = (measure or (lambda fn: fn()))(lambda: self.fresh_run(job))
        overhead = measure_overhead(run.attempts[0], job.overhead_budget)
        figures: dict[str, Any] = {"overhead": overhead.to_dict()}
        if overhead.fraction is not None:
            restarted = self.timing_run(job).attempts[-1]
            restart = restarted.ready_seconds or 0.0
            mtbf = job.mtbf_seconds or MTBF_PRESETS["typical"]
            interval = (overhead.interval_steps or 1) * (overhead.step_seconds or 0.0)
            advice = advise(
                checkpoint_seconds=overhead.checkpoint_seconds or 0.0,
                restart_seconds=restart,
                mtbf_seconds=mtbf,
                configured_interval=interval,
            )
            cost = estimate(
                inputs=job.cost,
                step_seconds=overhead.step_seconds or 0.0,
                steps_run=len(run.steps),
                checkpoint_seconds=overhead.checkpoint_seconds or 0.0,
                interval_seconds=interval,
                restart_seconds=restart,
                mtbf_seconds=mtbf,
                checkpoint_bytes=overhead.checkpoint_bytes or 0,
            )
            figures["advice"] = advice.to_dict()
            figures["advice"]["mtbf_source"] = "job" if job.mtbf_seconds else "preset 'typical' (assumed)"
            figures["cost"] = cost.to_dict()
        if record is not None:
            record.figures.update(figures)
            record.plans_tried = 1
        if not overhead.passed:
            if record is not None:
                record.passed = False
            raise BudgetFailure(f"job {job.name!r}: {overhead.message()}")
        return figures

    def check_notice_flush(self, job: JobSpec, record: ScenarioRecord | None = None) -> None:
        """SIGTERM to durable checkpoint must take at most half the grace window."""
        flushes = notice_flushes(self.timing_run(job))
        if record is not None:
            record.figures["notice_flush"] = [f.to_dict() for f in flushes]
            record.plans_tried = 1
        failed = [f for f in flushes if not f.passed]
        if failed or not flushes:
            if record is not None:
                record.passed = False
            detail = "; ".join(f.message() for f in failed) or "no notice was delivered"
            raise BudgetFailure(f"job {job.name!r}: {detail}")

    def check_storage_refusal(self, job: JobSpec, fault: Fault, record: ScenarioRecord | None = None) -> dict[str, Any]:
        """S3 refuses the restarted job (bad, expiring or read-only credentials): it must end with a
        non-zero exit and a message naming the problem, change no checkpoint object that existed
        before, and show the run's secret nowhere in what the harness captured.

        The run: hard kill after the first checkpoint; ``fault`` on before the restart; the restart
        must fail. Returns the figures for the report.
        """
        if job.storage != "s3":
            raise SpotchaosError(f'job {job.name!r} does not checkpoint to S3 (storage = "s3")')
        steps = self.checkpoint_steps(job)
        if not steps:
            raise SpotchaosError(f"job {job.name!r} reported no checkpoint: nothing to refuse")
        options = self._options(job)
        env = dict(options.extra_env)
        bucket = env[ENV_CHECKPOINT_URI].removeprefix("s3://").split("/")[0]
        service = self.s3
        secret = env["AWS_SECRET_ACCESS_KEY"]
        before: dict[str, str] = {}

        def refuse(index: int) -> None:
            before.update(service.object_digests(bucket))
            fault.enabled = True
            service.add(fault)

        fault.enabled = False
        options = EngineOptions(
            root=options.root, backend=options.backend, extra_env=options.extra_env, before_restart=refuse
        )
        workdir = self._next_dir(f"{job.name}-refused")
        problems: list[str] = []
        message = ""
        try:
            run_job(job, Plan((Preemption(steps[0] + 1, "sigkill"),)), workdir, options)
            problems.append(f"the restarted job finished although S3 answered {fault.name}: did it checkpoint at all?")
        except JobError as exc:
            message = str(exc)
        finally:
            fault.enabled = False
        after = service.object_digests(bucket)
        changed = sorted(k for k in before if after.get(k) != before[k])
        if changed:
            problems.append(f"checkpoint objects that existed before changed or vanished: {', '.join(changed[:5])}")
        captured = {
            str(p.relative_to(workdir)): p.read_text(errors="replace")
            for p in workdir.rglob("*")
            if p.is_file() and p.suffix in (".log", ".jsonl")
        }
        captured["the harness's message"] = message
        leaks = find_leaks(captured, secret)
        if leaks:
            problems.append(f"the run's secret (or its first 8 characters) appears in: {', '.join(leaks)}")
        if message and " with status " not in message:
            problems.append(f"the job did not end with a non-zero exit: {message.splitlines()[0]}")
        figures = {
            "fault": fault.name,
            "job_message": redact(message, [secret]),
            "objects_before": len(before),
            "objects_changed": changed,
            "leaks": leaks,
            "passed": not problems,
        }
        if record is not None:
            record.figures.setdefault("storage", []).append(figures)
            record.plans_tried += 1
        if problems:
            if record is not None:
                record.passed = False
            raise BudgetFailure(f"job {job.name!r} under {fault.name}: " + "; ".join(problems))
        if not self.keep_passing:
            shutil.rmtree(workdir, ignore_errors=True)
        return figures

    def close(self) -> None:
        """Remove what passed; keep the session's directory only if a failure left something in it."""
        self._resources.close()  # containers, the S3 proxy and server
        self._docker = self._s3 = None
        if not self.keep_passing:
            for reference in self._references.values():
                shutil.rmtree(reference.workdir, ignore_errors=True)
        if self.workdir.exists() and not any(self.workdir.iterdir()):
            self.workdir.rmdir()


def _note(record: ScenarioRecord, plan: Plan, run: RunRecord, verdict: Verdict, reference: RunRecord) -> None:
    summary = {
        "plan": str(plan),
        "passed": verdict.passed,
        "wall_seconds": round(run.wall_seconds, 3),
        "attempts": len(run.attempts),
        "lost_steps": verdict.lost_steps,
        "faults": [f.__dict__ for f in run.faults],
        "damage": [asdict(d) for d in verdict.damage],  # each checkpoint fault and what the job did
        "restart_seconds": [a.start_seconds for a in run.attempts[1:]],
        "memory": run.memory_peaks(),
    }
    record.runs.append(summary)
    if record.reference is None:
        record.reference = {
            "wall_seconds": round(reference.wall_seconds, 3),
            "steps": len(reference.steps),
            "start_seconds": reference.attempts[0].start_seconds,
            "memory": reference.memory_peaks(),
        }
    if record.passed or not verdict.passed:  # the plots show the last failing run (the minimal plan), else the last
        record.trajectory = {
            "plan": str(plan),
            "reference": [[step, loss] for _, step, loss in reference.series()["points"]],
            **run.series(),
        }
    if not verdict.passed:
        record.passed = False
        record.failing_plan = str(plan)  # hypothesis runs the minimal plan last
        record.verdict = verdict.to_dict()
    elif record.passed:
        record.verdict = verdict.to_dict()

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
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from .errors import ConfigError, JobError, ScenarioFailure, SpotchaosError
from .overhead import checkpoint_blocking, measure_overhead, notice_flushes
from .plan import Plan, Preemption
from .presets import MTBF_PRESETS
from .probe import ENV_CHECKPOINT_URI
from .redact import find_leaks, redact
from .safefs import captured_logs
from .strategies import preemption_plans
from .trajectory import RunRecord
from .verdict import Verdict, judge

if TYPE_CHECKING:
    from .storage import CredentialSwap, Fault, S3Service

PlanSource = st.SearchStrategy[Plan] | Callable[[int], st.SearchStrategy[Plan]]


class ChaosFailure(ScenarioFailure):
    """A plan under which the job did not resume bit-exact (or broke another verdict)."""

    def __init__(self, job: str, plan: Plan, verdict: Verdict, workdir: str) -> None:
        self.job, self.plan, self.verdict, self.workdir = job, plan, verdict, workdir
        super().__init__(
            f"job {job!r} under plan {plan}:\n{verdict.message()}\n  (logs and checkpoints kept in {workdir})"
        )


class DamageNotApplied(SpotchaosError):
    """A plan's checkpoint fault found nothing to damage (no durable checkpoint yet, say)."""


class BudgetFailure(ScenarioFailure):
    """A time budget (checkpoint overhead, notice flush) was exceeded, or could not be measured."""


class StorageFailure(ScenarioFailure):
    """Under a storage fault the job lost a checkpoint, blocked too long, failed unclearly or leaked
    its secret."""


TORN_HINT = (
    "An interrupted upload must never become the checkpoint a restart loads: upload the data objects "
    "first, then the manifest, then the latest pointer, and resume from the newest checkpoint whose "
    "manifest verifies."
)
RNG_HINT = (
    "The loss changed before any preemption: the storage retries drew from the training's random numbers "
    "(botocore's retry jitter calls Python's global random.random). Keep I/O away from the training RNG: "
    "save and restore random.getstate() around storage calls, or give the augmentation a random.Random of its own."
)
UPLOAD_SECONDS = 1.0  # how long the slowed upload of one checkpoint takes when a kill is aimed inside it
TORN_AFTER_BYTES = 1024  # the kill waits for an upload this far along: a pointer or a manifest is smaller
STORAGE_HINT = (
    "A storage error during a checkpoint must be retried (boto3's standard retry mode) or the checkpoint "
    "given up within the budget and reported (probe.checkpoint_failed) while training goes on; it must "
    "never end the job nor become the checkpoint a restart loads."
)


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
    """The scenarios of one session, outside pytest as inside it (the plugin's fixture wraps one).

    ``with Session(".") as session: session.check(job, "sigterm@5")`` — the context manager owns
    every resource the session starts (containers, the S3 server and its proxy) and removes the
    working directories of passing runs when it closes.
    """

    def __init__(self, root: Path | str, *, workdir: Path | None = None, keep_passing: bool = False) -> None:
        root = Path(root)
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
        self.secrets: list[str] = []  # every S3 secret handed to a job: redacted and searched for in the output

    def _next_dir(self, label: str) -> Path:
        with self._lock:
            self._counter += 1
            return self.workdir / f"{self._counter:04d}-{label}"

    def reference(self, job: JobSpec) -> RunRecord:
        """The uninterrupted run of ``job``, computed once per session and job configuration."""
        key = job.key()
        if key not in self._references:
            record = self._execute(job, Plan(), self._next_dir(f"{job.name}-reference"))
            if not record.steps:
                raise SpotchaosError(f"job {job.name!r} reported no step in its uninterrupted run")
            self._references[key] = record
        return self._references[key]

    def _backend(self, job: JobSpec) -> DockerBackend | None:
        """The job's backend: its own container image, else None (a local process group)."""
        if job.container is None:
            return None
        with self._lock:
            if self._docker is None:
                self._docker = DockerSession()  # DockerUnavailable: the plugin skips or fails
                self._resources.callback(self._docker.close)
        return DockerBackend(self._docker, job.container)

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

    @contextlib.contextmanager
    def _storage(self, job: JobSpec) -> Iterator[dict[str, str]]:
        """The run's storage environment. For S3: a fresh bucket (the harness works on its own
        copies) and an IAM user of the run's own, whose secret is unique to the run, with moto
        checking signatures and policies while the run lasts."""
        if job.storage != "s3":
            yield {}
            return
        service = self.s3
        with service.iam():
            credentials = service.issue()
            self.secrets.append(credentials.secret_key)
            bucket = f"spotchaos-{uuid.uuid4().hex[:12]}"
            service.client(direct=True).create_bucket(Bucket=bucket)
            yield {**service.environment(credentials), ENV_CHECKPOINT_URI: f"s3://{bucket}/ckpt"}

    def _execute(
        self,
        job: JobSpec,
        plan: Plan,
        workdir: Path,
        *,
        trace_fs: bool = False,
        storage_faults: Sequence[Fault] = (),
        before_restart: Callable[[int, Mapping[str, str]], Mapping[str, str] | None] | None = None,
        preempt_when: Callable[[], bool] | None = None,
    ) -> RunRecord:
        """One run of ``job`` under ``plan`` on its backend and storage; ``storage_faults`` are on
        for the whole run and removed after it; ``before_restart(index, storage_env)`` may swap
        variables for the restarts."""
        with self._storage(job) as storage_env:
            hook = None
            if before_restart is not None:

                def hook(index: int) -> Mapping[str, str] | None:
                    return before_restart(index, storage_env)

            options = EngineOptions(
                root=self.root,
                backend=self._backend(job),
                trace_fs=trace_fs,
                extra_env=tuple(storage_env.items()),
                before_restart=hook,
                preempt_when=preempt_when,
            )
            with contextlib.ExitStack() as added:
                for fault in storage_faults:
                    self.s3.add(fault)
                    added.callback(self.s3.remove, fault)
                return run_job(job, plan, workdir, options)

    def containers(self) -> list[dict[str, Any]]:
        """Images the session's containers ran (name, id, digests), for the report."""
        return list(self._docker.images.values()) if self._docker is not None else []

    def run(self, job: JobSpec, plan: Plan) -> tuple[RunRecord, Verdict]:
        reference = self.reference(job)
        workdir = self._next_dir(f"{job.name}-{len(plan.preemptions)}p")
        record = self._execute(job, plan, workdir)
        verdict = judge(reference, record)
        if verdict.passed and not self.keep_passing:
            shutil.rmtree(workdir, ignore_errors=True)
        return record, verdict

    def check(self, job: JobSpec, plan: Plan | str, record: ScenarioRecord | None = None) -> Verdict:
        """Run one plan (a :class:`Plan` or ``"sigterm@5,sigkill@12"``); raise :class:`ChaosFailure`
        unless every verdict holds."""
        plan = Plan.parse(plan) if isinstance(plan, str) else plan
        if not plan.preemptions:
            raise ConfigError(f"job {job.name!r}: an empty plan preempts nothing; give at least one FAULT@STEP")
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
            except ScenarioFailure:
                raise  # a verdict: hypothesis shrinks it to the smallest failing plan
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

        record = self._run_once(job, plan, "trace", read_logs, trace_fs=True)
        return record, logs

    def _run_once(self, job: JobSpec, plan: Plan, label: str, inspect=None, *, trace_fs: bool = False) -> RunRecord:
        """A run whose directory is only needed while ``inspect`` reads it (kept with keep_passing)."""
        record = self._execute(job, plan, self._next_dir(f"{job.name}-{label}"), trace_fs=trace_fs)
        if inspect is not None:
            inspect(record)
        if not self.keep_passing:
            shutil.rmtree(record.workdir, ignore_errors=True)
        return record

    def save_boundaries(self, job: JobSpec) -> list[dict[str, Any]]:
        """Every file-system event of one checkpoint save of the uninterrupted run: the first save
        that also rotates an old checkpoint away, else the last save. Each is a crash point.

        A save's window runs from the step before it to the step after it, not to its
        ``checkpoint`` event: a trainer may finish work in the background once the checkpoint
        is durable (the reference unlinks rotated checkpoints so), and a crash there counts too.
        """
        record, (log, *_) = self.trace(job, Plan())
        events = record.attempts[0].events
        windows = []
        last_step_t = None
        for index, event in enumerate(events):
            if event["event"] == "step":
                last_step_t = event["t"]
            elif event["event"] == "checkpoint" and last_step_t is not None:
                after = (e["t"] for e in events[index + 1 :] if e["event"] == "step")
                next_step_t = next(after, float("inf"))
                windows.append([e for e in log if last_step_t < e["t"] < next_step_t])
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
        return self._run_once(job, Plan(), "measure")

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

    def _require_s3(self, job: JobSpec) -> None:
        if job.storage != "s3":
            raise SpotchaosError(f'job {job.name!r} does not checkpoint to S3: add storage = "s3" to it')

    def check_storage(
        self, job: JobSpec, plan: Plan | str, faults: Sequence[Fault], record: ScenarioRecord | None = None
    ) -> dict[str, Any]:
        """Run ``plan`` with storage ``faults`` on for the whole run (a SlowDown storm, resets
        mid-upload): every verdict must hold, and no checkpoint may hold training up longer than
        ``job.checkpoint_budget_seconds``; a checkpoint the job gives up and reports
        (``probe.checkpoint_failed``) is allowed. A fault that never acted fails the scenario as
        meaningless rather than letting it pass."""
        self._require_s3(job)
        plan = Plan.parse(plan) if isinstance(plan, str) else plan
        reference = self.reference(job)
        proxy = self.s3.proxy
        before = dict(proxy.injected)
        workdir = self._next_dir(f"{job.name}-storage")
        names = ", ".join(f.name for f in faults)
        try:
            run = self._execute(job, plan, workdir, storage_faults=faults)
        except JobError as exc:
            figures = {"scenario": "storage faults", "faults": names, "plan": str(plan)}
            problems = [str(exc), STORAGE_HINT, *_leak_problems(_captured(workdir), self.secrets)]
            _storage_verdict(record, figures, problems, f"job {job.name!r} under {names} ({plan}): ")
            raise  # not reached: the problems above are never empty
        acted = {f.name: proxy.injected.get(f.name, 0) - before.get(f.name, 0) for f in faults}
        idle = [name for name, count in acted.items() if not count]
        if idle:
            raise SpotchaosError(
                f"job {job.name!r}: {', '.join(idle)} never acted: the job made no S3 request it applies to "
                "(does it checkpoint through AWS_ENDPOINT_URL?)"
            )
        verdict = judge(reference, run)
        budget = job.checkpoint_budget_seconds
        blocking = checkpoint_blocking(run, unexplained_over=budget)
        problems = [] if verdict.passed else [verdict.message()]
        divergence = verdict.first_divergence
        if divergence is not None and divergence.resumed_from is None:
            problems.append(RNG_HINT)
        for item in blocking:
            if item["seconds"] > budget:
                what = {"durable": "the checkpoint", "given up": "the abandoned checkpoint"}.get(item["outcome"])
                what = what or "an unreported pause (no checkpoint event)"
                problems.append(
                    f"{what} after step {item['step']} held training up for {item['seconds']:.1f} s, over the "
                    f"checkpoint budget of {budget:g} s (checkpoint_budget_seconds)"
                )
        if problems:
            problems.append(STORAGE_HINT)
        figures = {
            "scenario": "storage faults",
            "faults": names,
            "plan": str(plan),
            "acted": acted,
            "checkpoints": blocking,
            "budget_seconds": budget,
        }
        return self._storage_outcome(job, record, plan, run, verdict, reference, figures, problems, names)

    def check_upload_preemption(self, job: JobSpec, record: ScenarioRecord | None = None) -> dict[str, Any]:
        """Kill the job while a checkpoint is uploading (its uploads slowed to take about
        ``UPLOAD_SECONDS``; the kill waits for the step that starts the second checkpoint and for an
        object upload part-way through): the previous checkpoint must stay the newest valid one,
        and the restart must resume from it bit-exact."""
        self._require_s3(job)
        reference = self.reference(job)
        saves = reference.attempts[0].of_kind("checkpoint")
        if len(saves) < 2:
            raise SpotchaosError(f"job {job.name!r} made fewer than 2 checkpoints: none would be left to resume from")
        torn, size = saves[1]["step"], saves[1]["bytes"]
        rate = max(size / UPLOAD_SECONDS, 1024.0)
        plan = Plan((Preemption(torn, "sigkill"),))
        from .storage import Bandwidth

        workdir = self._next_dir(f"{job.name}-torn-upload")
        try:
            run = self._execute(
                job,
                plan,
                workdir,
                storage_faults=[Bandwidth(rate, downloads=False)],
                preempt_when=lambda: self.s3.proxy.uploading(at_least=TORN_AFTER_BYTES),  # inside a data upload
            )
        except JobError as exc:
            figures = {"scenario": "preempted during a slow upload", "plan": str(plan), "torn_step": torn}
            problems = [f"killed while the checkpoint after step {torn} was uploading: {exc}", TORN_HINT]
            problems += _leak_problems(_captured(workdir), self.secrets)
            _storage_verdict(record, figures, problems, f"job {job.name!r}: ")
            raise  # not reached: the problems above are never empty
        if torn in [e["step"] for e in run.attempts[0].of_kind("checkpoint")]:
            raise SpotchaosError(
                f"job {job.name!r}: the checkpoint after step {torn} finished uploading before the kill "
                f"({size} bytes at {rate:.0f} B/s): nothing was torn, the scenario proves nothing"
            )
        verdict = judge(reference, run)
        problems = []
        if not verdict.passed:
            problems = [
                f"killed while the checkpoint after step {torn} was uploading: {verdict.message()}",
                TORN_HINT,
            ]
        resumed = [e["from_step"] for a in run.attempts[1:] for e in a.of_kind("resume")]
        figures = {
            "scenario": "preempted during a slow upload",
            "faults": f"bandwidth {rate:.0f} B/s + sigkill@{torn}",
            "plan": str(plan),
            "torn_step": torn,
            "resumed_from": resumed,
        }
        return self._storage_outcome(job, record, plan, run, verdict, reference, figures, problems, "a slow upload")

    def _storage_outcome(self, job, record, plan, run, verdict, reference, figures, problems, names) -> dict[str, Any]:
        problems = [*problems, *_leak_problems(_captured(run.workdir), self.secrets)]
        if record is not None:
            _note(record, plan, run, verdict, reference)
        _storage_verdict(record, figures, problems, f"job {job.name!r} under {names}: ")
        if not self.keep_passing:
            shutil.rmtree(run.workdir, ignore_errors=True)
        return figures

    def check_storage_refusal(
        self, job: JobSpec, fault: Fault | CredentialSwap, record: ScenarioRecord | None = None
    ) -> dict[str, Any]:
        """S3 refuses the restarted job (a key it never issued, a read-only key, a token that
        expires): it must end with a non-zero exit and a message naming the problem, change no
        checkpoint object that existed when the refusals began, and show no secret anywhere the
        harness captured.

        The run: hard kill after the first checkpoint; then ``fault`` on (a proxy fault) or the
        restart handed other credentials (a :class:`CredentialSwap`, refused by moto's own IAM);
        the restart must fail. Returns the figures for the report.
        """
        from .storage import CredentialSwap

        self._require_s3(job)
        steps = self.checkpoint_steps(job)
        if not steps:
            raise SpotchaosError(f"job {job.name!r} reported no checkpoint: nothing to refuse")
        service = self.s3
        buckets: list[str] = []
        before: dict[str, str] = {}  # object key -> sha256 when the refusals began
        secrets: list[str] = []

        def evidence() -> None:
            before.clear()
            before.update(service.object_digests(buckets[0]))

        def refuse(index: int, storage_env: Mapping[str, str]) -> Mapping[str, str] | None:
            buckets.append(storage_env[ENV_CHECKPOINT_URI].removeprefix("s3://").split("/")[0])
            secrets.append(storage_env["AWS_SECRET_ACCESS_KEY"])
            evidence()
            if isinstance(fault, CredentialSwap):  # the swapped key cannot write: the state now is the evidence
                swapped = fault.credentials(service)
                secrets.append(swapped.secret_key)
                self.secrets.append(swapped.secret_key)
                return {"AWS_ACCESS_KEY_ID": swapped.access_key, "AWS_SECRET_ACCESS_KEY": swapped.secret_key}
            # a token expiring mid-run: what the restart wrote before it expired is legitimate
            service.proxy.on_first_action(fault, evidence)
            fault.enabled = True
            service.add(fault)
            return None

        if not isinstance(fault, CredentialSwap):
            fault.enabled = False
        workdir = self._next_dir(f"{job.name}-refused")
        problems: list[str] = []
        message = ""
        try:
            self._execute(job, Plan((Preemption(steps[0] + 1, "sigkill"),)), workdir, before_restart=refuse)
            problems.append(f"the restarted job finished although S3 refused it ({fault.name}): did it checkpoint?")
        except JobError as exc:
            message = str(exc)
        finally:
            if not isinstance(fault, CredentialSwap):
                fault.enabled = False
                service.remove(fault)
        after = service.object_digests(buckets[0]) if buckets else {}
        changed = sorted(k for k in before if after.get(k) != before[k])
        if changed:
            problems.append(f"checkpoint objects that existed before changed or vanished: {', '.join(changed[:5])}")
        captured = _captured(workdir)
        captured["the harness's message"] = message
        leaks = _leaks(captured, secrets)
        problems += _leak_problem(leaks)
        if message and " with status " not in message:
            problems.append(f"the job did not end with a non-zero exit: {message.splitlines()[0]}")
        figures = {
            "scenario": "credentials refused",
            "fault": fault.name,
            "job_message": redact(message, secrets),
            "objects_before": len(before),
            "objects_changed": changed,
            "leaks": leaks,
        }
        if record is not None:
            record.plans_tried += 1
        _storage_verdict(record, figures, problems, f"job {job.name!r} under {fault.name}: ", joiner="; ")
        if not self.keep_passing:
            shutil.rmtree(workdir, ignore_errors=True)
        return figures

    def __enter__(self) -> ChaosRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove what passed; keep the session's directory only if a failure left something in it."""
        self._resources.close()  # containers, the S3 proxy and server
        self._docker = self._s3 = None
        if not self.keep_passing:
            for reference in self._references.values():
                shutil.rmtree(reference.workdir, ignore_errors=True)
        if self.workdir.exists() and not any(self.workdir.iterdir()):
            self.workdir.rmdir()


def _captured(workdir: Path | str) -> dict[str, str]:
    """What the harness captured of a run, by name: every attempt's stdout, stderr and events
    (regular files only, bounded: the job wrote them)."""
    return captured_logs(Path(workdir))


def _leaks(captured: dict[str, str], secrets: Sequence[str]) -> list[str]:
    """Names of the captured texts holding a leaked window (or encoding) of any of ``secrets``."""
    return find_leaks(captured, secrets)


def _leak_problems(captured: dict[str, str], secrets: Sequence[str]) -> list[str]:
    return _leak_problem(_leaks(captured, secrets))


def _leak_problem(leaks: list[str]) -> list[str]:
    return (
        [f"the run's secret (or 8 characters of it, or its encoding) appears in: {', '.join(leaks)}"] if leaks else []
    )


def _storage_verdict(
    record: ScenarioRecord | None, figures: dict[str, Any], problems: list[str], prefix: str, joiner: str = " "
) -> None:
    """Record a storage scenario's figures (with its problems, for the report) and fail on any."""
    figures["passed"] = not problems
    if problems:
        figures["problems"] = problems
    if record is not None:
        record.figures.setdefault("storage", []).append(figures)
        record.passed = record.passed and not problems
    if problems:
        raise StorageFailure(prefix + joiner.join(problems))


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
        # processes that left the job's process group (setsid, a double fork), found by the run's marker and ended
        "escaped_processes": [p for a in run.attempts for p in a.escaped],
        "not_reached": run.not_reached,  # planned faults whose attempt never started: training was already done
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


Session = ChaosRunner  # the public name: from spotchaos import Session

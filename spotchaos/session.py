"""The small core every scenario family stands on: one session's runs, their resources, the references.

A :class:`SessionCore` runs a job under a plan on the job's backend and storage, gives every run
a fresh working directory (removed when the run passes, kept for a failure so its logs and
checkpoints can be inspected), computes each job's uninterrupted reference once, and owns what
it starts (containers, the S3 server and its fault proxy): leaving the context manager, or
``close()``, stops them all. The families (``spotchaos.families``) add scenarios on top of it;
none of them grows it. It knows neither pytest nor hypothesis.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .backends import SubprocessBackend
from .backends.docker import DockerBackend, DockerSession
from .config.container import ContainerSpec
from .config.jobs import JobSpec, load_settings
from .errors import NotDeterministic, SpotchaosError
from .faults.plan import Plan
from .host.gpu_leases import GpuPool
from .host.warm.pool import WarmStarts
from .record import note_cached_reference, note_cost, note_harness
from .safety.redact import leak_failure
from .training.determinism import HINT, Audit, Envelope
from .training.determinism import audit as audit_runs
from .training.engine.options import EngineOptions
from .training.engine.run import run_job
from .training.judgement import compares_state, judge_run, state_difference, weights_distance
from .training.logadapter import StepConvention, convention_from_dict
from .training.reference.cache import Cached, ReferenceCache, reference_difference
from .training.reference.prefix import Prefix, Prefixes, Snapshots, held_key, snapshots_dir
from .training.reference.prefix import why_not as why_no_prefix
from .training.shortcuts import Judged, Shortcuts, slow, used_by
from .training.state.diff import StateDifference
from .training.state.kept import KeptCopies, kept_dir
from .training.trajectory import RunRecord
from .training.verdict import Verdict

if TYPE_CHECKING:
    from .storage import Fault, S3Service
    from .storage.per_run import SessionS3

log = logging.getLogger("spotchaos")
RestartHook = Callable[[int, Mapping[str, str]], Mapping[str, str] | None]

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Entry:
    """How the ``spotchaos`` fixture offers a Session method: a *scenario* runs inside a record
    for the report (``plans``: how many plans it counts up front, None when it counts its own),
    a *query* is handed over as it is (a reference run, crash points)."""

    scenario: bool
    plans: int | None = None


def scenario(plans: int | None = None) -> Callable[[_F], _F]:
    """Mark a Session method as a scenario entry point; the fixture records it for the report."""

    def mark(method: _F) -> _F:
        method.__spotchaos_entry__ = Entry(scenario=True, plans=plans)
        return method

    return mark


def query(method: _F) -> _F:
    """Mark a Session method the fixture hands over unchanged (it judges nothing)."""
    method.__spotchaos_entry__ = Entry(scenario=False)
    return method


def entry_of(method: object) -> Entry | None:
    """How the fixture offers ``method``: None when it is no entry point."""
    return getattr(method, "__spotchaos_entry__", None)


def _audit_key(job: JobSpec) -> str:
    return f"{held_key(job)}x{job.uninterrupted_runs}"  # the same reference serves any number of runs


class SessionCore:
    """Runs, references and resources of one session (see the module's docstring)."""

    def __init__(self, root: Path | str, *, workdir: Path | None = None, keep_passing: bool = False, **share: int):
        self.root = Path(root)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="spotchaos-"))
        if not self.workdir.exists():  # the job's checkpoints are kept below it: no other local user reads them
            self.workdir.mkdir(parents=True, mode=0o700)
        self.keep_passing = keep_passing
        self.cache: dict[tuple[str, str], Any] = {}  # (what, job key) -> a run a family measures on, once
        self._references: dict[str, RunRecord] = {}
        self._conventions: dict[str, StepConvention] = {}  # job key -> how its log-adapter script counts
        self._audits: dict[str, Audit] = {}  # job key -> what its repeated uninterrupted runs showed
        self._lock = threading.Lock()
        self._counter = 0
        self._docker: DockerSession | None = None  # started with the first container job
        self._s3: SessionS3 | None = None  # started with the first job that checkpoints to S3
        self._resources = contextlib.ExitStack()  # what close() stops: containers, the S3 server and its proxy
        self.secrets: list[str] = []  # every S3 secret handed to a job: redacted and searched for in the output
        self._gpus: GpuPool | None = None  # the machine's GPUs, found with the first job that needs one
        self._ray: Any = None  # the Ray cluster (RayCluster), started or joined with the first Ray job
        self.ray_address: str | None = None  # --spotchaos-ray-address: the user's cluster, not a local one
        # what runs share (``warm``, ``prefix``: both on unless False): the jobs' warm interpreters,
        # and the copies of each reference's checkpoint folder a plan may start from
        self.warm_starts = self._resources.enter_context(WarmStarts()) if share.get("warm", True) else None
        self.prefixes = Prefixes(share.get("prefix", True))
        self.shortcuts = Shortcuts(audit=int(share.get("audit", 0)))  # reused passes, disagreements, audits
        self.kept = KeptCopies()  # the checkpoints kept for the state diff: one budget, identical files once
        self.reference_cache: ReferenceCache | None = None  # references kept across sessions: the caller's
        self._from_cache: set[str] = set()  # jobs whose reference came from it, and no failed run questioned yet
        self._retired: list[RunRecord] = []  # references a fresh one replaced: removed at close
        self._reference_lock = threading.Lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def next_dir(self, label: str) -> Path:
        """A fresh, numbered working directory for one run."""
        with self._lock:
            self._counter += 1
            return self.workdir / f"{self._counter:04d}-{label}"

    @query
    def reference(self, job: JobSpec) -> RunRecord:
        """The uninterrupted run of ``job``, computed once per session and job configuration (or
        read from the reference cache, where the session has one and the job is unchanged)."""
        key = held_key(job)
        if key not in self._references:
            self._references[key] = _cached_or_trained(self, job)
        if job.uninterrupted_runs > 1 and _audit_key(job) not in self._audits:
            self._audits[_audit_key(job)] = _audit(self, job, self._references[key])
        audit = self._audits.get(_audit_key(job))
        if audit is not None and not audit.reproducible and job.exactness == "bit":
            raise NotDeterministic(
                f"job {job.name!r} is not deterministic without any preemption: {audit.text()}; no resume can be "
                f"judged bit for bit. Hint: {HINT}"
            )
        return self._references[key]

    def audit(self, job: JobSpec) -> Audit | None:
        """What the job's repeated uninterrupted runs showed (None with determinism_runs = 1)."""
        with contextlib.suppress(NotDeterministic):
            self.reference(job)
        return self._audits.get(_audit_key(job))

    def envelope(self, job: JobSpec) -> Envelope | None:
        """The tolerance of envelope mode (None in bit mode)."""
        if job.exactness != "envelope":
            return None
        self.reference(job)
        return Envelope(self._audits[_audit_key(job)], job.envelope_factor)

    @query
    def checkpoint_steps(self, job: JobSpec) -> list[int]:
        """Steps after which the uninterrupted run reported a durable checkpoint, each once (``saved_steps``)."""
        return self.reference(job).saved_steps

    def gpus(self) -> GpuPool:
        """The GPUs attempts lease: ``[tool.spotchaos] gpus`` of the session's project (or
        SPOTCHAOS_GPUS), else what nvidia-smi lists."""
        with self._lock:
            if self._gpus is None:
                self._gpus = GpuPool(load_settings(self.root / "pyproject.toml").gpus)
            return self._gpus

    def backend(self, job: JobSpec) -> Any:
        """The job's backend: its own container image, a Ray cluster, else None (a local process group)."""
        if job.launcher == "ray-train":  # the driver here, its workers on the cluster
            from .training.multirank.ray_train import RayTrainBackend

            return RayTrainBackend(self.ray_cluster(), SubprocessBackend(warm=self.warm_starts))
        if job.backend == "ray":
            from .backends.raycluster import RayBackend

            return RayBackend(self.ray_cluster(), job.ray_needs(), float(job.grace_seconds or 30.0))
        return None if job.container is None else self.docker_backend(job.container)

    def local_backend(self, job: JobSpec) -> Any:
        """The job's backend, and for a local job this session's own subprocess backend with its
        warm interpreters: what reads the job's checkpoints in its confinement forks from them too."""
        return self.backend(job) or SubprocessBackend(warm=self.warm_starts)

    def use_ray_cluster(self, cluster: Any) -> None:
        """Run this session's Ray jobs on ``cluster`` (an open RayCluster whose life the caller owns)."""
        self._ray = cluster

    def ray_cluster(self) -> Any:
        """The session's Ray cluster, opened on first use: the user's (``--spotchaos-ray-address``,
        ``[tool.spotchaos.ray] address``) or a local one of a head and worker nodes, ended with the session."""
        with self._lock:
            if self._ray is None:
                from .backends.raycluster import cluster_for

                cluster = cluster_for(load_settings(self.root / "pyproject.toml").ray, self.ray_address)
                self._ray = self._resources.enter_context(cluster)
            return self._ray

    def docker_backend(self, container: ContainerSpec) -> DockerBackend:
        """A backend for ``container`` on the session's Docker connection (opened on first use)."""
        with self._lock:
            if self._docker is None:
                self._docker = DockerSession()  # DockerUnavailable: the plugin skips or fails
                self._resources.callback(self._docker.close)
        return DockerBackend(self._docker, container)

    @property
    def s3(self) -> S3Service:
        """The harness's S3 (moto behind the fault proxy), started with the first S3 job; tests and
        scenarios add storage faults to it."""
        return self._session_s3().service

    def _session_s3(self) -> SessionS3:
        with self._lock:
            if self._s3 is None:
                from .storage.per_run import SessionS3  # moto and the proxy only for an S3 job

                self._s3 = SessionS3(self._resources, self.secrets)
            return self._s3

    @contextlib.contextmanager
    def _storage(self, job: JobSpec) -> Iterator[dict[str, str]]:
        """The run's storage environment: for S3, a bucket and an IAM user of the run's own."""
        if job.storage != "s3":
            yield {}
            return
        with self._session_s3().run_environment() as environment:
            yield environment

    def execute(
        self,
        job: JobSpec,
        plan: Plan,
        workdir: Path,
        *,
        trace_fs: bool = False,
        storage_faults: Sequence[Fault] = (),
        before_restart: RestartHook | None = None,
        preempt_when: Callable[[], bool] | None = None,
        learn: bool = False,
        judge_restarts: bool = False,
        keep_checkpoints: str = "",
        trace_rank: int | None = None,
        resume_nproc: int | None = None,
        snapshots: Snapshots | None = None,
        prefix: Prefix | None = None,
    ) -> RunRecord:
        """One run of ``job`` under ``plan`` on its backend and storage; ``storage_faults`` are on
        for the whole run and removed after it; ``before_restart(index, storage_env)`` may swap
        variables for the restarts. A log-adapter job's runs count steps the way its
        uninterrupted run taught (that run comes first, with ``learn``)."""
        convention = None
        if job.log is not None and not learn:
            if held_key(job) not in self._references:
                self.reference(job)  # not on every run: its audit's own runs come through here
            convention = self._conventions[held_key(job)]
        with self._storage(job) as storage_env:
            hook = None
            if before_restart is not None:

                def hook(index: int) -> Mapping[str, str] | None:
                    return before_restart(index, storage_env)

            options = EngineOptions(
                root=self.root,
                backend=self.backend(job),
                gpus=self.gpus() if job.gpu_request is not None else None,
                trace_fs=trace_fs,
                extra_env=tuple(storage_env.items()),
                before_restart=hook,
                preempt_when=preempt_when,
                convention=convention,
                judge_restarts=judge_restarts,
                trace_rank=trace_rank,
                resume_nproc=resume_nproc,
                # the reference starts cold, as a fresh process in production: its string hashes are its own
                warm=None if learn else self.warm_starts,
                # kept only where the state diff compares them (compares_state: not DCP shards)
                keep_checkpoints=keep_checkpoints if compares_state(job) else "",
                kept=self.kept,
                snapshots=snapshots,
                prefix=prefix,
            )
            with contextlib.ExitStack() as added:
                for fault in storage_faults:
                    self.s3.add(fault)
                    added.callback(self.s3.remove, fault)
                record = run_job(job, plan, workdir, options)
        reference = self._references.get(held_key(job))
        note_cost(record, len(reference.steps) if reference is not None else len(record.steps) if learn else None)
        return record

    def run(
        self, job: JobSpec, plan: Plan, *, prefix: bool = False, reuse: bool = False, defer: bool = False
    ) -> tuple[RunRecord, Verdict]:
        """Run ``plan`` and judge it (a passing run's folder goes); ``prefix``: from the reference's
        checkpoint before its first fault where it can; ``reuse``: a plan passed is not run again.
        A failure seen through a shortcut is judged again on the slow path (``training/shortcuts.py``);
        ``defer``: not yet, but when the caller ``settle``s it (a search, for the plan it reports)."""
        return _run_judged(self, job, plan, prefix=prefix, reuse=reuse, defer=defer)

    def settle(self, job: JobSpec, plan: Plan) -> tuple[RunRecord, Verdict] | None:
        """The slow path's verdict of a failure ``run`` deferred (None: none was)."""
        deferred = self.shortcuts.take_deferred(job, plan)
        return None if deferred is None else _slow_judged(self, job, plan, *deferred)

    def judged(self, job: JobSpec, plan: Plan, start: Prefix | None) -> Judged:
        """One run of ``plan`` from ``start`` (None: step 0), judged against the job's reference."""
        cached = held_key(job) in self._from_cache
        reference = self.reference(job)
        workdir = self.next_dir(f"{job.name}-{len(plan.preemptions)}p")
        record = self.execute(job, plan, workdir, judge_restarts=True, keep_checkpoints="resumed", prefix=start)
        judging = time.monotonic()
        verdict = judge_run(
            job,
            reference,
            record,
            envelope=self.envelope(job),
            backend=lambda: self.local_backend(job),
            root=self.root,
            leaked=lambda: self.leaks(job, record),
            noise=lambda: _state_noise(self, job),
        )
        note_harness(time.monotonic() - judging)
        if verdict.passed:
            self.discard(record)
        return Judged(record, verdict, used_by(record, start, cached))

    def secrets_of(self, job: JobSpec) -> list[str]:
        """What no output of ``job`` may show: its secret-named variables and every S3 secret handed out."""
        return [*job.secrets(), *self.secrets]

    def leaks(self, job: JobSpec, run: RunRecord) -> str | None:
        """A failure naming where a run's captured output shows a secret of its job, if it does."""
        environment = {**job.environment(), **dict(job.container.env if job.container else ())}
        return leak_failure(Path(run.workdir), self.secrets_of(job), environment)

    def run_once(
        self, job: JobSpec, plan: Plan, label: str, inspect: Callable[[RunRecord], None] | None = None, **options: Any
    ) -> RunRecord:
        """A run whose directory is only needed while ``inspect`` reads it."""
        record = self.execute(job, plan, self.next_dir(f"{job.name}-{label}"), **options)
        if inspect is not None:
            inspect(record)
        self.discard(record)
        return record

    def discard_dir(self, workdir: Path) -> None:
        """Remove a passing scenario's own directory (a service's logs), unless passing runs are kept."""
        if not self.keep_passing:
            shutil.rmtree(workdir, ignore_errors=True)

    def discard(self, run: RunRecord) -> None:
        """Remove a run's directory (and its kept checkpoints), unless passing runs are kept
        (--spotchaos-keep-runs)."""
        if not self.keep_passing:
            shutil.rmtree(run.workdir, ignore_errors=True)
            shutil.rmtree(kept_dir(run.workdir), ignore_errors=True)
            self.kept.forget(kept_dir(run.workdir))
            shutil.rmtree(snapshots_dir(run.workdir), ignore_errors=True)

    def containers(self) -> list[dict[str, Any]]:
        """Images the session's containers ran (name, id, digests), for the report."""
        return list(self._docker.images.values()) if self._docker is not None else []

    def close(self) -> None:
        """Stop what the session started; remove what passed; keep the session's directory only if
        a failure left something in it."""
        self._resources.close()  # containers, the S3 proxy and server, the warm interpreters
        self._docker = self._s3 = self.warm_starts = None
        for reference in [*self._references.values(), *self._retired]:
            self.discard(reference)
        if self.workdir.exists() and not any(self.workdir.iterdir()):
            self.workdir.rmdir()


def _run_judged(
    core: SessionCore, job: JobSpec, plan: Plan, *, prefix: bool, reuse: bool, defer: bool
) -> tuple[RunRecord, Verdict]:
    """A plan's verdict under the shortcuts' rule: a failure through a shortcut is judged again on the
    slow path, whose failure is the verdict; a slow pass is a disagreement, and fails too."""
    shortcuts = core.shortcuts
    if shortcuts.off(job):  # a shortcut disagreed with the slow path earlier this session
        prefix, runs_as = False, slow(job)
    else:
        runs_as = job
    if reuse and (ran := shortcuts.reused(job, plan, from_copy_ok=prefix)) is not None:
        return ran
    start = core.prefixes.start(job, plan, core.reference(job)) if prefix else None
    fast = core.judged(runs_as, plan, start)
    if not fast.verdict.passed and _stale_reference(core, job):  # judged against a stale cached reference: again
        core.discard(fast.record)
        start = core.prefixes.start(job, plan, core.reference(job)) if prefix else None
        fast = core.judged(runs_as, plan, start)
    if not fast.verdict.passed:
        if fast.used and not defer:
            return _slow_judged(core, job, plan, fast, start)
        if fast.used:  # a search's failure steers its shrinking; the plan it reports is settled
            shortcuts.defer(job, plan, fast, start)
        core.prefixes.failed(job, core.reference(job), plan, start, fast.verdict, fast.verdict)
        return fast.record, fast.verdict
    if fast.used and shortcuts.take_audit(job):  # --spotchaos-audit: a pass through a shortcut, proven slow
        slow_path = core.judged(slow(job), plan, None)
        if not slow_path.verdict.passed:
            result = shortcuts.disagreed(job, plan, fast, slow_path, audit=True)
            core.prefixes.failed(job, core.reference(job), plan, start, result.verdict, fast.verdict)
            return result.record, result.verdict
    if reuse:
        shortcuts.passed(job, plan, fast, start)
    return fast.record, fast.verdict


def _slow_judged(
    core: SessionCore, job: JobSpec, plan: Plan, fast: Judged, start: Prefix | None
) -> tuple[RunRecord, Verdict]:
    """A failure through a shortcut judged again on the slow path: the slow failure is the verdict;
    a slow pass is a disagreement (a failure too), unless the harness proves its copy changed."""
    slow_path = core.judged(slow(job), plan, None)
    why = start.changed() if start is not None else None
    if slow_path.verdict.passed and why is not None:
        result = core.shortcuts.explained(job, plan, fast, slow_path, why)
    elif slow_path.verdict.passed:
        result = core.shortcuts.disagreed(job, plan, fast, slow_path, audit=False)
    else:
        core.discard(fast.record)
        core.shortcuts.confirmed(job, plan)
        result = slow_path
    core.prefixes.failed(job, core.reference(job), plan, start, result.verdict, fast.verdict)
    return result.record, result.verdict


def _cached_or_trained(core: SessionCore, job: JobSpec, *, fresh: bool = False) -> RunRecord:
    """The reference from the cache, else trained (and then kept in the cache); ``fresh``: trained."""
    workdir = core.next_dir(f"{job.name}-reference")
    cache, said = core.reference_cache, ""
    if cache is not None and not fresh:
        found = cache.load(job, core.root, workdir, with_snapshots=core.prefixes.enabled)
        if isinstance(found, Cached):
            core.prefixes.cached(job, found.record, found.snapshots)
            found.record.cache = {"read": True, "said": found.said}
            core._from_cache.add(held_key(job))
            note_cached_reference()
            return found.record
        said = found
    snapshots = core.prefixes.open(job, workdir)
    # a job that may start from the reference's checkpoints logs its file-system events in it too: the
    # crash points of a save are read from them, not from one more uninterrupted run (families/crashpoints.py)
    traced = why_no_prefix(job) is None
    record = core.execute(
        job, Plan(), workdir, learn=True, keep_checkpoints="all", snapshots=snapshots, trace_fs=traced
    )
    if not record.steps:
        raise SpotchaosError(f"job {job.name!r} reported no step in its uninterrupted run")
    core.prefixes.taken(job, record, snapshots)
    if record.convention is not None:
        core._conventions[held_key(job)] = convention_from_dict(record.convention)
    if cache is not None:
        stored = cache.store(job, core.root, record, snapshots, core.secrets_of(job))
        record.cache = {"read": False, "said": f"{said}; {stored}" if said else stored}
    return record


def _stale_reference(core: SessionCore, job: JobSpec) -> bool:
    """A run of ``job`` failed while its reference came from the cache: train the reference again
    and compare. True when they differ (the cache was stale: the new one replaces it, and the
    run must be judged again); False when they agree or the reference was trained this session."""
    key = held_key(job)
    with core._reference_lock:
        if key not in core._from_cache:
            return False
        core._from_cache.discard(key)
        cached = core._references[key]
        fresh = _cached_or_trained(core, job, fresh=True)
        difference = reference_difference(cached, fresh)
        core._references[key] = fresh  # equal when no difference: the fresh one is confirmed
        core._retired.append(cached)  # a plan running beside this one may still read its copies
        if difference is None:
            fresh.cache = {**(fresh.cache or {}), "confirmed": "a run failed: the reference trained again matched"}
            return False
        said = f"the cached reference of {job.name!r} no longer matches the job ({difference}): recomputed"
        log.warning("spotchaos: %s", said)
        fresh.cache = {**(fresh.cache or {}), "recomputed": said}
        core.shortcuts.forget_job(job)  # passes judged against the stale one
        core.cache.pop(("state noise", job.key()), None)  # measured against it too
        return True


def _audit(core: SessionCore, job: JobSpec, reference: RunRecord) -> Audit:
    """The job's other uninterrupted runs, compared with the reference: its own noise."""
    runs = [reference]
    spread: dict[str, list[float]] = {}
    for index in range(2, job.uninterrupted_runs + 1):
        record = core.execute(job, Plan(), core.next_dir(f"{job.name}-uninterrupted-{index}"))
        runs.append(record)
        for name, distance in weights_distance(job, reference, record).items():
            spread[name] = [max(a, b) for a, b in zip(spread.get(name, [0.0, 0.0]), distance, strict=True)]
        core.discard(record)
    result = audit_runs(runs, spread)
    log.info("job %s: %s", job.name, result.text())
    # for the report: whether the job is bit-reproducible, the mode it is judged in, its envelope
    reference.audit = {**result.to_dict(), "exactness": job.exactness, "envelope_factor": job.envelope_factor}
    return result


_NOISE_LOCK = threading.Lock()  # plans judged in parallel wait for the one second run


def _state_noise(core: SessionCore, job: JobSpec) -> StateDifference | None:
    """How a second uninterrupted run's checkpoints differ from the reference's: run once per
    session and job, and only when a run's state differs (a failure's path, never a pass's)."""
    key = ("state noise", job.key())
    with _NOISE_LOCK:
        if key not in core.cache:
            record = core.execute(job, Plan(), core.next_dir(f"{job.name}-uninterrupted2"), keep_checkpoints="all")
            reference = core.reference(job)
            core.cache[key] = state_difference(
                job, reference, record, lambda: core.local_backend(job), core.root, uninterrupted=True
            )
            core.discard(record)
        return core.cache[key]

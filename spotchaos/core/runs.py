"""The small core every scenario family stands on: one session's runs.

:class:`Core` gives every run a fresh working directory (removed when the run passes, kept for a
failure so its logs and checkpoints can be inspected), runs a job under a plan through the
engine on the job's backend and storage, and judges it under the shortcuts' rule
(:mod:`.judging`). What the runs are judged against lives in :mod:`.references`, what they run on
in :mod:`.resources`; the core holds one of each and closes both. The families
(``spotchaos.families``) add scenarios on top of it; none of them grows it. It knows neither
pytest nor hypothesis.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.container import ContainerSpec
from ..config.jobs import JobSpec, Settings
from ..faults.plan import Plan
from ..host.gpu_leases import GpuPool
from ..record import note_cost, note_harness
from ..safety.redact import leak_failure
from ..training.determinism import Audit, Envelope
from ..training.engine.options import EngineOptions
from ..training.engine.run import run_job
from ..training.judgement import JudgeContext, compares_state, judge_run
from ..training.reference.cache import ReferenceCache
from ..training.reference.prefix import Prefix, Prefixes, snapshots_dir
from ..training.reference.tails import Tails
from ..training.shortcuts import Judged, Shortcuts, used_by, verdict_key
from ..training.state.kept import KeptCopies, kept_dir
from ..training.trajectory import RunRecord
from ..training.verdict import Verdict
from .entries import query
from .judging import NONE, Allowed, judged_until_fired, run_judged, slow_judged
from .references import References
from .resources import Resources

if TYPE_CHECKING:
    from ..backends.docker import DockerBackend
    from ..storage import Fault, S3Service

RestartHook = Callable[[int, Mapping[str, str]], Mapping[str, str] | None]


@dataclass(frozen=True)
class StorageChaos:
    """What a run's storage does to it: ``faults`` on for the whole run and removed after it;
    ``before_restart(index, storage_env)`` may swap the variables the restarts get (credentials
    refused, a token expired)."""

    faults: Sequence[Fault] = ()
    before_restart: RestartHook | None = None


CALM = StorageChaos()


@dataclass(frozen=True)
class CoreOptions:
    """How a session runs, fixed when it starts (the plugin's options, or the Python API's keywords).

    ``warm``, ``prefix``, ``tails``: whether runs may fork from warm interpreters, start from copies of
    the reference's checkpoints, and end on another plan's tail (shortcuts: they save work, never
    decide); ``audit``: passing plans per job proven again on the slow path; ``keep_passing``: keep
    every run's folder, not only failures'; ``reference_cache``: references kept across sessions;
    ``ray_address``: the user's Ray cluster; ``settings``: the project's ``[tool.spotchaos]`` where
    the caller has read it already.
    """

    keep_passing: bool = False
    warm: bool = True
    prefix: bool = True
    tails: bool = True
    audit: int = 0
    reference_cache: ReferenceCache | None = None
    ray_address: str | None = None
    settings: Settings | None = None


class Core:
    """The runs of one session, with its references and resources (see the module's docstring).

    ``Core(root, workdir=..., warm=False)``: keywords are :class:`CoreOptions`' fields (or pass one).
    """

    def __init__(
        self, root: Path | str, options: CoreOptions | None = None, /, *, workdir: Path | None = None, **chosen: Any
    ):
        unknown = set(chosen) - {f.name for f in fields(CoreOptions)}
        if unknown:
            raise TypeError(
                f"{type(self).__name__}: no option {sorted(unknown)}; known: {list(CoreOptions.__dataclass_fields__)}"
            )
        options = replace(options or CoreOptions(), **chosen)
        self.options = options
        self.root = Path(root)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="spotchaos-"))
        if not self.workdir.exists():  # the job's checkpoints are kept below it: no other local user reads them
            self.workdir.mkdir(parents=True, mode=0o700)
        self.keep_passing = options.keep_passing
        self.measured: dict[tuple[str, str], Any] = {}  # (what, job key) -> a run a family measures on, once
        self._lock = threading.Lock()
        self._counter = 0
        self.resources = Resources(self.root, options.settings, warm=options.warm, ray_address=options.ray_address)
        self.prefixes = Prefixes(options.prefix)  # the copies of each reference's checkpoint folder
        # plans' last attempts, kept for a plan that ends on the same files (None: every tail trains)
        self.tails = Tails(self.workdir / ".tails") if options.tails else None
        self.shortcuts = Shortcuts(audit=int(options.audit))  # reused passes, disagreements, audits
        self.kept = KeptCopies()  # the checkpoints kept for the state diff: one budget, identical files once
        self.references = References(self, self.prefixes, options.reference_cache)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def next_dir(self, label: str) -> Path:
        """A fresh, numbered working directory for one run."""
        with self._lock:
            self._counter += 1
            return self.workdir / f"{self._counter:04d}-{label}"

    # -- the references (references.py): what a family asks of them most, as the core's own words

    @query
    def reference(self, job: JobSpec) -> RunRecord:
        """The uninterrupted run of ``job``, computed once per session and job configuration (or
        read from the reference cache, where the session has one and the job is unchanged)."""
        return self.references.of(job)

    def audit(self, job: JobSpec) -> Audit | None:
        """What the job's repeated uninterrupted runs showed (None with determinism_runs = 1)."""
        return self.references.audit(job)

    def envelope(self, job: JobSpec) -> Envelope | None:
        """The tolerance of envelope mode (None in bit mode)."""
        return self.references.envelope(job)

    @query
    def checkpoint_steps(self, job: JobSpec) -> list[int]:
        """Steps after which the uninterrupted run reported a durable checkpoint, each once (``saved_steps``)."""
        return self.reference(job).saved_steps

    # -- the resources (resources.py)

    @property
    def secrets(self) -> list[str]:
        """Every S3 secret handed to a job: redacted and searched for in the output."""
        return self.resources.secrets

    @property
    def s3(self) -> S3Service:
        """The harness's S3 (moto behind the fault proxy); tests and scenarios add storage faults to it."""
        return self.resources.s3

    def gpus(self) -> GpuPool:
        """The GPUs attempts lease."""
        return self.resources.gpus()

    def backend(self, job: JobSpec) -> Any:
        """The job's backend: its own container image, a Ray cluster, else None (a local process group)."""
        return self.resources.backend(job)

    def local_backend(self, job: JobSpec) -> Any:
        """The job's backend, else the session's own subprocess backend with its warm interpreters."""
        return self.resources.local_backend(job)

    def use_ray_cluster(self, cluster: Any) -> None:
        """Run this session's Ray jobs on ``cluster`` (an open RayCluster whose life the caller owns)."""
        self.resources.use_ray_cluster(cluster)

    def ray_cluster(self) -> Any:
        """The session's Ray cluster, opened on first use."""
        return self.resources.ray_cluster()

    def docker_backend(self, container: ContainerSpec) -> DockerBackend:
        """A backend for ``container`` on the session's Docker connection (opened on first use)."""
        return self.resources.docker_backend(container)

    def containers(self) -> list[dict[str, Any]]:
        """Images the session's containers ran (name, id, digests), for the report."""
        return self.resources.containers()

    # -- the runs

    def execute(
        self,
        job: JobSpec,
        plan: Plan,
        workdir: Path,
        *,
        storage: StorageChaos = CALM,
        learn: bool = False,
        keep_checkpoints: str = "",
        **engine: Any,
    ) -> RunRecord:
        """One run of ``job`` under ``plan`` on its backend and ``storage``; ``engine``: the rest of
        :class:`EngineOptions` (``trace_fs``, ``prefix``...). A log-adapter job's runs count steps
        the way its uninterrupted run taught (that run comes first, with ``learn``)."""
        convention = self.references.convention(job) if job.log is not None and not learn else None
        with self.resources.storage(job) as storage_env:
            hook = None
            if (swap := storage.before_restart) is not None:

                def hook(index: int) -> Mapping[str, str] | None:
                    return swap(index, storage_env)

            options = EngineOptions(
                root=self.root,
                backend=self.backend(job),
                gpus=self.gpus() if job.gpu_request is not None else None,
                extra_env=tuple(storage_env.items()),
                before_restart=hook,
                convention=convention,
                # the reference starts cold, as a fresh process in production: its string hashes are its own
                warm=None if learn else self.resources.warm_starts,
                # kept only where the state diff compares them (compares_state: not DCP shards)
                keep_checkpoints=keep_checkpoints if compares_state(job) else "",
                kept=self.kept,
                **engine,
            )
            with contextlib.ExitStack() as added:
                for fault in storage.faults:
                    self.s3.add(fault)
                    added.callback(self.s3.remove, fault)
                record = run_job(job, plan, workdir, options)
        reference = self.references.known(job)
        note_cost(record, len(reference.steps) if reference is not None else len(record.steps) if learn else None)
        return record

    def run(self, job: JobSpec, plan: Plan, allowed: Allowed = NONE) -> tuple[RunRecord, Verdict]:
        """Run ``plan`` and judge it (a passing run's folder goes), taking the shortcuts ``allowed``;
        a failure seen through one is judged again on the slow path (:mod:`.judging`)."""
        return run_judged(self, job, plan, allowed)

    def settle(self, job: JobSpec, plan: Plan) -> tuple[RunRecord, Verdict] | None:
        """The slow path's verdict of a failure ``run`` deferred (None: none was)."""
        deferred = self.shortcuts.take_deferred(job, plan)
        return None if deferred is None else slow_judged(self, job, plan, *deferred)

    def judged(self, job: JobSpec, plan: Plan, start: Prefix | None, *, tails: bool = False) -> Judged:
        """``plan`` from ``start`` (None: step 0) judged, again if a crash point missed (:func:`judged_until_fired`);
        ``tails``: its last attempt may be another plan's, where it would begin on the same files."""
        return judged_until_fired(self, job, plan, start, tails=tails)

    def judged_once(self, job: JobSpec, plan: Plan, start: Prefix | None, *, tails: bool = False) -> Judged:
        """One run of ``plan`` from ``start``, judged."""
        cached = self.references.from_cache(job)
        reference = self.reference(job)
        workdir = self.next_dir(f"{job.name}-{len(plan.preemptions)}p")
        # a job's tails are shared where its copies are: its whole world is its checkpoint folder
        shared = self.tails if tails and self.prefixes.live(job) else None
        record = self.execute(
            job,
            plan,
            workdir,
            judge_restarts=True,
            keep_checkpoints="resumed",
            prefix=start,
            tails=shared,
            tails_key=verdict_key(job) if shared is not None else "",
        )
        judging = time.monotonic()
        context = JudgeContext(
            backend=lambda: self.local_backend(job),
            root=self.root,
            leaked=lambda: self.leaks(job, record),
            envelope=self.envelope(job),
            noise=lambda: self.references.second_run(job)[1],
        )
        verdict = judge_run(job, reference, record, context)
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

    def close(self) -> None:
        """Stop what the session started; remove what passed; keep the session's directory only if
        a failure left something in it."""
        self.resources.close()  # containers, the S3 proxy and server, the warm interpreters
        if self.tails is not None:
            self.tails.close()
        for reference in self.references.all():
            self.discard(reference)
        if self.workdir.exists() and not any(self.workdir.iterdir()):
            self.workdir.rmdir()


SessionCore = Core  # the name before 0.2, kept one release (removed in 0.3)

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
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backends.docker import DockerBackend, DockerSession
from .config import JobSpec
from .engine import EngineOptions, run_job
from .errors import SpotchaosError
from .logadapter import StepConvention, convention_from_dict
from .plan import Plan
from .probe import ENV_CHECKPOINT_URI
from .redact import find_leaks
from .safefs import captured_logs
from .trajectory import RunRecord
from .verdict import Verdict, judge

if TYPE_CHECKING:
    from .storage import Fault, S3Service

RestartHook = Callable[[int, Mapping[str, str]], Mapping[str, str] | None]


class SessionCore:
    """Runs, references and resources of one session (see the module's docstring)."""

    def __init__(self, root: Path | str, *, workdir: Path | None = None, keep_passing: bool = False) -> None:
        self.root = Path(root)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="spotchaos-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.keep_passing = keep_passing
        self.cache: dict[tuple[str, str], Any] = {}  # (what, job key) -> a run a family measures on, once
        self._references: dict[str, RunRecord] = {}
        self._conventions: dict[str, StepConvention] = {}  # job key -> how its log-adapter script counts
        self._lock = threading.Lock()
        self._counter = 0
        self._docker: DockerSession | None = None  # started with the first container job
        self._s3: S3Service | None = None  # started with the first job that checkpoints to S3
        self._resources = contextlib.ExitStack()  # what close() stops: containers, the S3 server and its proxy
        self.secrets: list[str] = []  # every S3 secret handed to a job: redacted and searched for in the output

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def next_dir(self, label: str) -> Path:
        """A fresh, numbered working directory for one run."""
        with self._lock:
            self._counter += 1
            return self.workdir / f"{self._counter:04d}-{label}"

    def reference(self, job: JobSpec) -> RunRecord:
        """The uninterrupted run of ``job``, computed once per session and job configuration."""
        key = job.key()
        if key not in self._references:
            record = self.execute(job, Plan(), self.next_dir(f"{job.name}-reference"), learn=True)
            if not record.steps:
                raise SpotchaosError(f"job {job.name!r} reported no step in its uninterrupted run")
            if record.convention is not None:
                self._conventions[key] = convention_from_dict(record.convention)
            self._references[key] = record
        return self._references[key]

    def checkpoint_steps(self, job: JobSpec) -> list[int]:
        """Steps after which the uninterrupted run reported a durable checkpoint."""
        return [e["step"] for e in self.reference(job).attempts[0].of_kind("checkpoint")]

    def backend(self, job: JobSpec) -> DockerBackend | None:
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
    ) -> RunRecord:
        """One run of ``job`` under ``plan`` on its backend and storage; ``storage_faults`` are on
        for the whole run and removed after it; ``before_restart(index, storage_env)`` may swap
        variables for the restarts. A log-adapter job's runs count steps the way its
        uninterrupted run taught (that run comes first, with ``learn``)."""
        convention = None
        if job.log is not None and not learn:
            self.reference(job)
            convention = self._conventions[job.key()]
        with self._storage(job) as storage_env:
            hook = None
            if before_restart is not None:

                def hook(index: int) -> Mapping[str, str] | None:
                    return before_restart(index, storage_env)

            options = EngineOptions(
                root=self.root,
                backend=self.backend(job),
                trace_fs=trace_fs,
                extra_env=tuple(storage_env.items()),
                before_restart=hook,
                preempt_when=preempt_when,
                convention=convention,
                judge_restarts=judge_restarts,
            )
            with contextlib.ExitStack() as added:
                for fault in storage_faults:
                    self.s3.add(fault)
                    added.callback(self.s3.remove, fault)
                return run_job(job, plan, workdir, options)

    def run(self, job: JobSpec, plan: Plan) -> tuple[RunRecord, Verdict]:
        """Run ``plan`` and judge it against the reference; a passing run's directory goes."""
        reference = self.reference(job)
        record = self.execute(job, plan, self.next_dir(f"{job.name}-{len(plan.preemptions)}p"), judge_restarts=True)
        verdict = judge(reference, record)
        leaked = self.leaks(job, record)
        if leaked:  # a job that prints its own secret fails every scenario, not only the storage ones
            verdict.failures.append(leaked)
            verdict.passed = False
        if verdict.passed:
            self.discard(record)
        return record, verdict

    def secrets_of(self, job: JobSpec) -> list[str]:
        """What no output of ``job`` may show: its secret-named variables and every S3 secret handed out."""
        return [*job.secrets(), *self.secrets]

    def leaks(self, job: JobSpec, run: RunRecord) -> str | None:
        """A failure naming where a run's captured output shows a secret of its job, if it does."""
        found = find_leaks(captured_logs(Path(run.workdir)), self.secrets_of(job))
        if not found:
            return None
        names = sorted(k for k, v in job.environment().items() if v in job.secrets())
        return (
            f"a secret ({', '.join(names) or 'a storage credential'}, or 8 characters of it, or its encoding) "
            f"appears in: {', '.join(found)}; the job must not print its credentials"
        )

    def run_once(
        self, job: JobSpec, plan: Plan, label: str, inspect: Callable[[RunRecord], None] | None = None, **options: Any
    ) -> RunRecord:
        """A run whose directory is only needed while ``inspect`` reads it."""
        record = self.execute(job, plan, self.next_dir(f"{job.name}-{label}"), **options)
        if inspect is not None:
            inspect(record)
        self.discard(record)
        return record

    def discard(self, run: RunRecord) -> None:
        """Remove a run's directory, unless passing runs are kept (--spotchaos-keep-runs)."""
        if not self.keep_passing:
            shutil.rmtree(run.workdir, ignore_errors=True)

    def containers(self) -> list[dict[str, Any]]:
        """Images the session's containers ran (name, id, digests), for the report."""
        return list(self._docker.images.values()) if self._docker is not None else []

    def close(self) -> None:
        """Stop what the session started; remove what passed; keep the session's directory only if
        a failure left something in it."""
        self._resources.close()  # containers, the S3 proxy and server
        self._docker = self._s3 = None
        if not self.keep_passing:
            for reference in self._references.values():
                shutil.rmtree(reference.workdir, ignore_errors=True)
        if self.workdir.exists() and not any(self.workdir.iterdir()):
            self.workdir.rmdir()

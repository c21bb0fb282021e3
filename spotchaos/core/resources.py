"""What a session starts and must stop: the jobs' backends and what stands behind them.

A container job needs the Docker connection, a Ray job the cluster, an S3 job the moto server and
its fault proxy, a GPU job the machine's GPUs, every local job the warm interpreters it forks
from. Each is opened with the first job that needs it, never before (a CPU session starts no
Docker client), and :meth:`Resources.close` stops them all, in reverse order, whatever the runs did.
Kept apart from the runs and the references so that owning a life is one class's whole job.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends import SubprocessBackend
from ..backends.docker import DockerBackend, DockerSession
from ..config.container import ContainerSpec
from ..config.jobs import JobSpec, Settings, load_settings
from ..host.gpu_leases import GpuPool
from ..host.warm.pool import WarmStarts

if TYPE_CHECKING:
    from ..storage import S3Service
    from ..storage.per_run import SessionS3


class Resources:
    """The backends of one session's jobs and the services they need, each started on first use.

    ``settings``: the project's ``[tool.spotchaos]`` (read from ``root``'s pyproject.toml when the
    first GPU or Ray job asks, where the caller has not read it); ``warm``: whether local jobs fork
    from warm interpreters; ``ray_address``: the user's Ray cluster instead of a local one.
    """

    def __init__(
        self, root: Path, settings: Settings | None = None, *, warm: bool = True, ray_address: str | None = None
    ):
        self._settings: Callable[[], Settings] = (
            (lambda: settings) if settings is not None else (lambda: load_settings(root / "pyproject.toml"))
        )
        self.ray_address = ray_address
        self._lock = threading.Lock()
        self._stack = contextlib.ExitStack()  # what close() stops: containers, the S3 server and its proxy
        self._docker: DockerSession | None = None
        self._s3: SessionS3 | None = None
        self._gpus: GpuPool | None = None
        self._ray: Any = None  # a RayCluster: started or joined with the first Ray job
        self.secrets: list[str] = []  # every S3 secret handed to a job: redacted and searched for in the output
        self.warm_starts = self._stack.enter_context(WarmStarts()) if warm else None

    def gpus(self) -> GpuPool:
        """The GPUs attempts lease: ``[tool.spotchaos] gpus`` (or SPOTCHAOS_GPUS), else what nvidia-smi lists."""
        with self._lock:
            if self._gpus is None:
                self._gpus = GpuPool(self._settings().gpus)
            return self._gpus

    def backend(self, job: JobSpec) -> Any:
        """The job's backend: its own container image, a Ray cluster, else None (a local process group)."""
        if job.kind.cluster_ranks:  # the driver here, its workers on the cluster
            from ..training.multirank.ray_train import RayTrainBackend

            return RayTrainBackend(self.ray_cluster(), SubprocessBackend(warm=self.warm_starts))
        if job.ray_backend:
            from ..backends.raycluster import RayBackend

            return RayBackend(self.ray_cluster(), job.ray_needs(), float(job.grace_seconds or 30.0))
        return None if job.container is None else self.docker_backend(job.container)

    def local_backend(self, job: JobSpec) -> Any:
        """The job's backend, and for a local job the session's own subprocess backend with its
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
                from ..backends.raycluster import cluster_for

                self._ray = self._stack.enter_context(cluster_for(self._settings().ray, self.ray_address))
            return self._ray

    def docker_backend(self, container: ContainerSpec) -> DockerBackend:
        """A backend for ``container`` on the session's Docker connection (opened on first use)."""
        with self._lock:
            if self._docker is None:
                self._docker = DockerSession()  # DockerUnavailable: the plugin skips or fails
                self._stack.callback(self._docker.close)
        return DockerBackend(self._docker, container)

    @property
    def s3(self) -> S3Service:
        """The harness's S3 (moto behind the fault proxy), started with the first S3 job."""
        return self._session_s3().service

    def _session_s3(self) -> SessionS3:
        with self._lock:
            if self._s3 is None:
                from ..storage.per_run import SessionS3  # moto and the proxy only for an S3 job

                self._s3 = SessionS3(self._stack, self.secrets)
            return self._s3

    @contextlib.contextmanager
    def storage(self, job: JobSpec) -> Iterator[dict[str, str]]:
        """The run's storage environment: for S3, a bucket and an IAM user of the run's own."""
        if job.storage != "s3":
            yield {}
            return
        with self._session_s3().run_environment() as environment:
            yield environment

    def containers(self) -> list[dict[str, Any]]:
        """Images the session's containers ran (name, id, digests), for the report."""
        return list(self._docker.images.values()) if self._docker is not None else []

    def close(self) -> None:
        """Stop everything started: containers, the S3 proxy and server, the Ray cluster, the warm interpreters."""
        self._stack.close()
        self._docker = self._s3 = self.warm_starts = None

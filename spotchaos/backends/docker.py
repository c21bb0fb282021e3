"""The Docker backend: each attempt is a container of the job's image, preempted the way a spot
reclaim reaches production — ``docker stop`` (SIGTERM to PID 1, SIGKILL when the grace period
ends) or ``docker kill``.

A :class:`DockerSession` owns every container of one test session, like a testcontainers
context manager owns one: each carries the session's label, ``close()`` removes them all, and a
new session first reaps the containers of sessions whose process died (a crash, a SIGKILL of
pytest). Paths are bound at the same path inside the container, so the engine's events file,
checkpoint URI and logs mean the same thing on both sides.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..config.container import ContainerSpec
from ..errors import BackendError
from ..host.gpu import gpus_present
from ..host.gpu_leases import GpuUnavailable
from ..safety.safefs import create_new
from .base import Backend, Handle, LaunchSpec

LABEL_SESSION = "spotchaos.session"
LABEL_OWNER = "spotchaos.owner"  # host:pid of the pytest process that started it
LABEL_BIND = "spotchaos.bind-host-paths"  # images built by 'spotchaos test-image' need these bound read-only
SHELLS = {"sh", "bash", "dash", "ash", "zsh", "busybox"}


class DockerUnavailable(BackendError):
    """No Docker daemon answers (or the SDK is missing): container jobs cannot run here."""


def _docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


HOW_TO_START = (
    "start one (Debian: apt-get install docker.io && dockerd --bridge=none --iptables=false &; "
    "or systemctl start docker), or set DOCKER_HOST"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DockerSession:
    """The Docker client and every container of this test session."""

    def __init__(self, client: Any | None = None) -> None:
        if client is None:
            try:
                import docker
            except ImportError:
                raise DockerUnavailable("the docker SDK is not installed: pip install 'spotchaos[docker]'") from None
            try:
                client = docker.from_env(timeout=60)
                client.ping()
            except Exception as exc:  # the SDK raises DockerException, requests' errors, FileNotFoundError...
                raise DockerUnavailable(
                    f"no Docker daemon answers at {_docker_host()} ({type(exc).__name__}): {HOW_TO_START}"
                ) from None
        self.client = client
        self.id = uuid.uuid4().hex[:12]
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.images: dict[str, dict[str, Any]] = {}  # image -> what the report says of it
        self.reaped = self.reap_orphans()

    def labels(self) -> dict[str, str]:
        return {LABEL_SESSION: self.id, LABEL_OWNER: self.owner}

    def ours(self, *, session: str | None = None) -> list[Any]:
        """Containers of spotchaos (of one session, if given), running or not."""
        label = LABEL_SESSION if session is None else f"{LABEL_SESSION}={session}"
        # ignore_removed: another session may remove one of its containers between the list and the inspect
        return self.client.containers.list(all=True, filters={"label": label}, ignore_removed=True)

    def reap_orphans(self) -> int:
        """Remove containers left by spotchaos sessions of this host whose pytest is gone."""
        host = socket.gethostname()
        reaped = 0
        for container in self.ours():
            owner_host, _, pid = (container.labels.get(LABEL_OWNER) or "").rpartition(":")
            if owner_host == host and pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(Exception):
                    container.remove(force=True)
                    reaped += 1
        return reaped

    def image(self, name: str) -> Any:
        """The local image, never pulled: a pull would leave loopback, and a test must not depend on it."""
        import docker.errors

        try:
            image = self.client.images.get(name)
        except docker.errors.ImageNotFound:
            raise BackendError(
                f"image {name!r} is not present locally: build or pull it first (spotchaos never pulls; "
                "'spotchaos test-image' builds the test image)"
            ) from None
        self.images.setdefault(
            name, {"image": name, "id": image.id, "digests": list(image.attrs.get("RepoDigests") or [])}
        )
        return image

    def close(self) -> None:
        """Remove every container of this session (idempotent, never raises)."""
        with contextlib.suppress(Exception):
            for container in self.ours(session=self.id):
                with contextlib.suppress(Exception):
                    container.remove(force=True)


class DockerBackend(Backend):
    """Runs each attempt of one job in a container of its image."""

    name = "docker"
    # how late a printed line may reach the attempt's log: it comes through the daemon's log stream
    log_latency_seconds = 1.0

    def __init__(self, session: DockerSession, container: ContainerSpec) -> None:
        self.session = session
        self.container = container
        if container.gpus is not None and not gpus_present():
            raise GpuUnavailable(
                f"{container.where}.gpus: the job asks for GPUs ({container.gpus}) and this machine has no "
                "NVIDIA GPU (nvidia-smi -L lists none)"
            )

    def inherited_environment(self) -> dict[str, str]:
        return {}  # the image's environment, not the host's, plus the job's

    def _mounts(self, spec: LaunchSpec, image: Any) -> list[Any]:
        from docker.types import Mount

        binds: dict[str, tuple[str, bool]] = {}  # target -> (source, read_only)
        for path in (image.labels or {}).get(LABEL_BIND, "").split(":"):
            if path:
                binds[path] = (path, True)
        binds[str(spec.cwd)] = (str(spec.cwd), True)  # the project: read, never written
        for path in spec.readable:
            binds[str(path)] = (str(path), True)
        for path in spec.writable:  # the run's own directory: events, logs, checkpoints
            binds[str(path)] = (str(path), False)
        for m in self.container.mounts:
            if not Path(m.source).exists():
                raise BackendError(f"{self.container.where}.mounts: host path {m.source} does not exist")
            binds[m.target] = (m.source, m.read_only)
        # deeper targets after their parents, so a writable run directory inside the project wins
        return [
            Mount(target=t, source=s, type="bind", read_only=ro)
            for t, (s, ro) in sorted(binds.items(), key=lambda item: item[0].count("/"))
        ]

    def start(self, spec: LaunchSpec) -> DockerHandle:
        import docker.errors
        from docker.types import DeviceRequest

        image = self.session.image(self.container.image)
        c = self.container
        options: dict[str, Any] = {
            "command": list(spec.argv),
            "environment": {**dict(c.env), **spec.env},
            "working_dir": c.working_dir or str(spec.cwd),
            "mounts": self._mounts(spec, image),
            "labels": self.session.labels(),
            "network_mode": c.network,
            "detach": True,
            "stop_signal": "SIGTERM",
        }
        if c.entrypoint is not None:
            options["entrypoint"] = list(c.entrypoint)
        if c.user is not None:
            options["user"] = c.user
        if c.cpus is not None:
            options["nano_cpus"] = int(c.cpus * 1e9)
        if c.memory is not None:
            options["mem_limit"] = c.memory
        if c.shm_size is not None:
            options["shm_size"] = c.shm_size
        if spec.gpus:  # the devices leased to this attempt, never "the first N" every container would get
            options["device_requests"] = [DeviceRequest(device_ids=list(spec.gpus), capabilities=[["gpu"]])]
        elif c.gpus is not None:
            count = -1 if c.gpus == "all" else int(c.gpus)
            options["device_requests"] = [DeviceRequest(count=count, capabilities=[["gpu"]])]
        try:
            created = self.session.client.containers.create(image.id, **options)
        except docker.errors.APIError as exc:
            raise BackendError(f"cannot create a container of {c.image!r}: {exc.explanation or exc}") from None
        handle = DockerHandle(created, spec)
        try:
            created.start()
        except docker.errors.APIError as exc:
            handle.cleanup()
            raise BackendError(f"cannot start a container of {c.image!r}: {exc.explanation or exc}") from None
        handle.follow()
        return handle


def _status_to_exit(code: int) -> int:
    """Docker reports a signal death as 128+N; the engine speaks Popen's -N."""
    return -(code - 128) if 128 < code <= 128 + 64 else code


class DockerHandle(Handle):
    """One attempt as a running container."""

    def __init__(self, container: Any, spec: LaunchSpec) -> None:
        self._container = container
        self._spec = spec
        self.identity = {"container": container.id}  # for a later pytest run that must remove it if this one dies
        # opened now, before the container runs: it can write to the run directory, and a log
        # opened by name later could be a link it put there (to a host file it cannot see)
        self._logs = [create_new(spec.stdout_path), create_new(spec.stderr_path)]
        self._exit: int | None = None
        self._exited = threading.Event()
        self._threads: list[threading.Thread] = []
        self._cleaned = False
        self._pid = 0
        self.delivery_note = ""  # what a notice met inside the container (a shell as PID 1, say)

    def follow(self) -> None:
        """Stream stdout/stderr to the attempt's log files and wait for the exit, in threads:
        polling the daemon every few milliseconds would load it more than the job does."""
        with contextlib.suppress(Exception):
            self._container.reload()
            self._pid = int(self._container.attrs["State"]["Pid"] or 0)
        for log, stdout in ((self._logs[0], True), (self._logs[1], False)):
            self._threads.append(threading.Thread(target=self._copy_log, args=(log, stdout), daemon=True))
        self._threads.append(threading.Thread(target=self._wait, daemon=True))
        for thread in self._threads:
            thread.start()

    def _copy_log(self, log: Any, stdout: bool) -> None:
        with contextlib.suppress(Exception), log:
            for chunk in self._container.logs(stdout=stdout, stderr=not stdout, stream=True, follow=True):
                log.write(chunk)
                log.flush()

    def _wait(self) -> None:
        try:
            status = self._container.wait()
            self._exit = _status_to_exit(int(status.get("StatusCode", -1)))
        except Exception:
            self._exit = -9  # removed under us: it is not running any more
        self._exited.set()

    @property
    def pid(self) -> int:
        return self._pid

    def _processes(self) -> list[tuple[int, str]]:
        """(host pid, command) of every process in the container, PID 1 first."""
        try:
            top = self._container.top(ps_args="-o pid,args")
        except Exception:
            return []
        titles = [t.upper() for t in top.get("Titles", [])]
        pid_col = titles.index("PID") if "PID" in titles else 0
        cmd_col = len(titles) - 1
        return [(int(p[pid_col]), p[cmd_col]) for p in top.get("Processes") or []]

    def notify(self, signum: int, *, whole_group: bool) -> None:
        processes = self._processes()
        if processes:
            first = processes[0][1].split()
            name = os.path.basename(first[0]) if first else ""
            if name in SHELLS and len(processes) > 1:
                self.delivery_note = (
                    f"PID 1 in the container is the shell {processes[0][1]!r}, and the trainer runs as its "
                    "child: a shell does not forward SIGTERM (use 'exec' in the entrypoint, or an init such as tini)"
                )
        if whole_group:  # a VM shutting down: every process of the container gets it
            for pid, _ in processes:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
            if processes:
                return
        if signum == signal.SIGTERM:
            grace = self._spec.grace_seconds

            def stop() -> None:  # docker stop: SIGTERM to PID 1, SIGKILL by the daemon when grace ends
                with contextlib.suppress(Exception):
                    self._container.stop(timeout=max(1, int(grace + 0.999)))

            threading.Thread(target=stop, daemon=True).start()
        else:
            with contextlib.suppress(Exception):
                self._container.kill(signal=signum)

    def kill(self) -> None:
        with contextlib.suppress(Exception):  # not running any more: nothing to kill
            self._container.kill()

    def poll(self) -> int | None:
        return self._exit if self._exited.is_set() else None

    def wait(self, timeout: float) -> int | None:
        self._exited.wait(max(timeout, 0))
        return self.poll()

    def survivors(self) -> list[int]:
        return []  # PID 1's exit ends the container's PID namespace: nothing survives it

    def oom_killed(self) -> bool:
        """Whether the kernel killed the container for going over its memory limit."""
        with contextlib.suppress(Exception):
            self._container.reload()
            return bool(self._container.attrs["State"].get("OOMKilled"))
        return False

    def cleanup(self) -> None:
        if self._cleaned:
            return
        self.kill()
        self._exited.wait(10)
        deadline = time.monotonic() + 30
        while True:
            try:
                self._container.remove(force=True)
                break
            except Exception as exc:
                if "No such container" in str(exc) or "404" in str(exc):
                    break
                if time.monotonic() > deadline:
                    raise BackendError(f"container {self._container.short_id} could not be removed: {exc}") from None
                time.sleep(0.2)
        for thread in self._threads:
            thread.join(5)
        for log in self._logs:
            log.close()  # already closed by its thread, unless the thread never started
        self._cleaned = True

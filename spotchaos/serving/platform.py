"""The harness playing the platform: one service instance on one instance type, whole life owned.

An :class:`Instance` is a context manager (like a testcontainers container): it starts the service
on its type's resources, waits for it to be ready and to answer its first request (the time to
first request, TTFR, is what a cold start costs users), and on exit ends every process it started.
A type's memory is enforced: a container's limit on Docker (the kernel's OOM killer), the process
tree's resident memory watched here on the subprocess backend (the same kill, from outside).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from ..backends import LaunchSpec, SubprocessBackend
from ..config.services import InstanceType, ServiceSpec
from ..errors import JobError
from ..extras import require
from ..host.leftovers import LiveJobs
from ..host.processes import end_escaped, group_members
from ..probe import ENV_RUN_ID
from ..safety.safefs import last_lines, log_tail
from .answers import request_once

ENV_INSTANCE_TYPE = "SPOTCHAOS_INSTANCE_TYPE"
MEMORY_POLL_SECONDS = 0.05
READY_POLL_SECONDS = 0.1


def resident_bytes(pids: list[int]) -> int:
    """The summed resident memory of ``pids`` (VmRSS), what a memory cgroup would count first."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
    return total


class MemoryWatch:
    """Kills a process group whose resident memory goes over ``limit`` bytes: the subprocess
    backend's stand-in for a container's memory limit. The largest figure seen is kept."""

    def __init__(self, pgid: int, limit: int, kill: Callable[[], None]) -> None:
        self.pgid, self.limit, self.kill = pgid, limit, kill
        self.peak = 0
        self.exceeded: int | None = None  # the resident bytes that went over, if any
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotchaos-memory-watch", daemon=True)

    def start(self) -> MemoryWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(MEMORY_POLL_SECONDS):
            members = group_members(self.pgid)
            if not members:
                return
            used = resident_bytes(members)
            self.peak = max(self.peak, used)
            if used > self.limit:
                self.exceeded = used
                self.kill()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


@dataclass
class FirstAnswer:
    ready_seconds: float  # from the launch to /ready answering 200
    seconds: float  # from the launch to the first full answer to the recipe: the TTFR
    body: bytes


def _tail(path: Path) -> str:
    return last_lines(log_tail(path, 3000), 6)


def _gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


@dataclass(frozen=True)
class ServiceSite:
    """What every instance of one service starts from, the first and its replacements alike."""

    service: ServiceSpec
    workdir: Path  # the scenario's folder: each instance's logs, labelled
    cwd: Path  # the project root a relative ``cwd`` of the service is read against
    python: str = sys.executable
    docker_backend: Callable[[Any], Any] | None = None  # a container service's backend, per container spec


class Instance:
    """``with Instance(...) as instance:`` one service process (or container) on ``itype``."""

    def __init__(
        self, site: ServiceSite, *, label: str, port: int, env: dict[str, str], itype: InstanceType | None
    ) -> None:
        service, workdir, docker_backend = site.service, site.workdir, site.docker_backend
        self.service, self.port, self.itype, self.label = service, port, itype, label
        self.base_url = f"http://127.0.0.1:{port}"
        self.run_id = uuid.uuid4().hex[:12]
        container = service.container
        if container is not None and itype is not None:  # the type's resources, as docker run limits them
            container = replace(
                container,
                memory=itype.memory or container.memory,
                cpus=itype.cpus if itype.cpus is not None else container.cpus,
            )
        if container is not None and docker_backend is not None:
            self.backend: Any = docker_backend(container)
        else:
            self.backend = SubprocessBackend()
        environment = {
            **self.backend.inherited_environment(),
            **env,
            ENV_RUN_ID: self.run_id,
            "PYTHONUNBUFFERED": "1",
        }
        if itype is not None:
            environment[ENV_INSTANCE_TYPE] = itype.name
        self.spec = LaunchSpec(
            argv=tuple(service.argv(port, site.python)),
            env=environment,
            cwd=service_cwd(service, site.cwd),
            stdout_path=workdir / f"{label}.stdout.log",
            stderr_path=workdir / f"{label}.stderr.log",
            grace_seconds=float(service.notice_seconds or 30.0),
            writable=(workdir,),
            marker=f"{ENV_RUN_ID}={self.run_id}",
        )
        self.handle: Any = None
        self.watch: MemoryWatch | None = None
        self.live = LiveJobs()
        self.entry: Any = None
        self.launched_at = 0.0

    def __enter__(self) -> Instance:
        self.launched_at = time.monotonic()
        self.handle = self.backend.start(self.spec)
        self.entry = self.live.add(self.run_id, dict(self.handle.identity))
        limit = self.itype.memory_bytes if self.itype is not None else None
        if limit is not None and isinstance(self.backend, SubprocessBackend):
            self.watch = MemoryWatch(self.handle.pid, limit, self.handle.kill).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if self.watch is not None:
                self.watch.stop()
            self.handle.cleanup()
        finally:
            end_escaped(f"{ENV_RUN_ID}={self.run_id}", self.handle.identity.get("start") if self.handle else None)
            self.live.discard(self.entry)

    def where(self) -> str:
        if self.itype is None:
            return f"service {self.service.name!r}"
        memory = f", memory {self.itype.memory}" if self.itype.memory else ""
        return f"service {self.service.name!r} on {self.itype.name}{memory}"

    def death(self, code: int | None) -> str:
        """Why the instance is gone, in words: over its memory, or its exit status."""
        if self.watch is not None and self.watch.exceeded is not None:
            return (
                f"its resident memory reached {_gib(self.watch.exceeded)}, over the {self.itype.memory} of "
                f"{self.itype.name}: the model does not fit this type"
            )
        if self.handle.oom_killed():
            return (
                f"the kernel killed it for memory (over the {self.itype.memory} of {self.itype.name}): "
                "the model does not fit this type"
            )
        return f"it exited with status {code}"

    def first_answer(self, timeout: float) -> FirstAnswer:
        """Wait for readiness, then for one full answer to the recipe; a clear JobError if either never
        comes. Each request has a total deadline (a trickled answer cannot outlast ``timeout``)."""
        httpx = require("httpx", "serve", "a service scenario")
        service, recipe = self.service, self.service.request
        ready: float | None = None
        deadline = self.launched_at + timeout
        first = recipe.make(0)
        while True:
            code = self.handle.poll()
            if code is not None:
                waiting = f"GET {service.ready_path}" if ready is None else f"its first {first.method} {first.path}"
                raise JobError(
                    f"{self.where()} died before {'it was ready' if ready is None else 'it answered'} ({waiting}): "
                    f"{self.death(code)}; its stderr:\n{_tail(self.spec.stderr_path)}"
                )
            try:
                left = max(deadline - time.monotonic(), 0.05)
                if ready is None:
                    url = self.base_url + service.ready_path
                    if request_once("GET", url, min(1.0, left), read_body=False).status == 200:
                        ready = time.monotonic() - self.launched_at
                        continue
                else:
                    answer = request_once(
                        first.method,
                        self.base_url + first.path,
                        min(10.0, left),
                        content=first.content,
                        headers=dict(first.headers),
                    )
                    if answer.status == 200:
                        return FirstAnswer(ready, time.monotonic() - self.launched_at, answer.head)
            except (httpx.HTTPError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                what = f"GET {service.ready_path} never answered 200" if ready is None else "no request was answered"
                raise JobError(
                    f"{self.where()} did not serve within {timeout:g} s: {what}; its stderr:\n"
                    f"{_tail(self.spec.stderr_path)}"
                )
            time.sleep(READY_POLL_SECONDS)


def service_cwd(service: ServiceSpec, root: Path) -> Path:
    return root / service.cwd if service.cwd else root

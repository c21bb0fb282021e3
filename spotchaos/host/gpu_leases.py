"""GPUs leased to attempts, so concurrent attempts never share a device.

``pytest -n 8`` on an 8-GPU machine starts eight jobs at once; without a lease each would train on
the first GPU (CUDA's default, and what a container's ``gpus = 1`` device request gets). Each
device has a lock file under the harness's own private directory
(``<tmp>/spotchaos-<uid>/gpus/<device>.lock``); an attempt that needs GPUs holds ``flock`` on as
many of them as it asks for, for its whole life, across pytest-xdist workers and sessions of this
user. The kernel drops a lock when its holder dies, so a SIGKILLed pytest frees its devices with
nothing to reclaim by hand; the holder's identity (pid, job, attempt) is written into the file for
the message of an attempt left waiting.

The devices are the ones declared (``[tool.spotchaos] gpus = ["0", "1"]``, or ``SPOTCHAOS_GPUS=0,1``,
which wins: the lease logic is the same on a machine without GPUs), else the ones ``nvidia-smi``
lists.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BackendError, ConfigError, SpotchaosError
from ..safety.safefs import private_dir
from .gpu import nvidia_smi

DEVICES_VARIABLE = "SPOTCHAOS_GPUS"  # a declared device list: "0,1" or GPU UUIDs
LEASE_DIR_VARIABLE = "SPOTCHAOS_LEASE_DIR"  # where the lock files live (tests point it elsewhere)
DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,79}")  # an index, or a UUID such as GPU-5e1f...
POLL_SECONDS = 0.05


class GpuUnavailable(BackendError):
    """A job asks for GPUs and this machine has none (a skip, unless --spotchaos-require-gpu)."""


class NoGpuFree(SpotchaosError):
    """Every device was leased for as long as an attempt may wait."""


def parse_devices(value: object, where: str) -> tuple[str, ...]:
    """A declared device list: a list of ids (or one comma-separated string), each an index or UUID."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(d, str | int) for d in items):
        raise ConfigError(f'{where}: must be a list of GPU ids such as ["0", "1"], got {value!r}')
    devices = tuple(str(d).strip() for d in items if str(d).strip())
    bad = [d for d in devices if not DEVICE_ID.fullmatch(d)]
    if bad:
        raise ConfigError(f"{where}: {bad[0]!r} is not a GPU id (an index such as 0, or a UUID such as GPU-5e1f...)")
    if len(set(devices)) != len(devices):
        raise ConfigError(f"{where}: a GPU is listed twice: {', '.join(devices)}")
    return devices


def discovered_devices() -> tuple[str, ...]:
    """The GPU indices the driver lists (none without ``nvidia-smi``)."""
    out = nvidia_smi("--query-gpu=index", "--format=csv,noheader", timeout=10) or ""
    return tuple(line.strip() for line in out.splitlines() if line.strip().isdigit())


@dataclass
class GpuLease:
    """Devices held by one attempt until :meth:`release` (idempotent; also on ``with`` exit)."""

    devices: tuple[str, ...]
    acquired_wall: float
    waited_seconds: float
    _files: list[int] = field(default_factory=list, repr=False)
    released_wall: float | None = None

    def release(self) -> None:
        for fd in self._files:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no stale holder named in a message
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the only descriptor drops the flock
        self._files.clear()
        if self.released_wall is None:
            self.released_wall = time.time()

    def describe(self) -> dict[str, object]:
        return {
            "devices": list(self.devices),
            "acquired": round(self.acquired_wall, 3),
            "released": round(self.released_wall, 3) if self.released_wall is not None else None,
            "waited_seconds": round(self.waited_seconds, 3),
        }

    def __enter__(self) -> GpuLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class GpuPool:
    """The devices of this machine and their lock files."""

    def __init__(self, devices: Sequence[str] | None = None, directory: Path | None = None) -> None:
        declared = os.environ.get(DEVICES_VARIABLE)
        if declared is not None:
            self.devices = parse_devices(declared, DEVICES_VARIABLE)
            self.source = DEVICES_VARIABLE
        elif devices is not None:
            self.devices = tuple(devices)
            self.source = "[tool.spotchaos] gpus"
        else:
            self.devices = discovered_devices()
            self.source = "nvidia-smi"
        default = Path(tempfile.gettempdir()) / f"spotchaos-{os.getuid()}" / "gpus"
        self.directory = directory or Path(os.environ.get(LEASE_DIR_VARIABLE) or default)

    def lease(self, count: int, holder: dict[str, object], timeout: float) -> GpuLease:
        """``count`` distinct devices, waiting up to ``timeout`` seconds while others hold them.
        Asking for more than the machine has is a ConfigError at once: no wait could satisfy it."""
        if count > len(self.devices):
            have = f"{len(self.devices)} ({', '.join(self.devices)})" if self.devices else "none"
            raise ConfigError(
                f"the job asks for {count} GPU(s) and this machine has {have}, from {self.source}: "
                "ask for fewer, or declare the devices ([tool.spotchaos] gpus, SPOTCHAOS_GPUS)"
            )
        folder = private_dir(self.directory)
        started = time.monotonic()
        while True:
            held: list[tuple[str, int]] = []
            for device in self.devices:
                try:
                    fd = _try_lock(folder / f"{device}.lock")
                except OSError as exc:  # a link or something else planted where the lock file goes
                    for _, taken in held:
                        os.close(taken)
                    raise SpotchaosError(
                        f"cannot lease GPU {device}: {folder / f'{device}.lock'}: {exc.strerror or exc} "
                        "(spotchaos opens its lock files itself, never through a link)"
                    ) from None
                if fd is not None:
                    held.append((device, fd))
                    if len(held) == count:
                        break
            if len(held) == count:
                record = json.dumps({**holder, "pid": os.getpid(), "since": time.time()}).encode()
                for _, fd in held:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, 0)
                        os.pwrite(fd, record, 0)
                waited = time.monotonic() - started
                return GpuLease(tuple(d for d, _ in held), time.time(), waited, [fd for _, fd in held])
            for _, fd in held:  # never sit on part of a lease while waiting: two waiters could deadlock
                os.close(fd)
            if time.monotonic() - started > timeout:
                raise NoGpuFree(
                    f"no {count} GPU(s) free for {timeout:g} s (attempt_timeout_seconds): {self.holders(folder)}"
                )
            time.sleep(POLL_SECONDS)

    def holders(self, folder: Path | None = None) -> str:
        """Who holds each device, as their lock files say."""
        folder = folder or self.directory
        parts = []
        for device in self.devices:
            try:
                fd = os.open(folder / f"{device}.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    holder = json.loads(os.read(fd, 4096) or b"{}")
                finally:
                    os.close(fd)
            except (OSError, ValueError):
                holder = {}
            holder = holder if isinstance(holder, dict) else {}
            who = f"pid {holder.get('pid')} (job {holder.get('job')!r}, attempt {holder.get('attempt')})"
            parts.append(f"GPU {device} held by {who}" if holder else f"GPU {device} free")
        return "; ".join(parts)


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path`` (created 0600, never through a link), or None."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd

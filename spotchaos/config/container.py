"""How a job runs in a container: the image and the ``docker run`` options users expect.

Declared per job (``image = "..."`` and an optional ``[tool.spotchaos.jobs.NAME.container]``
table) or for every job with ``--spotchaos-image``. Plain data, validated on construction, so a
bad option fails at configuration time naming its key, not half-way through a scenario.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .declare import only_known

NETWORKS = ("host", "none")  # never a bridge: a job may reach loopback (the S3 server) and nothing else
SIZE = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.I)
_KEYS = {"entrypoint", "mounts", "user", "cpus", "memory", "shm_size", "working_dir", "gpus", "network", "env"}


def size_bytes(text: str) -> int:
    """``"512m"`` -> bytes, as docker reads a size (b, k, m, g; binary multiples)."""
    unit = text[-1].lower() if text[-1].isalpha() else "b"
    number = float(text[:-1] if text[-1].isalpha() else text)
    return int(number * {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30}[unit])


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool

    @classmethod
    def parse(cls, text: str, where: str) -> Mount:
        parts = text.split(":")
        if len(parts) == 2:
            parts.append("rw")
        absolute = len(parts) == 3 and parts[0].startswith("/") and parts[1].startswith("/")
        if not absolute or parts[2] not in ("ro", "rw"):
            raise ConfigError(f"{where}: {text!r} is not HOST_PATH:CONTAINER_PATH[:ro|rw] (absolute paths)")
        return cls(parts[0], parts[1], parts[2] == "ro")


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    entrypoint: tuple[str, ...] | None = None  # None: the image's own ENTRYPOINT stays
    mounts: tuple[Mount, ...] = ()
    user: str | None = None
    cpus: float | None = None
    memory: str | None = None  # "4g", "512m"
    shm_size: str | None = None  # DataLoader workers pass batches through /dev/shm (64m by default)
    working_dir: str | None = None  # None: the job's cwd, bound at the same path
    gpus: int | str | None = None  # a count, or "all"
    network: str = "host"
    env: tuple[tuple[str, str], ...] = ()  # only for the container (the job's env applies as well)
    where: str = "container"

    @property
    def uid(self) -> int | None:
        """The uid the container runs as where ``user`` names one by number (``"1000"``,
        ``"1000:1000"``); None for a user given by name (its uid is the image's to say) or none."""
        number = (self.user or "").partition(":")[0]
        return int(number) if number.isdigit() else None

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not self.image.strip():
            raise ConfigError(f"{self.where}.image: must be a non-empty image name")
        if self.network not in NETWORKS:
            raise ConfigError(f"{self.where}.network: must be one of {', '.join(NETWORKS)}, got {self.network!r}")
        if self.cpus is not None and (
            not isinstance(self.cpus, int | float) or isinstance(self.cpus, bool) or not 0 < self.cpus <= 1024
        ):
            raise ConfigError(f"{self.where}.cpus: must be a number of CPUs in (0, 1024], got {self.cpus!r}")
        for key in ("memory", "shm_size"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not SIZE.match(value)):
                raise ConfigError(f"{self.where}.{key}: must be a size such as '512m' or '4g', got {value!r}")
        count = isinstance(self.gpus, int) and not isinstance(self.gpus, bool) and self.gpus >= 1
        if self.gpus is not None and self.gpus != "all" and not count:
            raise ConfigError(f"{self.where}.gpus: must be a positive count or 'all', got {self.gpus!r}")

    def describe(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "entrypoint": list(self.entrypoint) if self.entrypoint is not None else None,
            "mounts": [f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}" for m in self.mounts],
            "user": self.user,
            "cpus": self.cpus,
            "memory": self.memory,
            "shm_size": self.shm_size,
            "working_dir": self.working_dir,
            "gpus": self.gpus,
            "network": self.network,
            "env": sorted(k for k, _ in self.env),  # names only: values may be secrets
        }


def container_from_mapping(image: Any, table: Any, where: str) -> ContainerSpec:
    """Build from a job's ``image`` key and its ``container`` table (``where`` names the job)."""
    if not isinstance(image, str) or not image.strip():
        raise ConfigError(f"{where}.image: must be a non-empty image name, got {image!r}")
    if table is None:
        table = {}
    table = only_known(table, f"{where}.container", _KEYS)
    entrypoint = table.get("entrypoint")
    if entrypoint is not None:
        if isinstance(entrypoint, str):
            entrypoint = [entrypoint]
        if not isinstance(entrypoint, list) or not all(isinstance(p, str) for p in entrypoint):
            raise ConfigError(f"{where}.container.entrypoint: must be a string or a list of strings")
        entrypoint = tuple(entrypoint)
    mounts = table.get("mounts", [])
    if not isinstance(mounts, list) or not all(isinstance(m, str) for m in mounts):
        raise ConfigError(f"{where}.container.mounts: must be a list of 'HOST:CONTAINER[:ro]' strings")
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{where}.container.env: must be a table of strings")
    for key in ("user", "working_dir"):
        if key in table and not isinstance(table[key], str):
            raise ConfigError(f"{where}.container.{key}: must be a string")
    return ContainerSpec(
        image=image,
        entrypoint=entrypoint,
        mounts=tuple(Mount.parse(m, f"{where}.container.mounts") for m in mounts),
        user=table.get("user"),
        cpus=table.get("cpus"),
        memory=table.get("memory"),
        shm_size=table.get("shm_size"),
        working_dir=table.get("working_dir"),
        gpus=table.get("gpus"),
        network=table.get("network", "host"),
        env=tuple(sorted(env.items())),
        where=f"{where}.container",
    )

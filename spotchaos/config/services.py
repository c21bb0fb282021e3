"""Services under test and how they are declared: ``[tool.spotchaos.services.NAME]``.

A service is declared like a job: a command (``{port}`` is filled with a free port on 127.0.0.1
unless ``port`` is given), a readiness path, the request the load repeats, how many requests stay
in flight, how long the steady state lasts, how the reclaim notice arrives and how long it is.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .container import SIZE, ContainerSpec, container_from_mapping, size_bytes
from .declare import JOB_NAME, PYTHON_ALIASES, checked_table, command_of, only_known
from .presets import GRACE_WINDOWS

CHANNELS = ("sigterm", "aws", "gcp", "azure", "alibaba")  # how the notice reaches the service (notices.py)
METHODS = ("GET", "POST", "PUT")


@dataclass(frozen=True)
class Request:
    """One request as it goes on the wire."""

    method: str
    path: str
    content: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RequestRecipe:
    """The request the load keeps repeating. ``stream``: the answer is read chunk by chunk and must
    end with ``stream_end`` (a stream cut short is a failed request). ``factory``: a callable (or
    ``"module:function"``, imported from the project) called with the request's number that returns
    ``{"method", "path", "body", "headers"}``, for loads whose requests differ (prompts, sizes);
    request 0 is the one both instances answer for the time to first request and the stale-model check."""

    method: str = "POST"
    path: str = "/predict"
    body: str | None = None  # sent as application/json
    stream: bool = False
    stream_end: str | None = None
    factory: Callable[[int], Mapping[str, Any]] | str | None = None

    def resolve(self, root: Path) -> RequestRecipe:
        """This recipe with a ``"module:function"`` factory imported (``root`` on the import path)."""
        if not isinstance(self.factory, str):
            return self
        module_name, _, function = self.factory.partition(":")
        if not module_name or not function:
            raise ConfigError(f"request.factory: {self.factory!r} is not 'module:function'")
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        try:
            made = getattr(importlib.import_module(module_name), function)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"request.factory: cannot import {self.factory!r}: {exc}") from None
        if not callable(made):
            raise ConfigError(f"request.factory: {self.factory!r} is not callable")
        return replace(self, factory=made)

    def make(self, number: int) -> Request:
        if self.factory is None:
            content = self.body.encode() if self.body is not None else None
            headers = (("content-type", "application/json"),) if content is not None else ()
            return Request(self.method, self.path, content, headers)
        assert callable(self.factory), "resolve() the recipe first"
        made = self.factory(number)
        if not isinstance(made, Mapping) or not isinstance(made.get("path", "/"), str):
            raise ConfigError(f"request.factory returned {made!r}: expected a mapping with method, path, body")
        body = made.get("body")
        headers = dict(made.get("headers") or {})
        if isinstance(body, Mapping | list):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
            headers.setdefault("content-type", "application/json")
        method = str(made.get("method", "POST")).upper()
        if method not in METHODS:
            raise ConfigError(f"request.factory returned method {method!r}: must be one of {', '.join(METHODS)}")
        return Request(method, str(made.get("path", self.path)), body, tuple(headers.items()))


@dataclass(frozen=True)
class InstanceType:
    """One entry of the fallback order: a resource profile the platform can start an instance on.
    ``memory`` is enforced (a container's limit on Docker, the process tree's RSS watched on the
    subprocess backend); ``cpus`` limits a container (the subprocess backend records it)."""

    name: str
    memory: str | None = None  # "2g", "768m"
    cpus: float | None = None
    spot: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not JOB_NAME.fullmatch(self.name):
            raise ConfigError(f"instance type name {self.name!r}: use letters, digits, '.', '_' and '-'")
        if self.memory is not None and (not isinstance(self.memory, str) or not SIZE.match(self.memory)):
            raise ConfigError(f"instance type {self.name!r}: memory must be a size such as '768m', got {self.memory!r}")
        if self.cpus is not None and (not isinstance(self.cpus, int | float) or not 0 < self.cpus <= 1024):
            raise ConfigError(f"instance type {self.name!r}: cpus must be a number in (0, 1024], got {self.cpus!r}")

    @property
    def memory_bytes(self) -> int | None:
        return size_bytes(self.memory) if self.memory else None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "memory": self.memory, "cpus": self.cpus, "spot": self.spot}


@dataclass(frozen=True)
class ModelSpec:
    """The model a service loads from S3 (the harness's moto) through a cache directory the
    platform keeps between instances. ``updated_file``: a new version the harness uploads under
    the same key before the replacement starts; a replacement that serves the cached old one is
    serving a stale cache. ``cold_bandwidth``: bytes per second for downloads (a cold start)."""

    file: str
    key: str = "models/model.pt"
    updated_file: str | None = None
    cold_bandwidth: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key or self.key.startswith("/"):
            raise ConfigError(f"model.key: must be an S3 key such as 'models/model.pt', got {self.key!r}")
        if self.cold_bandwidth is not None and (
            not isinstance(self.cold_bandwidth, int | float) or not self.cold_bandwidth > 0
        ):
            raise ConfigError(f"model.cold_bandwidth: must be bytes per second (> 0), got {self.cold_bandwidth!r}")


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    command: tuple[str, ...]
    port: int | None = None  # None: a free port on 127.0.0.1, handed through "{port}"
    ready_path: str = "/ready"
    request: RequestRecipe = field(default_factory=RequestRecipe)
    concurrency: int = 8  # requests the load keeps in flight
    steady_seconds: float = 2.0  # load before the notice
    provider: str | None = None  # the notice length's preset: aws 120 s, gcp 30 s, ...
    notice_seconds: float | None = None  # from the notice to the kill; None: the provider's, else 30 s
    channel: str = "sigterm"
    drain_margin_seconds: float = 0.5  # the drain must be over this long before the kill
    # after the notice, ready_path must stop answering 200 within this (the platform's deregistration
    # window: a balancer sends traffic to a ready instance); None: a tenth of the notice, at least 1 s
    unready_within_seconds: float | None = None
    start_timeout_seconds: float = 60.0
    request_timeout_seconds: float = 30.0
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    container: ContainerSpec | None = None  # None: a local process (the subprocess backend)
    instance_types: tuple[InstanceType, ...] = ()  # the fallback order; () : no replacement
    unavailable: tuple[str, ...] = ()  # types with no capacity when the replacement is asked for
    replacement_timeout_seconds: float = 60.0
    model: ModelSpec | None = None
    balancer: bool = False  # the platform's load balancer in front; the replacement starts at the notice
    source: str = "python"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not JOB_NAME.fullmatch(self.name):
            raise ConfigError(f"service name {self.name!r}: use letters, digits, '.', '_' and '-' (at most 64)")
        if not self.command:
            raise ConfigError(f"{self.where('command')}: must not be empty")
        if self.port is None and not any("{port}" in part for part in self.command):
            raise ConfigError(
                f"{self.where('command')}: put {{port}} where the service takes its port (the harness picks a free "
                "one on 127.0.0.1), or give port = N"
            )
        if self.port is not None and (not isinstance(self.port, int) or not 1024 <= self.port <= 65535):
            raise ConfigError(f"{self.where('port')}: must be a port from 1024 to 65535, got {self.port!r}")
        if self.provider is not None and self.provider not in GRACE_WINDOWS:
            raise ConfigError(
                f"{self.where('provider')}: unknown provider {self.provider!r} (known: {', '.join(GRACE_WINDOWS)})"
            )
        if self.notice_seconds is None:
            object.__setattr__(self, "notice_seconds", GRACE_WINDOWS.get(self.provider or "", 30.0))
        if self.channel not in CHANNELS:
            raise ConfigError(f"{self.where('channel')}: must be one of {', '.join(CHANNELS)}, got {self.channel!r}")
        if (
            not isinstance(self.concurrency, int)
            or isinstance(self.concurrency, bool)
            or not 1 <= self.concurrency <= 512
        ):
            raise ConfigError(
                f"{self.where('concurrency')}: must be an integer from 1 to 512, got {self.concurrency!r}"
            )
        for key in (
            "steady_seconds",
            "notice_seconds",
            "drain_margin_seconds",
            "start_timeout_seconds",
            "request_timeout_seconds",
            "replacement_timeout_seconds",
        ):
            value = getattr(self, key)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 3600:
                raise ConfigError(f"{self.where(key)}: must be a number of seconds in (0, 3600], got {value!r}")
        if self.drain_margin_seconds >= self.notice_seconds:
            raise ConfigError(f"{self.where('drain_margin_seconds')}: must be shorter than the notice")
        bound = self.unready_within_seconds
        if bound is not None and (
            not isinstance(bound, int | float) or isinstance(bound, bool) or not 0 < bound < self.notice_seconds
        ):
            raise ConfigError(
                f"{self.where('unready_within_seconds')}: must be a number of seconds shorter than the notice "
                f"({self.notice_seconds:g} s), got {bound!r}"
            )
        for key, value in (("ready_path", self.ready_path), ("request.path", self.request.path)):
            if not isinstance(value, str) or not value.startswith("/"):
                raise ConfigError(f"{self.where(key)}: must be a path starting with '/', got {value!r}")
        if self.request.method not in METHODS:
            raise ConfigError(f"{self.where('request.method')}: must be one of {', '.join(METHODS)}")
        if not isinstance(self.balancer, bool):
            raise ConfigError(f"{self.where('balancer')}: must be true or false, got {self.balancer!r}")
        if self.balancer and self.port is not None:
            raise ConfigError(
                f"{self.where('port')}: behind a balancer each instance gets its own port: use {{port}}, not port"
            )
        names = [t.name for t in self.instance_types]
        if len(set(names)) != len(names):
            raise ConfigError(f"{self.where('instance_types')}: each type is named once, got {names}")
        unknown = [name for name in self.unavailable if name not in names]
        if unknown:
            raise ConfigError(
                f"{self.where('unavailable')}: {unknown[0]!r} is not one of the instance_types ({', '.join(names)})"
            )
        if self.instance_types and self.replacement_type() is None:
            raise ConfigError(
                f"{self.where('unavailable')}: every instance type is unavailable: the replacement has nowhere to go"
            )
        if self.model is not None and self.model.updated_file and not self.instance_types:
            raise ConfigError(
                f"{self.where('model.updated_file')}: the stale-cache check needs a replacement: add instance_types"
            )

    def in_image(self, image: str) -> ServiceSpec:
        """This service in a container of ``image`` (``--spotchaos-image``), keeping its own options."""
        base = self.container or ContainerSpec(image=image, where=self.where("container"))
        return replace(self, container=replace(base, image=image))

    @property
    def unready_bound(self) -> float:
        """How soon after the notice readiness must fail (see ``unready_within_seconds``)."""
        if self.unready_within_seconds is not None:
            return float(self.unready_within_seconds)
        return min(max(1.0, float(self.notice_seconds or 30.0) / 10), float(self.notice_seconds or 30.0) / 2)

    def replacement_type(self) -> InstanceType | None:
        """The first type of the order that has capacity: where the platform puts the replacement."""
        return next((t for t in self.instance_types if t.name not in self.unavailable), None)

    def order_followed(self) -> list[dict[str, Any]]:
        """The fallback order as the platform walked it, for the report."""
        chosen = self.replacement_type()
        walked = []
        for t in self.instance_types:
            walked.append({**t.describe(), "available": t.name not in self.unavailable})
            if t is chosen:
                break
        return walked

    def where(self, key: str) -> str:
        if self.source == "python":
            return f"ServiceSpec(name={self.name!r}).{key}"
        return f"{self.source} [tool.spotchaos.services.{self.name}].{key}"

    def argv(self, port: int, python: str) -> list[str]:
        argv = [part.replace("{port}", str(port)) for part in self.command]
        if argv[0] in PYTHON_ALIASES and self.container is None:
            argv[0] = python
        return argv


_KEYS = {
    "command",
    "port",
    "ready_path",
    "request",
    "concurrency",
    "steady_seconds",
    "provider",
    "notice_seconds",
    "channel",
    "drain_margin_seconds",
    "unready_within_seconds",
    "start_timeout_seconds",
    "request_timeout_seconds",
    "env",
    "cwd",
    "image",
    "container",
    "instance_types",
    "unavailable",
    "replacement_timeout_seconds",
    "model",
    "balancer",
}
_REQUEST_KEYS = {"method", "path", "body", "stream", "stream_end", "factory"}
_TYPE_KEYS = {"name", "memory", "cpus", "spot"}
_MODEL_KEYS = {"file", "key", "updated_file", "cold_bandwidth"}


def _subtable(value: Any, where: str, known: set[str]) -> Mapping[str, Any]:
    return only_known(value, where, known, f"a table ({', '.join(sorted(known))})")


def service_from_mapping(name: str, table: Mapping[str, Any], source: str) -> ServiceSpec:
    """One ``[tool.spotchaos.services.NAME]`` table, naming any bad key."""
    table, where = checked_table("services", name, table, source, _KEYS)
    command = command_of(table["command"], where("command"))
    request = _subtable(table.get("request", {}), where("request"), _REQUEST_KEYS)
    types = table.get("instance_types", [])
    if not isinstance(types, list):
        raise ConfigError(f"{where('instance_types')}: must be a list of tables (name, memory, cpus, spot)")
    instance_types = tuple(
        InstanceType(**_subtable(t, f"{where('instance_types')}[{i}]", _TYPE_KEYS)) for i, t in enumerate(types)
    )
    unavailable = table.get("unavailable", [])
    if not isinstance(unavailable, list) or not all(isinstance(u, str) for u in unavailable):
        raise ConfigError(f"{where('unavailable')}: must be a list of instance type names")
    model = None
    if "model" in table:
        model_table = _subtable(table["model"], where("model"), _MODEL_KEYS)
        if "file" not in model_table:
            raise ConfigError(f"{where('model.file')}: required: the model file the harness uploads to S3")
        model = ModelSpec(**model_table)
    if "container" in table and "image" not in table:
        raise ConfigError(f'{where("container")}: needs an image: add image = "..." to the service')
    container = None
    if "image" in table:
        container = container_from_mapping(
            table["image"], table.get("container"), f"{source} [tool.spotchaos.services.{name}]"
        )
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{where('env')}: must be a table of strings")
    structured = {"command", "request", "env", "image", "container", "instance_types", "unavailable", "model"}
    kwargs = {k: table[k] for k in _KEYS - structured if k in table}
    return ServiceSpec(
        name=name,
        command=tuple(command),
        request=RequestRecipe(**request),
        env=tuple(sorted(env.items())),
        container=container,
        instance_types=instance_types,
        unavailable=tuple(unavailable),
        model=model,
        source=source,
        **kwargs,
    )

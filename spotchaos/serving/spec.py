"""Services under test and how they are declared: ``[tool.spotchaos.services.NAME]``.

A service is declared like a job: a command (``{port}`` is filled with a free port on 127.0.0.1
unless ``port`` is given), a readiness path, the request the load repeats, how many requests stay
in flight, how long the steady state lasts, how the reclaim notice arrives and how long it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import JOB_NAME, PYTHON_ALIASES, checked_table, command_of
from ..errors import ConfigError
from ..presets import GRACE_WINDOWS

CHANNELS = ("sigterm", "aws", "gcp", "azure", "alibaba")  # how the notice reaches the service (notices.py)
METHODS = ("GET", "POST", "PUT")


@dataclass(frozen=True)
class RequestRecipe:
    """The request the load keeps repeating. ``stream``: the answer is read chunk by chunk and must
    end with ``stream_end`` (a stream cut short is a failed request)."""

    method: str = "POST"
    path: str = "/predict"
    body: str | None = None  # sent as application/json
    stream: bool = False
    stream_end: str | None = None


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
    start_timeout_seconds: float = 60.0
    request_timeout_seconds: float = 30.0
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
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
        ):
            value = getattr(self, key)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 3600:
                raise ConfigError(f"{self.where(key)}: must be a number of seconds in (0, 3600], got {value!r}")
        if self.drain_margin_seconds >= self.notice_seconds:
            raise ConfigError(f"{self.where('drain_margin_seconds')}: must be shorter than the notice")
        for key, value in (("ready_path", self.ready_path), ("request.path", self.request.path)):
            if not isinstance(value, str) or not value.startswith("/"):
                raise ConfigError(f"{self.where(key)}: must be a path starting with '/', got {value!r}")
        if self.request.method not in METHODS:
            raise ConfigError(f"{self.where('request.method')}: must be one of {', '.join(METHODS)}")

    def where(self, key: str) -> str:
        if self.source == "python":
            return f"ServiceSpec(name={self.name!r}).{key}"
        return f"{self.source} [tool.spotchaos.services.{self.name}].{key}"

    def argv(self, port: int, python: str) -> list[str]:
        argv = [part.replace("{port}", str(port)) for part in self.command]
        if argv[0] in PYTHON_ALIASES:
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
    "start_timeout_seconds",
    "request_timeout_seconds",
    "env",
    "cwd",
}
_REQUEST_KEYS = {"method", "path", "body", "stream", "stream_end"}


def service_from_mapping(name: str, table: Mapping[str, Any], source: str) -> ServiceSpec:
    """One ``[tool.spotchaos.services.NAME]`` table, naming any bad key."""
    table, where = checked_table("services", name, table, source, _KEYS)
    command = command_of(table["command"], where("command"))
    request = table.get("request", {})
    if not isinstance(request, Mapping):
        raise ConfigError(f"{where('request')}: must be a table (method, path, body, stream, stream_end)")
    bad = sorted(set(request) - _REQUEST_KEYS)
    if bad:
        raise ConfigError(f"{where('request.' + bad[0])}: unknown key (known: {', '.join(sorted(_REQUEST_KEYS))})")
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{where('env')}: must be a table of strings")
    kwargs = {k: table[k] for k in _KEYS - {"command", "request", "env"} if k in table}
    return ServiceSpec(
        name=name,
        command=tuple(command),
        request=RequestRecipe(**request),
        env=tuple(sorted(env.items())),
        source=source,
        **kwargs,
    )

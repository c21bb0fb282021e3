"""Jobs under test and how they are declared.

A job is declared once, in ``[tool.spotchaos.jobs.NAME]`` of pyproject.toml or in Python as a
:class:`JobSpec`, and every scenario runs against it. Validation names the file and the key,
because a typo in a CI config should cost one glance, not a debugging session.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

PYTHON_ALIASES = ("python", "python3")


@dataclass(frozen=True)
class JobSpec:
    """One training job: how to start it, resume it, and how long to wait for it.

    ``command`` and ``resume_command`` starting with ``python`` run under the interpreter that
    runs pytest, so a virtual environment's torch is the one tested.
    """

    name: str
    command: tuple[str, ...]
    resume_command: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    grace_seconds: float = 30.0
    start_timeout: float = 120.0
    event_timeout: float = 60.0
    attempt_timeout: float = 1800.0
    source: str = "python"

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError(f"{self.where('command')}: must not be empty")
        for key in ("grace_seconds", "start_timeout", "event_timeout", "attempt_timeout"):
            value = getattr(self, key)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < 1e6:
                raise ConfigError(f"{self.where(key)}: must be a positive number of seconds, got {value!r}")

    def where(self, key: str) -> str:
        if self.source == "python":
            return f"JobSpec(name={self.name!r}).{key}"
        return f"{self.source} [tool.spotchaos.jobs.{self.name}].{key}"

    def argv(self, resume: bool) -> list[str]:
        command = self.resume_command if resume and self.resume_command else self.command
        argv = list(command)
        if argv[0] in PYTHON_ALIASES:
            argv[0] = sys.executable
        return argv

    def environment(self) -> dict[str, str]:
        return dict(self.env)

    def key(self) -> str:
        """Identifies everything that shapes the trajectory; the reference run is cached by it."""
        shaping = {"command": self.command, "resume": self.resume_command, "env": self.env, "cwd": self.cwd}
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["env"] = sorted(k for k, _ in self.env)  # names only: values may be secrets
        return data


@dataclass(frozen=True)
class Settings:
    """Project-wide options from ``[tool.spotchaos]``."""

    output: str = "spotchaos-report"
    jobs: tuple[JobSpec, ...] = field(default_factory=tuple)


_JOB_KEYS = {
    "command",
    "resume_command",
    "env",
    "cwd",
    "grace_seconds",
    "start_timeout",
    "event_timeout",
    "attempt_timeout",
}
_TOP_KEYS = {"output", "jobs"}


def _command(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        parts = shlex.split(value)
    elif isinstance(value, Sequence) and all(isinstance(p, str) for p in value):
        parts = list(value)
    else:
        raise ConfigError(f"{where}: must be a string or a list of strings, got {value!r}")
    if not parts:
        raise ConfigError(f"{where}: must not be empty")
    return tuple(parts)


def job_from_mapping(name: str, table: Mapping[str, Any], source: str) -> JobSpec:
    """Build a job from one ``[tool.spotchaos.jobs.NAME]`` table, naming any bad key."""

    def where(key: str) -> str:
        return f"{source} [tool.spotchaos.jobs.{name}].{key}"

    if not isinstance(table, Mapping):
        raise ConfigError(f"{source} [tool.spotchaos.jobs.{name}]: must be a table")
    unknown = sorted(set(table) - _JOB_KEYS)
    if unknown:
        raise ConfigError(f"{where(unknown[0])}: unknown key (known: {', '.join(sorted(_JOB_KEYS))})")
    if "command" not in table:
        raise ConfigError(f"{where('command')}: required")
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{where('env')}: must be a table of strings")
    cwd = table.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{where('cwd')}: must be a string")
    kwargs: dict[str, Any] = {}
    for key in ("grace_seconds", "start_timeout", "event_timeout", "attempt_timeout"):
        if key in table:
            kwargs[key] = table[key]
    resume = table.get("resume_command")
    return JobSpec(
        name=name,
        command=_command(table["command"], where("command")),
        resume_command=_command(resume, where("resume_command")) if resume is not None else None,
        env=tuple(sorted(env.items())),
        cwd=cwd,
        source=source,
        **kwargs,
    )


def load_settings(pyproject: Path) -> Settings:
    """Read ``[tool.spotchaos]``; a missing file or table gives empty settings."""
    if not pyproject.is_file():
        return Settings()
    try:
        data = tomllib.loads(pyproject.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{pyproject}: not valid TOML: {exc}") from None
    table = data.get("tool", {}).get("spotchaos")
    if table is None:
        return Settings()
    if not isinstance(table, Mapping):
        raise ConfigError(f"{pyproject} [tool.spotchaos]: must be a table")
    unknown = sorted(set(table) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{pyproject} [tool.spotchaos].{unknown[0]}: unknown key (known: output, jobs)")
    output = table.get("output", Settings.output)
    if not isinstance(output, str) or not output:
        raise ConfigError(f"{pyproject} [tool.spotchaos].output: must be a non-empty string")
    jobs_table = table.get("jobs", {})
    if not isinstance(jobs_table, Mapping):
        raise ConfigError(f"{pyproject} [tool.spotchaos].jobs: must be a table of jobs")
    jobs = tuple(job_from_mapping(name, job, str(pyproject)) for name, job in jobs_table.items())
    return Settings(output=output, jobs=jobs)

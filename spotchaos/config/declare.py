"""The shape every ``[tool.spotchaos.KIND.NAME]`` table shares, jobs and services alike: a name
that can become part of a path, a command, only known keys, and messages that name the key.

Apart from ``jobs`` and ``services`` so that each imports it without
importing the other.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError

PYTHON_ALIASES = ("python", "python3")  # a command's first word that means the interpreter running pytest
JOB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
PHASE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")  # a phase a job marks: probe.phase(NAME), plan sigterm@S/NAME


def command_of(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        parts = shlex.split(value)
    elif isinstance(value, Sequence) and all(isinstance(p, str) for p in value):
        parts = list(value)
    else:
        raise ConfigError(f"{where}: must be a string or a list of strings, got {value!r}")
    if not parts:
        raise ConfigError(f"{where}: must not be empty")
    return tuple(parts)


def only_known(table: Any, where: str, known: set[str], shape: str = "a table") -> Mapping[str, Any]:
    """``table`` as a mapping of ``known`` keys only, or one ConfigError naming the first stray key."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: must be {shape}")
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    return table


def checked_table(
    kind: str, name: str, table: Any, source: str, known: set[str]
) -> tuple[Mapping[str, Any], Callable[[str], str]]:
    """A ``[tool.spotchaos.KIND.NAME]`` table with a command and only ``known`` keys, and the
    function that names one of its keys in a message (jobs and services alike)."""

    def where(key: str) -> str:
        return f"{source} [tool.spotchaos.{kind}.{name}].{key}"

    table = only_known(table, f"{source} [tool.spotchaos.{kind}.{name}]", known)
    if "command" not in table:
        raise ConfigError(f"{where('command')}: required")
    return table, where

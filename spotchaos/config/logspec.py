"""How a script that knows nothing of spotchaos is read: ``[tool.spotchaos.jobs.NAME.log]``.

A declaration, checked where it is written: the step and loss pattern (RE2, so no line the job
prints can stall the harness), the stream, the checkpoint glob and what a checkpoint's step key
means. ``spotchaos.training.logadapter`` reads a running job's output with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import re2

from ..errors import ConfigError
from .declare import PHASE_NAME

STREAMS = ("stdout", "stderr")
NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)"
# "step 12 loss 0.5", "step 12: loss=0.5", "iter 12: loss 0.5, time 3 ms": the step and the first
# loss after it. Two kinds of line that both match (nanoGPT's eval "step N: train loss" and its
# "iter N: loss") make the default refuse to guess: see LogEventReader.
DEFAULT_PATTERN = rf"\b(?:step|iter(?:ation)?)[ :=#]*(?P<step>\d+)\D+?loss[:= ]+(?P<loss>{NUMBER})"
# What checkpoint_step_key may hold, as its distance from the 0-based index of the last step the
# checkpoint contains, for a script whose printed steps start at ``first``.
CHECKPOINT_STEP_MEANINGS = {
    "completed": lambda first: 1,  # the number of steps done
    "last": lambda first: first,  # the printed number of the last step done
    "next": lambda first: first + 1,  # the printed number of the step to run next
}


@dataclass(frozen=True)
class LogSpec:
    pattern: str = DEFAULT_PATTERN
    stream: str = "stdout"
    checkpoints: str | None = None  # glob under the run's checkpoint directory, e.g. "*.pt"
    # path (or glob: the newest match) under the checkpoint directory, e.g. "ckpt.pt", "ckpt_*.pt"
    final_weights: str | None = None
    final_key: str | None = None  # the key holding the state dict ("model"); None: the file is one
    # The key in a checkpoint holding its step. Without it a checkpoint is credited to the last
    # step printed before the file was seen, which a fast script may already have passed; with it
    # the harness loads the file and knows.
    checkpoint_step_key: str | None = None
    # What that key holds ("completed", "last", "next") and the printed number of the first step
    # (0 or 1): None learns them from the uninterrupted run (see StepConvention).
    checkpoint_step: str | None = None
    first_step: int | None = None
    # Files that must exist beside a checkpoint before it counts as durable, as templates of its
    # name: "{name}.sha256" for a script that trusts a checkpoint once its digest is written.
    checkpoint_complete: tuple[str, ...] = ()
    # A line the script prints when it skips a checkpoint that does not verify (its rollback); a
    # named group "path" may name the skipped file.
    rollback_pattern: str | None = None
    # The phases the script prints (name, pattern of the line that begins it): ``eval`` begins at
    # "Running Evaluation" and ends at the next step line. A plan lands a fault inside one.
    phases: tuple[tuple[str, str], ...] = ()
    where: str = "log"

    def __post_init__(self) -> None:
        compiled = compiled_pattern(self.pattern, f"{self.where}.pattern")
        missing = [g for g in ("step", "loss") if g not in compiled.groupindex]
        if missing:
            raise ConfigError(
                f"{self.where}.pattern: {self.pattern!r} has no named group {' or '.join(repr(g) for g in missing)}: "
                "write (?P<step>\\d+) and (?P<loss>[-0-9.e+]+) where the step and the loss are printed"
            )
        if self.rollback_pattern is not None:
            compiled_pattern(self.rollback_pattern, f"{self.where}.rollback_pattern")
        if self.stream not in STREAMS:
            raise ConfigError(f"{self.where}.stream: must be stdout or stderr, got {self.stream!r}")
        for key in ("checkpoints", "final_weights"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or value.startswith("/") or ".." in value):
                raise ConfigError(f"{self.where}.{key}: must be a path under the checkpoint directory, got {value!r}")
        if self.checkpoint_step is not None and self.checkpoint_step not in CHECKPOINT_STEP_MEANINGS:
            raise ConfigError(
                f"{self.where}.checkpoint_step: must be one of {', '.join(map(repr, CHECKPOINT_STEP_MEANINGS))} "
                f"(what checkpoint_step_key holds), got {self.checkpoint_step!r}"
            )
        if self.checkpoint_step is not None and self.checkpoint_step_key is None:
            raise ConfigError(f"{self.where}.checkpoint_step: says what checkpoint_step_key holds; set that key too")
        if self.first_step is not None and (isinstance(self.first_step, bool) or self.first_step not in (0, 1)):
            raise ConfigError(
                f"{self.where}.first_step: the printed number of the first step, 0 or 1, got {self.first_step!r}"
            )
        for template in self.checkpoint_complete:
            if not isinstance(template, str) or (
                "{name}" not in template and "{stem}" not in template and not self.folder_per_checkpoint
            ):
                raise ConfigError(
                    f"{self.where}.checkpoint_complete: {template!r} must name a file beside the checkpoint "
                    "through {name} (its file name) or {stem} (without the suffix), e.g. '{name}.sha256'; "
                    "a fixed name only where each checkpoint has a folder of its own "
                    "(checkpoints = 'step_*/model.safetensors', checkpoint_complete = 'random_states_0.pkl')"
                )
            if "/" in template or ".." in template:
                raise ConfigError(f"{self.where}.checkpoint_complete: {template!r} must name a file in the same folder")
        for name, pattern in self.phases:
            if not PHASE_NAME.fullmatch(name):
                raise ConfigError(
                    f"{self.where}.phases: {name!r} is not a phase name (letters, digits, '-', '_', up to 32)"
                )
            compiled_pattern(pattern, f"{self.where}.phases.{name}")
        if self.checkpoint_complete and self.checkpoints is None:
            raise ConfigError(f"{self.where}.checkpoint_complete: needs checkpoints (the glob it completes)")

    @property
    def folder_per_checkpoint(self) -> bool:
        """Whether each checkpoint file sits in a folder of its own (``step_*/model.safetensors``,
        as accelerate's ``save_state`` and the Trainer write them): a file named alike beside it in
        that folder then belongs to it alone."""
        folder = (self.checkpoints or "").rpartition("/")[0]
        return any(c in folder for c in "*?[")

    @property
    def phase_regexes(self) -> list[tuple[str, Any]]:
        """Each phase's name and the compiled pattern of the line that begins it."""
        return [(name, compiled_pattern(pattern, f"{self.where}.phases.{name}")) for name, pattern in self.phases]

    def phase_pattern(self, name: str) -> str | None:
        """The pattern of the line that begins phase ``name`` (None: the script prints none)."""
        return dict(self.phases).get(name)

    @property
    def regex(self) -> Any:
        return compiled_pattern(self.pattern, f"{self.where}.pattern")

    @property
    def default_pattern(self) -> bool:
        return self.pattern == DEFAULT_PATTERN

    def describe(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "stream": self.stream,
            "checkpoints": self.checkpoints,
            "final_weights": self.final_weights,
            "final_key": self.final_key,
            "checkpoint_step_key": self.checkpoint_step_key,
            "checkpoint_step": self.checkpoint_step,
            "first_step": self.first_step,
            "checkpoint_complete": list(self.checkpoint_complete),
            "rollback_pattern": self.rollback_pattern,
            "phases": dict(self.phases),
        }

    def companions(self, path: Path) -> list[Path]:
        """The files that must exist beside ``path`` before it counts as a durable checkpoint."""
        return [
            path.with_name(t.replace("{name}", path.name).replace("{stem}", path.stem))
            for t in self.checkpoint_complete
        ]


def compiled_pattern(pattern: str, where: str) -> Any:
    """``pattern`` compiled by RE2: matching takes time linear in the line, whatever the job
    prints, so no line can stall the loop that enforces every timeout (Python's ``re`` backtracks:
    ``(a|aa)+$`` on one long line takes longer than any timeout). Look-arounds and back-references,
    which need backtracking, are refused in one line."""
    if not isinstance(pattern, str):
        raise ConfigError(f"{where}: must be a regular expression (a string), got {pattern!r}")
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ConfigError(
            f"{where}: {pattern!r} is not a regular expression RE2 can run in linear time ({reason}): "
            "spotchaos matches the job's output with RE2 so no line can stall its timeouts; write it without "
            "look-arounds or back-references"
        ) from None


_LOG_KEYS = {
    "pattern": str,
    "stream": str,
    "checkpoints": str,
    "final_weights": str,
    "final_key": str,
    "checkpoint_step_key": str,
    "checkpoint_step": str,
    "first_step": int,
    "checkpoint_complete": list,
    "rollback_pattern": str,
    "phases": dict,
}


def log_from_mapping(table: Any, where: str) -> LogSpec:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    unknown = sorted(set(table) - set(_LOG_KEYS))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(_LOG_KEYS))})")
    values = dict(table)
    if isinstance(values.get("checkpoint_complete"), str):
        values["checkpoint_complete"] = [values["checkpoint_complete"]]
    phases = values.pop("phases", {})
    if not isinstance(phases, dict) or not all(isinstance(v, str) for v in phases.values()):
        raise ConfigError(f"{where}.phases: must be a table of phase = pattern, e.g. {{ eval = 'Running Evaluation' }}")
    for key, value in values.items():
        kind = _LOG_KEYS[key]
        if (
            not isinstance(value, kind)
            or isinstance(value, bool)
            or (kind is list and not all(isinstance(v, str) for v in value))
        ):
            wanted = {str: "a string", int: "an integer", list: "a string or a list of strings"}[kind]
            raise ConfigError(f"{where}.{key}: must be {wanted}, got {value!r}")
    if "checkpoint_complete" in values:
        values["checkpoint_complete"] = tuple(values["checkpoint_complete"])
    return LogSpec(**values, phases=tuple(phases.items()), where=where)

"""Gate a training script that knows nothing of spotchaos: its printed log becomes the events.

Declared per job in ``[tool.spotchaos.jobs.NAME.log]``: a regular expression with named groups
``step`` and ``loss`` matched against stdout (or stderr), a glob for its checkpoint files, and
where its final weights are. The harness then reads what the script prints the way it reads the
probe's events: each matching line is a step, each new or rewritten checkpoint file is a
checkpoint, and a clean exit reads the final weights for the per-tensor digest comparison.
Checkpoint files are read without running the job's code in the harness
(:mod:`spotchaos.training.state.checkpoint_reader`), and links among them are never followed.

Printed losses carry only the digits the script prints, so the verdict says how many digits it
compared; a bit-exact claim needs the probe or the weights digest.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..config.logspec import CHECKPOINT_STEP_MEANINGS, NUMBER, LogSpec, compiled_pattern
from ..errors import ConfigError, JobError
from ..extras import require
from .checkpoint_scan import CheckpointScan
from .checkpoint_scan import event as new_event
from .events import MAX_LINE_SHOWN, MAX_STEP, Event, LineReader
from .state.checkpoint_reader import ConfinedLoad, read_checkpoint

ROLLBACK_REASON_CHARS = 200


@dataclass(frozen=True)
class StepConvention:
    """How a script counts: the printed number of its first step, and what its checkpoint's step
    key holds (its distance from the 0-based index of the last step the checkpoint contains).

    Scripts differ (``step 1`` or ``step 0`` first; a stored ``step`` that counts steps done or
    names the next one), and a wrong guess turns every checkpoint one step early or late: a red
    build on a correct script. So the uninterrupted run teaches it (see ``LogEventReader.learn``),
    an explicit setting overrides it, and the report says which.
    """

    first_step: int = 0
    key_offset: int | None = 1  # None: no step key, a checkpoint is credited to the last printed step
    learned_from: str = "the defaults"

    def report(self, spec: LogSpec) -> dict[str, Any]:
        """What the run record (and so the report) carries: the fields and their description."""
        return {**asdict(self), **self.describe(spec)}

    def describe(self, spec: LogSpec) -> dict[str, Any]:
        meaning = None
        if self.key_offset is not None:
            names = [n for n, f in CHECKPOINT_STEP_MEANINGS.items() if f(self.first_step) == self.key_offset]
            meaning = " = ".join(names)
        return {
            "first_step": self.first_step,
            "checkpoint_step_key": spec.checkpoint_step_key,
            "checkpoint_step": meaning,
            "learned_from": self.learned_from,
            "text": self.text(spec),
        }

    def text(self, spec: LogSpec) -> str:
        said = f"steps printed from {self.first_step}"
        if self.key_offset is not None:
            described = {
                self.first_step: "the printed number of the last step it holds",
                self.first_step + 1: "the printed number of the step to run next",
                1: "the number of steps completed",
            }
            said += f"; checkpoint key {spec.checkpoint_step_key!r} holds {described[self.key_offset]}"
        return f"{said} ({self.learned_from})"


def convention_from_dict(data: dict[str, Any] | None) -> StepConvention | None:
    if data is None:
        return None
    return StepConvention(data["first_step"], data["key_offset"], data["learned_from"])


def significant_digits(text: str) -> int:
    """Digits of a printed number that carry information: '0.012300' -> 5, '1.5e-03' -> 2."""
    mantissa = re.split(r"[eE]", text.strip().lstrip("+-"))[0]
    digits = mantissa.replace(".", "").lstrip("0")
    return max(1, len(digits)) if digits else 1


class LogEventReader:
    """Turns a script's output and checkpoint files into contract events, incrementally.

    Same surface as :class:`spotchaos.training.events.EventReader` (``read_new``, ``events``,
    ``torn_tail``, ``close``), plus ``finish`` for the final weights once the script exits 0 and
    ``learn`` for the uninterrupted run, which teaches the script's step convention. Steps in the
    events count from 0 whatever the script prints.
    """

    def __init__(
        self,
        lines: LineReader,
        spec: LogSpec,
        checkpoint_dir: Path,
        job: str,
        confined: ConfinedLoad | None = None,
        convention: StepConvention | None = None,
    ) -> None:
        # the script's printed lines: its log file, or a torchrun job's rank 0's own log
        # (multirank/torchrun.py), with how late a line may reach it (LineReader.latency)
        self._lines = lines
        self.confined = confined  # reads a checkpoint that needs a full unpickle, in the job's confinement
        self.spec = spec
        self.checkpoint_dir = checkpoint_dir
        self.job = job
        self.events: list[Event] = []
        # None: this is the uninterrupted run, which learns the convention (checked harder, too)
        self.learning = convention is None
        offset = CHECKPOINT_STEP_MEANINGS[spec.checkpoint_step](spec.first_step or 0) if spec.checkpoint_step else 1
        self.convention = convention or StepConvention(spec.first_step or 0, offset)
        self._regex = spec.regex
        rollback = spec.rollback_pattern
        self._rollback = compiled_pattern(rollback, f"{spec.where}.rollback_pattern") if rollback else None
        self._scan = CheckpointScan(spec, checkpoint_dir, confined)
        self._phases = spec.phase_regexes  # each phase the script prints, by the line that begins it
        self._in_phase: str | None = None
        self._last_step: int | None = None  # 0-based
        self._printed_first: int | None = None
        self._families: dict[str, str] = {}  # the default pattern's kinds of matched line -> an example
        self._started = False
        self.final_stored: int | None = None  # the step key of the final weights' file
        self.digits: int | None = None  # the fewest significant digits any compared loss had
        self.torn_tail = b""  # printed text has no torn events: a half line is just not a step yet
        if spec.checkpoint_step_key is not None or spec.final_weights is not None:
            # torch's first import takes seconds: done now, before the job starts, not at its first
            # checkpoint, while the job runs on and rotates that checkpoint away unseen
            require("torch", "torch", "reading a log-adapter job's checkpoints")

    def read_new(self) -> list[Event]:
        new: list[Event] = []
        for raw in self._lines.read_lines():
            new.extend(self._line(raw.decode("utf-8", "replace")))
        new.extend(self._scan.new(self._last_step, self.convention.key_offset))
        self.events.extend(new)
        return new

    def look_now(self) -> list[Event]:
        """Read what is new with a checkpoint scan now, whenever the last one was: before a fault
        is delivered, so each checkpoint already on disk is on the record as having come before it."""
        self._scan.look_now()
        return self.read_new()

    def _line(self, line: str) -> list[Event]:
        if self._rollback is not None and (rolled := self._rollback.search(line)) is not None:
            return [self._rollback_event(line, rolled)]
        for name, begins in self._phases:
            if begins.search(line):
                return [*self._phase_over(), self._phase_event(name, "begin")]
        found = self._regex.search(line)
        if found is None:
            return []
        printed, loss = self._step_and_loss(line, found)
        loss_text = found.group("loss")
        if self.learning:
            self._check_line(line, found, printed)
        events = []
        if not self._started:
            self._started = True
            events.append(new_event("start", schema=1, source="log"))
        if math.isfinite(loss):
            digits = significant_digits(loss_text)
            self.digits = digits if self.digits is None else min(self.digits, digits)
        events.extend(self._phase_over())  # a printed phase ends where the next step's line comes
        step = printed - self.convention.first_step
        self._last_step = step
        events.append(new_event("step", step=step, loss=loss.hex(), printed=loss_text))
        return events

    def _step_and_loss(self, line: str, found: Any) -> tuple[int, float]:
        """The step and loss a matched line prints; a :class:`JobError` naming the group that does
        not parse (rank 0's lines are held to it; another rank's line that fails it is left out)."""
        step_text, loss_text = found.group("step"), found.group("loss")
        try:
            printed = int(step_text)
        except (TypeError, ValueError):
            raise JobError(
                f"job {self.job!r}: {self.spec.where}.pattern matched {line.strip()!r} but its step group "
                f"{step_text!r} is not an integer"
            ) from None
        if not 0 <= printed < MAX_STEP:
            raise JobError(
                f"job {self.job!r}: {self.spec.where}.pattern matched a line whose step group is out of range "
                f"({len(step_text)} digits; from 0 to {MAX_STEP - 1}): {line.strip()[:MAX_LINE_SHOWN]!r}"
            )
        try:
            loss = float(loss_text)
        except (TypeError, ValueError):
            raise JobError(
                f"job {self.job!r}: {self.spec.where}.pattern matched {line.strip()!r} but its loss group "
                f"{loss_text!r} does not parse as a number"
            ) from None
        return printed, loss

    def rank_steps(self, rank: int, lines: list[str]) -> list[Event]:
        """Another rank's printed steps, counted as rank 0's are (after the uninterrupted run has
        taught the convention): each rank's own trajectory for the rank verdict. A line that does
        not parse is left out: rank 0's lines are the ones checked strictly."""
        events: list[Event] = []
        for line in lines:
            found = self._regex.search(line)
            if found is None:
                continue
            try:
                printed, loss = self._step_and_loss(line, found)
            except JobError:
                continue
            if not events:
                events.append(new_event("start", schema=1, source="log", rank=rank))
            step = printed - self.convention.first_step
            events.append(new_event("step", step=step, loss=loss.hex(), printed=found.group("loss"), rank=rank))
        return events

    def _phase_event(self, name: str, state: str) -> Event:
        if state == "begin":
            self._in_phase = name
        return new_event("phase", name=name, state=state, step=self._last_step)

    def _phase_over(self) -> list[Event]:
        """The end of the phase the script is in, if it is in one (as the probe's ``phase()`` says it)."""
        name, self._in_phase = self._in_phase, None
        return [] if name is None else [self._phase_event(name, "end")]

    def _check_line(self, line: str, found: Any, printed: int) -> None:
        """The uninterrupted run must print one matching line per step, counted from 0 or 1, and
        the default pattern must not be matching two kinds of line: every other judgment rests on it."""
        where = f"job {self.job!r}: {self.spec.where}.pattern"
        if self.spec.default_pattern:
            family = re.sub(NUMBER, "#", found.group(0))
            self._families.setdefault(family, line.strip()[:120])
            if len(self._families) > 1:
                examples = "; ".join(repr(e) for e in self._families.values())
                raise ConfigError(
                    f"{where}: the default pattern matches two kinds of line ({examples}) and will not guess which "
                    "one is the training step: set log.pattern to the line printed once per step, e.g. "
                    r"'iter (?P<step>\d+): loss (?P<loss>[-+0-9.eE]+|nan|inf)'"
                )
        if self._printed_first is None:
            self._printed_first = printed
            if self.spec.first_step is None:
                if printed not in (0, 1):
                    raise ConfigError(
                        f"{where}: the uninterrupted run's first matching line is step {printed} ({line.strip()!r}); "
                        "spotchaos needs a line for every step, counted from 0 or 1 (set log.first_step if the "
                        "script counts from 0 or 1 and prints something else first)"
                    )
                self.convention = replace(self.convention, first_step=printed)
            elif printed != self.spec.first_step:
                raise ConfigError(
                    f"{where}: log.first_step is {self.spec.first_step} but the uninterrupted run's first step line "
                    f"is step {printed} ({line.strip()!r})"
                )
        elif self._last_step is not None and printed - self.convention.first_step != self._last_step + 1:
            previous = self._last_step + self.convention.first_step
            raise ConfigError(
                f"{where}: the uninterrupted run printed step {printed} right after step {previous} "
                f"({line.strip()!r}): the pattern must match exactly one line per step (is it matching evaluation "
                "lines, or does the script log only every few steps? it must log every step)"
            )

    def _rollback_event(self, line: str, found: Any) -> Event:
        """The script says it skipped a checkpoint that did not verify: the probe's rollback event."""
        named = found.groupdict().get("path")
        uri = ""
        if named:
            path = Path(named)
            path = path if path.is_absolute() else self.checkpoint_dir / path
            uri = Path(os.path.normpath(path)).as_uri()  # as text, never resolved
        return new_event("rollback", skipped_uri=uri, reason=line.strip()[:ROLLBACK_REASON_CHARS])

    def finish(self, exit_code: int | None) -> None:
        """After a clean exit: the final event, with the weights' digests when they are configured."""
        if exit_code != 0:
            return
        digests: dict[str, str] = {}
        path = self._scan.final_path(self.job)
        if path is not None:
            digests, self.final_stored = final_state(path, self.spec, self.job, self.confined, self.checkpoint_dir)
        # A restart with nothing left to train prints no step: its final step is the last one the
        # final checkpoint holds, so the verdict sees where it resumed.
        step = self._last_step
        if step is None:
            offset = self.convention.key_offset
            step = self.final_stored - offset if self.final_stored is not None and offset is not None else -1
        self.events.append(new_event("final", step=step, digests=digests))

    def final_path(self) -> Path | None:
        """The final weights' file (see :meth:`CheckpointScan.final_path`)."""
        return self._scan.final_path(self.job)

    def learn(self) -> StepConvention:
        """After the uninterrupted run: the script's step convention (see :func:`learn_convention`),
        and the checkpoints seen during the run re-credited by it."""
        seen = RunSeen(
            first=self.convention.first_step,
            last=-1 if self._last_step is None else self._last_step,
            printed_first=self._printed_first,
            final_stored=self.final_stored,
            offset=self.convention.key_offset,
            line_latency=self._lines.latency,
        )
        self.convention = learn_convention(self.events, self.spec, self.job, seen)
        return self.convention

    def close(self) -> None:
        """The attempt is over: one last look for a checkpoint written just before the exit, and
        the results of every background read."""
        self.events.extend(self._scan.close(self._last_step, self.convention.key_offset))
        self._lines.close()


@dataclass(frozen=True)
class RunSeen:
    """What the uninterrupted run printed and stored, from which a script's convention is learned."""

    first: int  # the step number of the script's first step (its base)
    last: int  # the last step printed, 0-based (-1: none)
    printed_first: int | None  # the first step line's own number
    final_stored: int | None  # the step key of the final weights' file
    offset: int | None  # the step key's offset as configured, if it was
    line_latency: float = 0.0  # how late a printed line may reach the log (LineReader.latency)


def learn_convention(events: list[Event], spec: LogSpec, job: str, seen: RunSeen) -> StepConvention:
    """After the uninterrupted run: what the step key holds, from its newest checkpoint (the
    final weights' file, else the newest one seen) against the last step printed (``seen.last``,
    0-based). A script whose final checkpoint holds its last step tells it exactly; the
    checkpoints seen during the run (``events``), re-credited, are then checked against it."""
    first, last, printed_first, final_stored, offset = (
        seen.first,
        seen.last,
        seen.printed_first,
        seen.final_stored,
        seen.offset,
    )
    said = f"its first step line is step {printed_first}"
    sources = [said + (f" ({spec.where}.first_step)" if spec.first_step is not None else "")]
    if spec.checkpoint_step_key is None:
        offset = None
    elif spec.checkpoint_step is not None:
        sources.append(f"{spec.where}.checkpoint_step = {spec.checkpoint_step!r}")
    else:
        stored = [e["stored"] for e in events if e["event"] == "checkpoint" and "stored" in e]
        newest = final_stored if final_stored is not None else max(stored, default=None)
        candidates = {f(first) for f in CHECKPOINT_STEP_MEANINGS.values()}
        if newest is None or newest - last not in candidates:
            raise ConfigError(
                f"job {job!r}: {spec.where}.checkpoint_step_key {spec.checkpoint_step_key!r}: cannot tell "
                f"what it holds: the uninterrupted run's last step line is step {last + first} and its newest "
                f"checkpoint holds {newest} (a script that saves after its last step tells; else set "
                f"{spec.where}.checkpoint_step to 'completed', 'last' or 'next')"
            )
        offset = newest - last
        _check_not_ahead(events, offset, first, job, spec, seen.line_latency)
        sources.append(
            f"its newest checkpoint holds {spec.checkpoint_step_key}={newest} after step line {last + first}"
        )
    convention = StepConvention(first, offset, "learned from the uninterrupted run: " + "; ".join(sources))
    for event in events:  # re-credit what was seen while the convention was not known yet
        if event["event"] != "checkpoint" or "stored" not in event or offset is None:
            continue
        event["step"] = event["stored"] - offset
        if not -1 <= event["step"] <= last:
            raise ConfigError(
                f"job {job!r}: {spec.where}.checkpoint_step_key: a checkpoint of the uninterrupted run "
                f"holds {spec.checkpoint_step_key}={event['stored']}, which is no step the run printed when "
                f"{convention.text(spec)}"
            )
    return convention


def _check_not_ahead(
    events: list[Event], offset: int, first: int, job: str, spec: LogSpec, line_latency: float = 0.0
) -> None:
    """A reading of the step key under which most checkpoints appeared before the step line of
    the last step they would hold is wrong: the script saves before it runs that step (nanoGPT
    saves ``iter_num`` at its evaluation, before the step of that number), so its newest
    checkpoint does not hold its last step and cannot teach the convention. A script that saves
    right before printing is seen ahead only when the harness looks in that instant, rarely."""
    seen = [e for e in events if e["event"] == "checkpoint" and "stored" in e]
    steps = [(e["t"], e["step"]) for e in events if e["event"] == "step"]
    for e in seen:  # a line printed before the save may reach the log up to line_latency after the file
        late = [step for t, step in steps if t <= e["found_at"] + line_latency]
        e["seen_after"] = max([e["seen_after"], *late], key=lambda step: -1 if step is None else step)
    ahead = [e for e in seen if e["stored"] - offset > e["seen_after"]]
    if len(ahead) >= 2 and 2 * len(ahead) >= len(seen):
        key, example = spec.checkpoint_step_key, ahead[0]
        raise ConfigError(
            f"job {job!r}: {spec.where}.checkpoint_step_key {key!r}: cannot tell what it holds: read from its newest "
            f"checkpoint, {len(ahead)} of {len(seen)} checkpoints would hold a step whose line was not printed yet "
            f"when the file appeared ({key}={example['stored']} after step line {example['seen_after'] + first}): "
            f"the script saves before it runs the step it names; set {spec.where}.checkpoint_step "
            "(nanoGPT: 'completed')"
        )


def final_state(
    path: Path, spec: LogSpec, job: str, confined: ConfinedLoad | None = None, root: Path | None = None
) -> tuple[dict[str, str], int | None]:
    """Per-tensor digests of the state dict in ``path`` (under ``spec.final_key``, if given), and the
    steps completed it stores (``checkpoint_step_key``; None without one), read in one load."""
    where = f"job {job!r}: {spec.where}.final_weights"
    try:
        summary = read_checkpoint(
            path, spec.checkpoint_step_key, spec.final_key, confined, path.parent if root is None else root
        )
    except FileNotFoundError:
        raise JobError(f"{where}: {path} does not exist after a clean exit") from None
    except JobError as exc:
        raise JobError(f"{where}: {exc}") from None
    except Exception as exc:
        raise JobError(f"{where}: cannot load {path}: {exc}") from None
    if summary.get("digests") is None:
        if spec.final_key is not None:
            keys = ", ".join(map(repr, summary.get("keys") or [])) or summary.get("holds") or "not a dict"
            raise JobError(f"job {job!r}: {spec.where}.final_key {spec.final_key!r} is not in {path.name} ({keys})")
        raise JobError(
            f"job {job!r}: {path.name} holds a {summary.get('holds') or 'value'}, not a state dict: set final_key"
        )
    return summary["digests"], summary.get("step")

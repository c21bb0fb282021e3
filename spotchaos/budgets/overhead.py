"""Time budgets: what checkpointing costs a running job, and how fast it answers a notice.

Pure functions over a :class:`RunRecord`. Overhead is measured per checkpoint interval (the
checkpoint's blocking time over the training time since the previous one) and summarised by
the median with the first interval dropped as warm-up, so one slow first write (page cache,
allocator, lazy imports) does not decide the verdict. A figure that cannot be measured is
reported as unknown with the reason, never as zero.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ..training.trajectory import Attempt, RunRecord

WARMUP_INTERVALS = 1


@dataclass
class Overhead:
    budget: float
    fraction: float | None  # median checkpoint time / training time over intervals after warm-up
    intervals: list[float] = field(default_factory=list)
    checkpoint_seconds: float | None = None  # median blocking time of one checkpoint (C)
    step_seconds: float | None = None  # median step time
    interval_steps: float | None = None  # median steps between checkpoints
    checkpoint_bytes: int | None = None
    unknown_reason: str | None = None

    @property
    def passed(self) -> bool:
        return self.fraction is not None and self.fraction <= self.budget

    def message(self) -> str:
        if self.fraction is None:
            return f"checkpoint overhead unknown: {self.unknown_reason}"
        verdict = "within" if self.passed else "over"
        return (
            f"checkpoint overhead {self.fraction:.2%} of training time, {verdict} the budget of {self.budget:.2%} "
            f"(median of {len(self.intervals)} interval(s) after warm-up; one checkpoint blocks "
            f"{self.checkpoint_seconds:.3g} s every {self.interval_steps:g} step(s) of {self.step_seconds:.3g} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        return data


def measure_overhead(attempt: Attempt, budget: float, warmup: int = WARMUP_INTERVALS) -> Overhead:
    """Checkpoint overhead of one uninterrupted attempt."""
    fractions: list[float] = []
    steps_per: list[int] = []
    blocking: list[float] = []
    sizes: list[int] = []
    step_times: list[float] = []
    since, count = 0.0, 0
    missing_seconds = False
    for event in attempt.events:
        if event["event"] == "step":
            seconds = event.get("seconds")
            if not isinstance(seconds, int | float):
                missing_seconds = True
                continue
            step_times.append(float(seconds))
            since += float(seconds)
            count += 1
        elif event["event"] == "checkpoint" and count:
            fractions.append(float(event["seconds"]) / since if since > 0 else float("inf"))
            blocking.append(float(event["seconds"]))
            steps_per.append(count)
            sizes.append(int(event["bytes"]))
            since, count = 0.0, 0
    if missing_seconds:
        return Overhead(budget, None, unknown_reason="step events carry no 'seconds' (pass seconds= to probe.step)")
    if not fractions:
        return Overhead(
            budget,
            None,
            unknown_reason="the job reported no checkpoint after a step in its uninterrupted run "
            "(does it call probe.checkpoint?)",
        )
    kept = slice(warmup, None) if len(fractions) > warmup else slice(None)
    return Overhead(
        budget=budget,
        fraction=statistics.median(fractions[kept]),
        intervals=fractions[kept],
        checkpoint_seconds=statistics.median(blocking[kept]),
        step_seconds=statistics.median(step_times),
        interval_steps=statistics.median(steps_per[kept]),
        checkpoint_bytes=max(sizes),
    )


def fastest_of(measures: list[Overhead]) -> Overhead:
    """One figure from several uninterrupted runs of the same job: each interval at its fastest.

    Interval *k* of one run does the same work as interval *k* of another (same steps, same
    checkpoint), and noise on a busy machine only ever adds time, so the least of the runs'
    figures for an interval is the nearest to the job's own cost, as timeit keeps the best of its
    repeats. A checkpoint that is slow at the same interval in every run stays slow here; one slow
    fsync in one run does not. Runs that cut the job into different intervals are not paired: the
    lowest median of them is kept.
    """
    known = [m for m in measures if m.fraction is not None]
    if not known:
        return measures[0]
    if len({len(m.intervals) for m in known}) != 1 or len(known) == 1:
        return min(known, key=lambda m: m.fraction or 0.0)
    fastest = [min(values) for values in zip(*(m.intervals for m in known), strict=True)]
    base = min(known, key=lambda m: m.fraction or 0.0)
    return Overhead(
        budget=base.budget,
        fraction=statistics.median(fastest),
        intervals=fastest,
        checkpoint_seconds=min(m.checkpoint_seconds or 0.0 for m in known),
        step_seconds=base.step_seconds,
        interval_steps=base.interval_steps,
        checkpoint_bytes=base.checkpoint_bytes,
    )


@dataclass
class NoticeFlush:
    """From SIGTERM to a durable checkpoint, against the provider's grace window."""

    attempt: int
    fault: str
    window: float
    flush_seconds: float | None  # None: no checkpoint after the notice
    exit_seconds: float | None
    # A held job got the notice at a step boundary; a cloud's comes while a step runs, which the job
    # finishes first: up to one step (the attempt's median) is added to the saving time measured
    reach_seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.flush_seconds is not None and self.flush_seconds <= self.window / 2

    def message(self) -> str:
        if self.flush_seconds is None:
            return f"no durable checkpoint after the {self.fault} notice in attempt {self.attempt}"
        verdict = "within" if self.passed else "more than"
        parts = (
            f" (up to one step of {self.reach_seconds:.3g} s to reach a step boundary, then "
            f"{self.flush_seconds - self.reach_seconds:.3g} s to save)"
            if self.reach_seconds
            else ""
        )
        return (
            f"{self.fault}: checkpoint durable {self.flush_seconds:.3g} s after the notice{parts}, {verdict} half "
            f"the {self.window:g} s grace window (headroom for production)"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        return data


def notice_flushes(record: RunRecord) -> list[NoticeFlush]:
    """One entry per notice (SIGTERM) delivered in ``record``."""
    results = []
    for attempt in record.attempts:
        fault = attempt.fault
        if fault is None or fault.grace_seconds is None:
            continue
        after = [e for e in attempt.of_kind("checkpoint") if e["t"] >= fault.delivered_wall]
        flush = (after[0]["t"] - fault.delivered_wall) if after else None
        times = [e["t"] for e in attempt.of_kind("step") if e.get("rank", 0) == 0]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        reach = statistics.median(gaps) if fault.held and gaps else 0.0
        flush = None if flush is None else flush + reach
        results.append(NoticeFlush(attempt.index, fault.fault, fault.grace_seconds, flush, fault.exit_seconds, reach))
    return results


def checkpoint_blocking(run: RunRecord, unexplained_over: float) -> list[dict[str, Any]]:
    """How long each checkpoint held training up, attempt by attempt: the durable ones and the ones
    the job gave up (their own ``seconds``), plus every pause between two steps longer than
    ``unexplained_over`` seconds that no checkpoint event explains (a job retrying in silence)."""
    found: list[dict[str, Any]] = []
    for attempt in run.attempts:
        previous: dict[str, Any] | None = None
        explained = False
        for event in attempt.events:
            kind = event["event"]
            if kind in ("checkpoint", "checkpoint_failed"):
                outcome = "durable" if kind == "checkpoint" else "given up"
                found.append(
                    {
                        "attempt": attempt.index,
                        "step": event["step"],
                        "seconds": round(float(event["seconds"]), 4),
                        "outcome": outcome,
                        "reason": event.get("reason"),
                    }
                )
                explained = True
            elif kind == "step":
                if previous is not None and not explained:
                    pause = event["t"] - previous["t"] - float(event.get("seconds") or 0.0)
                    if pause > unexplained_over:
                        found.append(
                            {
                                "attempt": attempt.index,
                                "step": previous["step"],
                                "seconds": round(pause, 4),
                                "outcome": "unreported",
                                "reason": None,
                            }
                        )
                previous, explained = event, False
    return found

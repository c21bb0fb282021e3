"""Did the service drain through its reclaim notice? Pure functions over the load's records.

A request in flight at the notice must be answered in full; one sent after it may be refused (the
connection refused, or 503 with Retry-After) but never dropped or cut short; the service must stop
saying it is ready soon after the notice (the balancer takes it out of the traffic then), and be
gone by itself before the kill, with a margin. Latency in the steady state and during the drain
is reported, so a drain that "passes" by answering slowly is seen too.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .load import FAILED, RequestRecord

KILL_SLACK_SECONDS = 0.2  # a request that failed this close to the kill failed because of it


@dataclass
class DrainVerdict:
    passed: bool
    failures: list[str]
    figures: dict[str, Any] = field(default_factory=dict)

    def message(self) -> str:
        return "\n".join(f"- {f}" for f in self.failures) if self.failures else "drained"


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def _example(records: list[RequestRecord]) -> str:
    first = records[0]
    return f"{first.outcome}" + (f" ({first.detail})" if first.detail else f" (status {first.status})")


@dataclass
class _Requests:
    """One run's requests by when they were sent: done before the notice, in flight at it, sent
    after it to the draining instance, and the replacement's."""

    before: list[RequestRecord]
    in_flight: list[RequestRecord]
    after: list[RequestRecord]
    by_replacement: list[RequestRecord]

    @classmethod
    def of(cls, records: list[RequestRecord], notice_at: float, replacement_at: float | None) -> _Requests:
        before = [r for r in records if r.ended <= notice_at]
        in_flight = [r for r in records if r.started < notice_at < r.ended]
        if any(r.instance for r in records):  # a balancer said which instance answered each request
            by_replacement = [r for r in records if r.instance == "replacement"]
            after = [r for r in records if r.started >= notice_at and r.instance != "replacement"]
        else:  # one address: from its launch on, the replacement's
            cutoff = replacement_at if replacement_at is not None else float("inf")
            after = [r for r in records if notice_at <= r.started < cutoff]
            by_replacement = [r for r in records if r.started >= cutoff]
        return cls(before, in_flight, after, by_replacement)


@dataclass(frozen=True)
class DrainTimeline:
    """What one drain did, in ``time.monotonic()`` seconds: the notice, the instance's end
    (``killed``: still up at the deadline, notice + the notice's seconds, and SIGKILLed); when the
    harness had delivered the notice (None: at ``notice_at``), whose lateness is the harness's (a
    loaded machine, a container's API) and not counted against the service's margin; when the
    replacement was launched (requests from then on are the replacement's, judged apart); when its
    readiness check first failed after the notice (None: not watched); how it took a metadata notice."""

    notice_at: float
    exited_at: float
    killed: bool
    delivered_at: float | None = None
    replacement_at: float | None = None
    unready_at: float | None = None
    channel_note: str = ""


@dataclass(frozen=True)
class DrainBounds:
    """What a drain must fit: the notice's seconds, less the margin it must leave; the seconds the
    platform allows the instance to stay ready after the notice (None: any)."""

    notice_seconds: float
    margin: float
    unready_bound: float | None = None


def judge_drain(records: list[RequestRecord], timeline: DrainTimeline, bounds: DrainBounds) -> DrainVerdict:
    """The verdict on ``records`` of one run, under what the drain did and what it must fit."""
    notice_at, exited_at, killed = timeline.notice_at, timeline.exited_at, timeline.killed
    delivered_at, replacement_at, unready_at = timeline.delivered_at, timeline.replacement_at, timeline.unready_at
    requests = _Requests.of(records, notice_at, replacement_at)
    late = max(0.0, (delivered_at if delivered_at is not None else notice_at) - notice_at)
    # a kill loses what is in flight at that moment: said with the kill, not as a refusal gone wrong
    at_kill = [
        r for r in requests.after if killed and r.outcome in FAILED and r.ended >= exited_at - KILL_SLACK_SECONDS
    ]
    failures = _request_failures(requests, at_kill)
    accepted = [r for r in requests.after if r.outcome == "ok" and r.ended <= exited_at + KILL_SLACK_SECONDS]
    ending = _ending_failure(requests, at_kill, accepted, timeline, bounds, late)
    failures.extend([ending] if ending else [])
    readiness: dict[str, Any] = {}
    if unready_at is not None:
        readiness, unready = _readiness(records, notice_at, exited_at, unready_at, bounds.unready_bound)
        failures.extend(unready)
    steady = [r.ended - r.started for r in requests.before if r.outcome == "ok"]
    during = [r.ended - r.started for r in requests.in_flight + accepted if r.outcome == "ok"]
    figures = {
        "drain_seconds": round(exited_at - notice_at, 3),
        "harness_delivery_seconds": round(late, 3),  # of drain_seconds: the harness's, before the service had it
        "killed": killed,
        "notice_seconds": bounds.notice_seconds,
        "requests": len(records),
        "before_notice": dict(Counter(r.outcome for r in requests.before)),
        "in_flight_at_notice": dict(Counter(r.outcome for r in requests.in_flight)),
        "after_notice": dict(Counter(r.outcome for r in requests.after)),
        "replacement_requests": dict(Counter(r.outcome for r in requests.by_replacement)),
        "failed": len([r for r in records if r.outcome in FAILED]),
        "steady_p50": _percentile(steady, 0.5),
        "steady_p99": _percentile(steady, 0.99),
        "drain_p50": _percentile(during, 0.5),
        "drain_p99": _percentile(during, 0.99),
        **readiness,
    }
    return DrainVerdict(passed=not failures, failures=failures, figures=figures)


def _request_failures(requests: _Requests, at_kill: list[RequestRecord]) -> list[str]:
    """What went wrong with the requests themselves: the steady state, those in flight at the
    notice, those sent after it, and the replacement's."""
    failures: list[str] = []
    before = requests.before
    steady_failed = [r for r in before if r.outcome in FAILED or r.outcome in ("refused", "unavailable")]
    if not any(r.outcome == "ok" for r in before):
        failures.append("no request succeeded before the notice: the service never served its steady state")
    elif steady_failed:
        failures.append(
            f"{len(steady_failed)} of {len(before)} request(s) failed before any notice, e.g. {_example(steady_failed)}"
        )
    lost = [r for r in requests.in_flight if r.outcome in FAILED]
    if lost:
        failures.append(
            f"{len(lost)} of {len(requests.in_flight)} request(s) in flight at the notice were not answered in full, "
            f"e.g. {_example(lost)}: finish in-flight requests before exiting (a graceful shutdown timeout, not 0)"
        )
    dropped = [r for r in requests.after if r.outcome in FAILED and r not in at_kill]
    if dropped:
        failures.append(
            f"{len(dropped)} request(s) sent after the notice were dropped instead of refused, e.g. "
            f"{_example(dropped)}: after the notice answer 503 with Retry-After or refuse the connection, never reset "
            "one with a request on it"
        )
    no_retry = [r for r in requests.after if r.outcome == "unavailable" and not r.retry_after]
    if no_retry:
        failures.append(f"{len(no_retry)} request(s) after the notice got 503 without Retry-After: say when to retry")
    replacement_failed = [r for r in requests.by_replacement if r.outcome in FAILED]
    if replacement_failed:
        failures.append(
            f"{len(replacement_failed)} request(s) sent once the replacement was launched failed, e.g. "
            f"{_example(replacement_failed)}: until it is ready it must refuse, not drop"
        )
    return failures


def _ending_failure(
    requests: _Requests,
    at_kill: list[RequestRecord],
    accepted: list[RequestRecord],
    timeline: DrainTimeline,
    bounds: DrainBounds,
    late: float = 0.0,
) -> str | None:
    """How the instance ended: killed at the deadline (and what that says of its drain), or gone
    by itself with less than the margin left, the harness's own lateness in delivering the notice
    not counted against it; None when it left in time."""
    notice_at, notice_seconds, margin = timeline.notice_at, bounds.notice_seconds, bounds.margin
    drain = timeline.exited_at - notice_at - late
    killed, channel_note = timeline.killed, timeline.channel_note
    if killed:
        text = f"the drain was not over at the kill: the service still ran {notice_seconds:g} s after the notice"
        if at_kill:
            text += f", and the kill lost {len(at_kill)} request(s) in flight"
        if accepted and max(r.started for r in accepted) > notice_at + notice_seconds / 2:
            last = max(r.started for r in accepted) - notice_at
            text += f" and kept accepting new requests until {last:.1f} s after it: stop accepting at the notice"
        elif not any(r.outcome in ("refused", "unavailable") for r in requests.after):
            text += " and never refused a request: did the notice reach it?"
        if channel_note:  # how the service took the metadata notice, if at all
            text += f" ({channel_note})"
        return text
    if drain > notice_seconds - margin:
        harness = f" (not counting the harness's {late:.2f} s to deliver the notice)" if late >= 0.005 else ""
        return (
            f"the drain took {drain:.2f} s of a {notice_seconds:g} s notice{harness}: less than the {margin:g} s "
            "margin was left"
        )
    return None


def _readiness(
    records: list[RequestRecord], notice_at: float, exited_at: float, unready_at: float, unready_bound: float | None
) -> tuple[dict[str, Any], list[str]]:
    """How long the instance still said it was ready after the notice, and what the platform routed
    to it meanwhile: (the figures, the failure when that was past the bound)."""
    kept_ready = max(unready_at - notice_at, 0.0)
    routed = [r for r in records if notice_at <= r.started < unready_at and r.instance in (None, "first")]
    figures = {
        "ready_after_notice_seconds": round(kept_ready, 3),
        "unready_bound_seconds": unready_bound,
        "routed_while_ready": len(routed),
        "routed_while_ready_outcomes": dict(Counter(r.outcome for r in routed)),
    }
    if unready_bound is None or kept_ready <= unready_bound:
        return figures, []
    gone = " (until it was gone)" if unready_at >= exited_at - KILL_SLACK_SECONDS else ""
    turned = sum(r.outcome in ("refused", "unavailable") or r.outcome in FAILED for r in routed)
    return figures, [
        f"the service kept answering its readiness check 200 for {kept_ready:.2f} s after the notice{gone}, "
        f"past the {unready_bound:g} s the platform allows (unready_within_seconds): the platform routed "
        f"{len(routed)} request(s) to it meanwhile, {turned} of them refused or failed; fail the readiness "
        "check at the notice, before draining, so the balancer takes the instance out of the traffic"
    ]


def judge_replacement(
    *,
    where: str,
    failure: str | None,
    model_updated: bool,
    answer_before: bytes | None,
    answer_after: bytes | None,
) -> list[str]:
    """The replacement's own verdict. ``failure``: why it never served (it died, it went over its
    type's memory, it was never ready); the answers are the first full answer of each instance to
    the same request, compared only when the service loads a model (a changed model must change
    the answer, an unchanged one must not)."""
    if failure is not None:
        return [f"the replacement never served: {failure}"]
    if answer_before is None or answer_after is None:
        return []
    if model_updated and answer_after == answer_before:
        return [
            f"the model object changed in S3 before the replacement started, but the replacement on {where} "
            "answered exactly as the old model did: it served a stale cache (check the cached copy against "
            "the object's ETag or digest before serving it)"
        ]
    if not model_updated and answer_after != answer_before:
        return [
            f"the replacement on {where} answered the same request differently from the first instance on the "
            "same model object: it did not load the model the first one served (or its answers are not "
            "deterministic, and a stale cache cannot be told from a fresh one)"
        ]
    return []


def longest_gap(records: list[RequestRecord], notice_at: float) -> float | None:
    """The longest stretch from the notice on with no request answered: the capacity the reclaim
    cost users (a replacement started at the notice behind a balancer shortens it)."""
    ends = sorted(r.ended for r in records if r.outcome == "ok" and r.ended >= notice_at)
    if not ends:
        return None
    points = [notice_at, *ends]
    return round(max(b - a for a, b in itertools.pairwise(points)), 3)

"""Two saved reports side by side: what changed, and whether it is a regression.

Like ``pytest-benchmark compare --fail``: the user names the thresholds (``--fail-on``) that
turn a change into a failing exit status, so a CI job can gate a merge on "no new broken
resume" and "checkpoint overhead grew by at most 20 %". Plain functions over two documents.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .summary import lost_steps

METRICS = {
    "overhead": "checkpoint overhead fraction",
    "restart": "restart latency (s, median)",
    "flush": "notice flush (s, worst)",
    "lost": "lost steps",
}


@dataclass(frozen=True)
class FailRule:
    """``verdict`` (a pass became a failure) or ``METRIC:PCT%`` (grew by more than PCT %)."""

    metric: str
    percent: float | None = None

    @classmethod
    def parse(cls, text: str) -> FailRule:
        if text == "verdict":
            return cls("verdict")
        metric, _, amount = text.partition(":")
        if metric not in METRICS or not amount.endswith("%"):
            raise ConfigError(
                f"--fail-on {text!r}: expected 'verdict' or METRIC:PCT% with METRIC one of "
                f"{', '.join(METRICS)} (e.g. overhead:20%)"
            )
        try:
            percent = float(amount[:-1])
        except ValueError:
            raise ConfigError(f"--fail-on {text!r}: {amount!r} is not a percentage") from None
        if not 0 <= percent < 1e6:
            raise ConfigError(f"--fail-on {text!r}: the percentage must be between 0 and 1e6")
        return cls(metric, percent)

    def __str__(self) -> str:
        return self.metric if self.percent is None else f"{self.metric}:{self.percent:g}%"


@dataclass
class Change:
    scenario: str
    what: str
    before: Any
    after: Any
    regression: str | None = None  # the rule it breaks, if any

    def describe(self, gating: bool = True) -> str:
        """One line; a change that breaks a rule is a REGRESSION when rules gate, else "worse"."""
        text = f"{self.scenario}: {self.what} {_show(self.before)} -> {_show(self.after)}"
        if not self.regression:
            return text
        return text + (f"  REGRESSION ({self.regression})" if gating else "  (worse)")


@dataclass
class Comparison:
    changes: list[Change] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    def decision(self) -> str:
        return "roll back" if self.regressions else "continue"


def _show(value: Any) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def metrics(scenario: dict[str, Any]) -> dict[str, float | None]:
    """The comparable figures of one scenario (None where the run did not measure them)."""
    runs = scenario.get("runs") or []
    restarts = [x for r in runs for x in (r.get("restart_seconds") or []) if isinstance(x, int | float)]
    figures = scenario.get("figures") or {}
    flushes = [f.get("flush_seconds") for f in figures.get("notice_flush", []) if f.get("flush_seconds") is not None]
    return {
        "overhead": (figures.get("overhead") or {}).get("fraction"),
        "restart": statistics.median(restarts) if restarts else None,
        "flush": max(flushes) if flushes else None,
        "lost": float(lost_steps(scenario)) if runs else None,
    }


def _key(scenario: dict[str, Any]) -> str:
    return f"{scenario.get('scenario')} [{scenario.get('job')}]"


def compare(before: dict[str, Any], after: dict[str, Any], rules: list[FailRule]) -> Comparison:
    """Every change from ``before`` to ``after``, each checked against ``rules``."""
    result = Comparison()
    old = {_key(s): s for s in before.get("scenarios", [])}
    new = {_key(s): s for s in after.get("scenarios", [])}
    by_metric = {r.metric: r for r in rules}
    for key in sorted(old.keys() | new.keys()):
        if key not in new:
            result.changes.append(Change(key, "scenario", "present", "removed"))
            continue
        if key not in old:
            verdict = "pass" if new[key].get("passed") else "fail"
            broke = "verdict" if verdict == "fail" and "verdict" in by_metric else None
            result.changes.append(Change(key, "scenario (new)", "absent", verdict, broke))
            continue
        was, now = bool(old[key].get("passed")), bool(new[key].get("passed"))
        if was != now:
            broke = "verdict" if was and not now and "verdict" in by_metric else None
            result.changes.append(Change(key, "verdict", "pass" if was else "fail", "pass" if now else "fail", broke))
        a, b = metrics(old[key]), metrics(new[key])
        for metric, label in METRICS.items():
            if a[metric] == b[metric] or (a[metric] is None and b[metric] is None):
                continue
            rule = by_metric.get(metric)
            broke = None
            if rule is not None and a[metric] is not None and b[metric] is not None:
                limit = a[metric] * (1 + rule.percent / 100)
                if b[metric] > limit and b[metric] > a[metric]:
                    broke = str(rule)
            result.changes.append(Change(key, label, a[metric], b[metric], broke))
    return result

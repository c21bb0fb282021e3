"""Comparing two reports: what changed, and which change breaks a --fail-on rule."""

from __future__ import annotations

import pytest

from spotchaos.errors import ConfigError
from spotchaos.report.compare import FailRule, compare

pytestmark = pytest.mark.unit  # starts no process: part of the fast loop (pytest -m unit)


def scenario(name: str, passed: bool = True, overhead: float | None = 0.02, restart: float = 2.0) -> dict:
    return {
        "scenario": name,
        "job": "ref",
        "passed": passed,
        "runs": [{"lost_steps": 0, "restart_seconds": [restart]}],
        "figures": {"overhead": {"fraction": overhead}},
    }


def doc(*scenarios: dict) -> dict:
    return {"scenarios": list(scenarios)}


def test_overhead_growth_beyond_the_threshold_is_a_regression_and_within_it_is_not():
    rules = [FailRule.parse("overhead:20%")]
    within = compare(doc(scenario("a", overhead=0.020)), doc(scenario("a", overhead=0.0239)), rules)
    beyond = compare(doc(scenario("a", overhead=0.020)), doc(scenario("a", overhead=0.0241)), rules)
    assert within.regressions == [] and within.decision() == "continue"
    assert [c.what for c in beyond.regressions] == ["checkpoint overhead fraction"]
    assert beyond.decision() == "roll back"
    assert "0.02 -> 0.0241  REGRESSION (overhead:20%)" in beyond.regressions[0].describe()


def test_verdict_rule_catches_a_new_failure_and_a_new_failing_scenario_only():
    rules = [FailRule.parse("verdict")]
    result = compare(
        doc(scenario("a"), scenario("b", passed=False), scenario("gone")),
        doc(scenario("a", passed=False), scenario("b"), scenario("new", passed=False)),
        rules,
    )
    broken = sorted(c.scenario for c in result.regressions)
    assert broken == ["a [ref]", "new [ref]"]
    assert any(c.scenario == "gone [ref]" and c.after == "removed" for c in result.changes)


def test_without_rules_changes_are_listed_but_nothing_fails():
    result = compare(doc(scenario("a", restart=2.0)), doc(scenario("a", passed=False, restart=9.0)), [])
    assert {c.what for c in result.changes} == {"verdict", "restart latency (s, median)"}
    assert result.regressions == []


def test_unknown_figures_are_never_a_regression():
    result = compare(
        doc(scenario("a", overhead=None)), doc(scenario("a", overhead=0.5)), [FailRule.parse("overhead:0%")]
    )
    assert result.regressions == [] and result.changes[0].before is None


@pytest.mark.parametrize("text", ["overhead", "overhead:20", "speed:5%", "restart:x%", "restart:-5%"])
def test_bad_rules_name_the_problem(text):
    with pytest.raises(ConfigError, match="--fail-on"):
        FailRule.parse(text)

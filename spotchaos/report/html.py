"""The report as one self-contained HTML page, for the person who has to decide what broke.

Rendered from the JSON document alone, so ``spotchaos report`` re-renders a saved run the same
way. Jinja2 with autoescape on: trainer output (error messages quote stderr) reaches the page,
and a ``<script>`` in a log must stay text. ANSI colour codes are stripped first; plots are PNGs
embedded as data URIs, so the file can be attached to a CI run and opened anywhere.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from ..extras import require
from .gate_cost import PARTS
from .plots import divergence_png, requests_png, trajectory_png
from .summary import comparison_notes, figure_lines, landing, lost_steps_shown, verdict_word

jinja2 = require("jinja2", "html", "report.html")

ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("spotchaos", "templates"),
    autoescape=True,  # the template is HTML whatever its file suffix
    undefined=jinja2.ChainableUndefined,  # older schema-1 reports lack newer optional fields
    trim_blocks=True,
    lstrip_blocks=True,
)


def strip_terminal_codes(value: Any) -> Any:
    """Text with ANSI escapes and other control characters removed (recursively)."""
    if isinstance(value, str):
        return CONTROL.sub("", ANSI_ESCAPE.sub("", value))
    if isinstance(value, dict):
        return {k: strip_terminal_codes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_terminal_codes(v) for v in value]
    return value


def _fault_text(fault: dict[str, Any]) -> str:
    """A fault as it happened: ``sigterm after step 5``; a crash point names the file-system event
    it died before, and a crash during a restart's load is before the first step, not "at -1"."""
    step = fault.get("landed_step", fault.get("observed_step"))
    step = fault.get("observed_step") if step is None else step
    when = f"after step {step}" if isinstance(step, int) and step >= 0 else "before the first step"
    if fault.get("at_fs_event") is not None:  # a crash point (crash, crash-rankR)
        return f"crash {fault.get('detail') or ''}, {when}".replace(" ,", ",")
    late = fault.get("steps_late")
    how = " (held)" if fault.get("held") else f" ({late} step(s) late)" if isinstance(late, int) and late else ""
    return f"{fault.get('fault')} {when}{how}"


def _mib(memory: dict[str, Any] | None) -> str:
    rss = (memory or {}).get("max_rss")
    text = "?" if rss is None else f"{rss / 2**20:.0f} MiB"
    gpu = (memory or {}).get("gpu_max_allocated")
    return text if gpu is None else f"{text} (GPU {gpu / 2**20:.0f} MiB)"


def _job_text(job: dict[str, Any]) -> str:
    return json.dumps(job, indent=2, sort_keys=True, default=str)


def _plots(scenario: dict[str, Any], divergence: dict[str, Any] | None) -> list[dict[str, str]]:
    name = scenario.get("scenario", "")
    plots = [
        {
            "alt": f"requests of {name} by outcome over time, with the notice and the kill marked",
            "png": requests_png(item, f"service {item.get('service')}: requests by outcome ({item.get('channel')})"),
        }
        for item in (scenario.get("figures") or {}).get("serving", [])
        if item.get("timeline")
    ]
    trajectory = scenario.get("trajectory")
    if trajectory and trajectory.get("points"):
        plots.insert(
            0,
            {
                "alt": f"loss trajectory of {name}: reference and chaos run",
                "png": trajectory_png(trajectory, f"{scenario.get('job')}: plan {trajectory.get('plan') or 'none'}"),
            },
        )
    if trajectory and divergence and isinstance(divergence.get("step"), int):
        step = divergence["step"]
        plots.append(
            {
                "alt": f"divergence of {name} at step {step}",
                "png": divergence_png(trajectory, step, f"first divergence: step {step} ({divergence.get('field')})"),
            }
        )
    for plot in plots:
        plot["png"] = base64.b64encode(plot["png"]).decode("ascii")
    return plots


def _scenario_view(scenario: dict[str, Any]) -> dict[str, Any]:
    verdict = scenario.get("verdict") or {}
    divergence = verdict.get("first_divergence")
    failures = [] if scenario.get("passed") else (verdict.get("failures") or [])
    return {
        **scenario,
        "runs": scenario.get("runs") or [],
        "failures": failures,
        "divergence": divergence,
        "trajectory": scenario.get("trajectory"),
        "plots": _plots(scenario, divergence),
        "figure_lines": figure_lines(scenario.get("figures") or {}),
        "notes": comparison_notes(scenario),
        "error": scenario.get("error"),
        "failing_plan": scenario.get("failing_plan"),
        "replay": scenario.get("replay", ""),
    }


def _cost_bars(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario that ran training runs: its seconds of start-up, training and harness as
    percentages of the costliest scenario's total (the bars of the gate-cost table)."""
    rows = []
    for scenario in scenarios:
        cost = scenario.get("cost") or {}
        if cost.get("runs"):
            parts = [float(cost.get(key) or 0.0) for key in PARTS]
            rows.append({"scenario": scenario.get("scenario"), "cost": cost, "parts": parts})
    top = max((sum(row["parts"]) for row in rows), default=0.0) or 1.0
    for row in rows:
        row["widths"] = [round(100 * part / top, 1) for part in row["parts"]]
    return rows


def render_html(document: dict[str, Any]) -> str:
    """The page for one report document (already redacted by ``build_report``)."""
    document = strip_terminal_codes(document)
    environment = document.get("environment") or {}
    return _ENV.get_template("report.html.j2").render(
        document=document,
        summary=document.get("summary") or {"passed": 0, "scenarios": 0},
        decision=document.get("decision") or {"decision": "unknown", "why": "not recorded"},
        scenarios=[_scenario_view(s) for s in document.get("scenarios", [])],
        environment=sorted((k, v) for k, v in environment.items()),
        jobs=document.get("jobs") or [],
        gate_costs=document.get("cost") or {},
        cost_bars=_cost_bars(document.get("scenarios", [])),
        verdict_word=verdict_word,
        fault_text=_fault_text,
        lost_steps=lost_steps_shown,
        landing=landing,
        mib=_mib,
        job_text=_job_text,
    )

"""The report as Markdown: the CI job summary a person reads first.

Rendered from the JSON document alone (so a saved report renders the same later). Trainer text
that reaches the tables (failure messages quote its output, values and paths) is made inert:
markup and bare URLs escaped, control characters shown as escapes, one line per cell.
"""

from __future__ import annotations

from typing import Any

from ..safety.sanitize import markdown_text, visible
from .summary import (
    comparison_notes,
    drain_line,
    landing,
    lost_steps_shown,
    service_lines,
    storage_line,
    verdict_word,
    world_line,
)


def _cell(value: Any) -> str:
    """Text that may quote the job (failures, errors, figures' messages), for a table cell or a
    list item: inert Markdown (see spotchaos.safety.sanitize), on one line."""
    text = "" if value is None else str(value)
    return " ".join(markdown_text(text).split())  # newlines would end the table row


def _nodes(nodes: list) -> str:
    """One run's attempts on a cluster: each one's node and what the fault did to it, in order."""
    shown = []
    for placement in nodes:
        placement = placement or {}
        inner = placement.get("torchrun_nodes")
        names = "+".join(str((p or {}).get("node")) for p in inner) if inner else str(placement.get("node"))
        fault = placement.get("fault")
        shown.append(f"{names} ({fault})" if fault else names)
    return " -> ".join(shown)


def _name(value: Any) -> str:
    """The user's own names (pytest node ids, job names, plans): pipes escaped, on one line, and
    otherwise as written, so ``test_x.py::test[job]`` reads as itself in the raw file too."""
    text = visible("" if value is None else str(value)).replace("|", "\\|").replace("<", "&lt;")
    return " ".join(text.split())


def _code(value: Any) -> str:
    """Text for a code span (a replay command): no backtick can end it early, no control byte."""
    return " ".join(visible("" if value is None else str(value)).replace("`", "'").split())


def _verdict(scenario: dict[str, Any]) -> str:
    return {"pass": "✅ pass", "fail": "❌ fail", "error": "❌ error"}[verdict_word(scenario)]


def _decision(document: dict[str, Any]) -> str:
    decision = document.get("decision") or {"decision": "unknown", "why": "not recorded"}
    return f"**Decision: {_cell(decision.get('decision'))}** — {_cell(decision.get('why'))}"


def render_markdown(document: dict[str, Any]) -> str:
    summary = document.get("summary", {})
    env = document.get("environment", {})
    lines = [
        "# spotchaos report",
        "",
        f"**{summary.get('passed', 0)} of {summary.get('scenarios', 0)} scenarios passed** — seed "
        f"`{document.get('seed')}`, profile `{document.get('profile')}`, {document.get('started')} to "
        f"{document.get('finished')}",
        "",
        f"Python {env.get('python')}, torch {env.get('torch')}, CUDA {env.get('cuda') or 'none'}, "
        f"{env.get('platform')}, {env.get('cpu_count')} CPUs, commit `{env.get('git_commit') or 'unknown'}`",
        "",
        _decision(document),
        "",
        "| verdict | scenario | job | plans | lost steps | faults landed | failing plan |",
        "| --- | --- | --- | ---: | ---: | --- | --- |",
    ]
    scenarios = document.get("scenarios", [])
    for s in scenarios:
        lost = lost_steps_shown(s)
        lines.append(
            f"| {_verdict(s)} | {_name(s.get('scenario'))} | {_name(s.get('job'))} | {s.get('plans_tried', 0)} "
            f"| {lost} | {landing(s)} | {_name(s.get('failing_plan'))} |"
        )
    costs = document.get("cost") or {}
    if costs:
        head = "| job | gate cost | runs | starts | steps | credited | start-up | training | harness | GPU-seconds |"
        lines += ["", head]
        lines += ["| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for job, c in costs.items():
            worth = "unknown" if c.get("runs_worth") is None else f"{c['runs_worth']:g} runs' worth"
            lines.append(
                f"| {_name(job)} | {worth} | {c.get('runs')} | {c.get('starts')} | {c.get('steps')} "
                f"| {c.get('prefix_steps') or 0} | {c.get('startup_seconds', 0):.0f} s "
                f"| {c.get('training_seconds', 0):.0f} s | {c.get('harness_seconds', 0):.0f} s "
                f"| {c.get('gpu_seconds') or 0:.0f} |"
            )
    if document.get("interrupted"):
        lines += ["", f"**Interrupted by {_cell(document['interrupted'])}**: not every scenario ran."]
    escaped = [(s, p) for s in scenarios for r in s.get("runs", []) for p in r.get("escaped_processes") or []]
    if escaped:
        lines += ["", "## Warnings", ""]
        lines += [
            f"- {_name(s.get('scenario'))}: left the job's process group and was ended: {_cell(p)}" for s, p in escaped
        ]
    placed = [(s, r) for s in scenarios for r in s.get("runs", []) if r.get("nodes")]
    if placed:
        lines += ["", "## Where attempts ran", ""]
        lines += [
            f"- {_name(s.get('scenario'))}, `{_code(r.get('plan'))}`: {_cell(_nodes(r['nodes']))}" for s, r in placed
        ]
    failed = [s for s in scenarios if not s.get("passed")]
    if failed:
        lines += ["", "## What went wrong", ""]
        for s in failed:
            lines.append(f"### {_name(s.get('scenario'))}")
            lines.append("")
            for failure in (s.get("verdict") or {}).get("failures", []) or [s.get("error") or "failed"]:
                lines.append(f"- {_cell(failure)}")
            lines += [f"- _{_cell(note)}_" for note in comparison_notes(s)]
            lines += ["", f"Replay: `{_code(s.get('replay'))}`", ""]
    warned = [(s, w) for s in scenarios for w in s.get("warnings") or []]
    if warned:
        lines += ["", "## Warnings", ""]
        lines += [f"- {_name(s.get('scenario'))}: {_cell(w)}" for s, w in warned]
    noted = [(s, comparison_notes(s)) for s in scenarios if s.get("passed") and comparison_notes(s)]
    if noted:
        lines += ["", "## What was compared", ""]
        lines += [f"- {_name(s.get('scenario'))}: {_cell('; '.join(notes))}" for s, notes in noted]
    figures = [(s, s.get("figures")) for s in scenarios if s.get("figures")]
    if figures:
        lines += ["", "## Figures", "", "| scenario | figure | value |", "| --- | --- | --- |"]
        for s, f in figures:
            lines += [f"| {_name(s['scenario'])} | {what} | {value} |" for what, value in _figure_rows(f)]
    return "\n".join(lines) + "\n"


def _figure_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    """(figure, value) rows of one scenario's figures, each value made inert for Markdown."""
    rows: list[tuple[str, str]] = []
    overhead = f.get("overhead")
    if overhead:
        value = (
            "unknown: " + str(overhead.get("unknown_reason"))
            if overhead.get("fraction") is None
            else (f"{overhead['fraction']:.2%} (budget {overhead['budget']:.2%})")
        )
        rows.append(("checkpoint overhead", _cell(value)))
    if f.get("advice"):
        rows.append(("interval advice", _cell(f["advice"].get("message"))))
    for flush in f.get("notice_flush", []):
        shown = "none" if flush.get("flush_seconds") is None else f"{flush['flush_seconds']:.3g} s"
        rows.append(("notice flush", f"{shown} of {flush.get('window')} s"))
    rows += [("storage", _cell(storage_line(item))) for item in f.get("storage", [])]
    rows += [(f"{row.get('world')} ranks", _cell(world_line(row))) for row in f.get("determinism_by_world", [])]
    for item in f.get("serving", []):
        rows.append(("drain", _cell(drain_line(item))))
        rows += [("service", _cell(line)) for line in service_lines(item)]
    for row in f.get("reshard", []):
        shown = f"{'passed' if row.get('passed') else 'FAILED'}, resumed after step {row.get('resumed_from')}"
        rows.append((f"reshard {row.get('saved_world')} -> {row.get('resumed_world')} ranks", _cell(shown)))
    return rows

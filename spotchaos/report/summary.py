"""How a scenario is worded wherever it is shown (terminal, Markdown, HTML, comparison): its verdict
word, its lost steps, and plain-text lines for its figures. No pytest here."""

from __future__ import annotations

from typing import Any


def verdict_word(scenario: dict[str, Any]) -> str:
    """``pass``, ``fail`` (a verdict broke) or ``error`` (it could not be judged, or was interrupted)."""
    if scenario.get("passed"):
        return "pass"
    return "error" if scenario.get("error") else "fail"


def lost_steps(scenario: dict[str, Any]) -> int:
    """Steps recomputed after resumes, over every run of the scenario."""
    return sum(run.get("lost_steps", 0) for run in scenario.get("runs", []))


def is_service(scenario: dict[str, Any]) -> bool:
    """A service's drain: described by its drain figures, never in training's terms (steps, bit-exact)."""
    return bool((scenario.get("figures") or {}).get("serving"))


def lost_steps_shown(scenario: dict[str, Any]) -> int | str:
    """The lost-steps cell: ``-`` for a service, which has no steps."""
    return "-" if is_service(scenario) else lost_steps(scenario)


def landing(scenario: dict[str, Any]) -> str:
    """Where the scenario's faults landed against their plans: ``exact`` when every one was held
    at its planned step (or late by none), else how many were late and by how much at most; ``-``
    for a scenario without timed faults (crash points, services, a rerun)."""
    timed = [
        f
        for run in scenario.get("runs", [])
        for f in run.get("faults", [])
        if isinstance(f, dict) and isinstance(f.get("steps_late"), int)
    ]
    if not timed:
        return "-"
    late = [f["steps_late"] for f in timed if f["steps_late"] > 0]
    if not late:
        held = sum(1 for f in timed if f.get("held"))
        return "exact" + (f" ({held} held)" if held else "")
    return f"{len(late)} of {len(timed)} late, up to {max(late)} step(s)"


def figure_lines(figures: dict[str, Any]) -> list[str]:
    lines = []
    overhead = figures.get("overhead")
    if overhead:
        if overhead["fraction"] is None:
            lines.append(f"overhead unknown: {overhead['unknown_reason']}")
        else:
            lines.append(
                f"overhead {overhead['fraction']:.2%} of training time (budget {overhead['budget']:.2%}); "
                f"checkpoint {overhead['checkpoint_seconds']:.3g} s every {overhead['interval_steps']:g} steps"
            )
    if "advice" in figures:
        lines.append(f"advice: {figures['advice']['message']}")
    cost = figures.get("cost")
    if cost:
        lines.append(f"cost to finish: spot {_side(cost['spot'])} vs on demand {_side(cost['on_demand'])}")
    for flush in figures.get("notice_flush", []):
        shown = "none" if flush["flush_seconds"] is None else f"{flush['flush_seconds']:.3g} s"
        lines.append(f"notice flush ({flush['fault']}): {shown} of a {flush['window']:g} s window")
    lines += [storage_line(item) for item in figures.get("storage", [])]
    for item in figures.get("serving", []):
        lines += [f"service {item.get('service')}: {drain_line(item)}", *service_lines(item)]
    return lines


def drain_line(item: dict[str, Any]) -> str:
    """One service through its notice: the drain, what was lost, latency."""
    killed = "killed at the deadline" if item.get("killed") else f"drained in {item.get('drain_seconds')} s"
    return (
        f"{'passed' if item.get('passed') else 'FAILED'}: {killed} of a {item.get('notice_seconds')} s notice "
        f"({item.get('channel')}); {item.get('failed')} of {item.get('requests')} request(s) failed; p50/p99 "
        f"{item.get('steady_p50')}/{item.get('steady_p99')} s steady, {item.get('drain_p50')}/{item.get('drain_p99')} "
        "s draining"
    )


def service_lines(item: dict[str, Any]) -> list[str]:
    """A service run's timeline, its cold and warm starts and the fallback order followed."""
    marks = item.get("marks") or {}
    timeline = f"timeline: notice at 0 s, service gone at {marks.get('gone')} s (deadline {marks.get('deadline')} s)"
    replacement = item.get("replacement") or {}
    if "replacement_launched" in marks:
        timeline += f", replacement launched at {marks['replacement_launched']} s"
        if replacement.get("first_answer_after_notice") is not None:
            timeline += f", its first answer at {replacement['first_answer_after_notice']} s"
        else:
            timeline += ", never answered"
    served = item.get("served_by") or {}
    if served:
        timeline += "; behind the balancer, answered by " + ", ".join(f"{k} {v}" for k, v in served.items())
    if item.get("longest_gap_seconds") is not None:
        timeline += f"; longest stretch with no answer {item['longest_gap_seconds']} s"
    lines = [timeline]
    if item.get("ready_after_notice_seconds") is not None:
        outcomes = item.get("routed_while_ready_outcomes") or {}
        shown = f" ({', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))})" if outcomes else ""
        lines.append(
            f"readiness: ready until {item['ready_after_notice_seconds']} s after the notice "
            f"({item.get('unready_bound_seconds')} s allowed); {item.get('routed_while_ready')} request(s) routed to "
            f"it meanwhile{shown}"
        )
    start = f"time to first request: {item.get('ttfr_seconds')} s"
    if item.get("cache"):
        start += f" ({item['cache']} model cache)"
    if replacement.get("ttfr_seconds") is not None:
        start += f"; replacement {replacement['ttfr_seconds']} s ({replacement.get('cache') or 'no model cache'})"
    if item.get("warm_cold_ttfr_ratio") is not None:
        start += f"; warm/cold {item['warm_cold_ttfr_ratio']}"
    lines.append(start)
    order = replacement.get("order_followed")
    if order:
        steps = []
        for entry in order:
            profile = ", ".join(
                part
                for part in (
                    entry.get("memory"),
                    f"{entry['cpus']} CPUs" if entry.get("cpus") else None,
                    "spot" if entry.get("spot") else "on-demand",
                )
                if part
            )
            steps.append(f"{entry.get('name')} ({profile}{'' if entry.get('available') else ', no capacity'})")
        lines.append(
            "fallback order followed: " + " → ".join(steps) + f": replaced on {replacement.get('instance_type')}"
        )
    return lines


def world_line(row: dict[str, Any]) -> str:
    """One world size of a multi-rank determinism baseline, in words."""
    return (
        f"repeatable: {'yes' if row.get('repeatable') else 'no'}; preempt-and-resume bit-exact: "
        f"{'yes' if row.get('resume_bit_exact') else 'no'}; cycle {row.get('cycle_ratio')}x an uninterrupted run "
        f"({row.get('uninterrupted_seconds')} s)"
    )


def storage_line(item: dict[str, Any]) -> str:
    """One storage scenario's outcome: what S3 did, and what the job did about it."""
    verdict = "passed" if item.get("passed") else "FAILED"
    if item.get("scenario") == "credentials refused":
        changed = len(item.get("objects_changed") or [])
        leaks = ", ".join(item.get("leaks") or []) or "none"
        return (
            f"storage {item['fault']}: {verdict}; {item.get('objects_before', 0)} objects before, "
            f"{changed} changed; secret found in: {leaks}"
        )
    if item.get("scenario") == "preempted during a slow upload":
        resumed = ", ".join(str(s) for s in item.get("resumed_from") or []) or "none"
        return (
            f"storage {item.get('faults', 'a slow upload')}: {verdict}; checkpoint after step "
            f"{item.get('torn_step')} torn, resumed from step {resumed}"
        )
    checkpoints = item.get("checkpoints") or []
    worst = max((c["seconds"] for c in checkpoints), default=0.0)
    given_up = sum(1 for c in checkpoints if c.get("outcome") == "given up")
    acted = ", ".join(f"{name} x{count}" for name, count in (item.get("acted") or {}).items())
    return (
        f"storage {item.get('faults')} ({acted}): {verdict}; {len(checkpoints)} checkpoints, {given_up} given up, "
        f"longest {worst:.2f} s of a {item.get('budget_seconds', 0):g} s budget"
    )


def _side(side: dict[str, Any]) -> str:
    """A cost never shows as zero when a part of it is unknown."""
    hours = f"{side['wall_hours']:.3g} h"
    if not side["unknown"]:
        return f"{side['total_known']:.4g} in {hours}"
    missing = ", ".join(side["unknown"])
    if side["total_known"] == 0:
        return f"unknown ({missing} not given) in {hours}"
    return f"at least {side['total_known']:.4g} ({missing} unknown) in {hours}"


def comparison_notes(scenario: dict[str, Any]) -> list[str]:
    """What "equal" meant for a scenario's verdict, and how the log adapter read the script's
    steps: shown beside the verdict wherever it appears, since a printed loss is not a bit."""
    notes = []
    precision = (scenario.get("verdict") or {}).get("precision")
    if precision and precision != "bit-exact":
        notes.append(f"compared: {precision}")
    determinism = (scenario.get("reference") or {}).get("determinism")
    if determinism and determinism.get("text"):
        mode = (
            f"judged within its envelope widened {determinism.get('envelope_factor'):g}x"
            if determinism.get("exactness") == "envelope"
            else "judged bit for bit"
        )
        notes.append(f"determinism: {determinism['text']}; {mode}")
    convention = (scenario.get("reference") or {}).get("convention")
    if convention and convention.get("text"):
        notes.append(f"how the script counts: {convention['text']}")
    return notes

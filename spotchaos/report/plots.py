"""The report's plots: loss of the reference and the chaos run overlaid, and the divergence zoomed in.

matplotlib with the Agg backend (no display is needed on a CI runner); each plot comes back as
PNG bytes so the HTML page can embed it and stay a single self-contained file.
"""

from __future__ import annotations

import io
from typing import Any

from ..extras import require
from .document import number

require("matplotlib", "html", "the report's plots")
# the object-oriented Figure, never pyplot: no global figure manager, no GUI backend chosen, and a
# second off every session's report (pyplot's import alone is about 0.9 s)
Figure = require("matplotlib.figure", "html", "the report's plots").Figure

REFERENCE_COLOUR = "#1f77b4"
ATTEMPT_COLOURS = ["#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
MARK_STYLES = {
    "preemption": {"color": "#d62728", "linestyle": "--"},
    "resume": {"color": "#2ca02c", "linestyle": ":"},
    "rollback": {"color": "#ff9900", "linestyle": "-."},
}
ZOOM_HALF_WIDTH = 4  # steps either side of the first divergence


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return buffer.getvalue()


def _axes(width: float, height: float) -> tuple[Any, Any]:
    fig = Figure(figsize=(width, height))
    return fig, fig.subplots()


def _draw(ax, trajectory: dict[str, Any], window: tuple[float, float] | None = None) -> None:
    def inside(step: float) -> bool:
        return window is None or window[0] <= step <= window[1]

    reference = [(s, v) for s, raw in trajectory.get("reference", []) if (v := number(raw)) is not None and inside(s)]
    if reference:
        ax.plot(*zip(*reference, strict=True), color=REFERENCE_COLOUR, linewidth=2, label="reference (uninterrupted)")
    attempts = sorted({a for a, _, _ in trajectory.get("points", [])})
    for index in attempts:
        points = [
            (s, v) for a, s, raw in trajectory["points"] if a == index and (v := number(raw)) is not None and inside(s)
        ]
        if points:
            colour = ATTEMPT_COLOURS[index % len(ATTEMPT_COLOURS)]
            copied = index == 0 and trajectory.get("prefix_step") is not None  # the reference's steps, not run
            label = "attempt 0 (the reference's steps, copied)" if copied else f"attempt {index}"
            ax.plot(*zip(*points, strict=True), "o", color=colour, markersize=4, label=label)
    shown: set[str] = set()
    for mark in trajectory.get("marks", []):
        step = mark.get("step")
        if step is None or not inside(step):
            continue
        label = None if mark["kind"] in shown else mark["kind"]
        shown.add(mark["kind"])
        # a preemption lands after the step it observed; a resume continues after its checkpoint step
        ax.axvline(step + 0.5, linewidth=1.2, label=label, **MARK_STYLES.get(mark["kind"], {}))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def trajectory_png(trajectory: dict[str, Any], title: str) -> bytes:
    """Reference and chaos run overlaid, with preemptions, resumes and rollbacks marked."""
    fig, ax = _axes(7.5, 3.4)
    _draw(ax, trajectory)
    ax.set_title(title, fontsize=9)
    return _png(fig)


def divergence_png(trajectory: dict[str, Any], step: int, title: str) -> bytes:
    """A few steps either side of the first divergence, where the two curves part."""
    fig, ax = _axes(7.5, 3.0)
    _draw(ax, trajectory, (step - ZOOM_HALF_WIDTH, step + ZOOM_HALF_WIDTH))
    ax.axvspan(step - 0.5, step + 0.5, color="#d62728", alpha=0.12)
    ax.set_title(title, fontsize=9)
    return _png(fig)


OUTCOME_COLOURS = {
    "ok": "#2ca02c",
    "unavailable": "#bcbd22",
    "refused": "#17becf",
    "dropped": "#d62728",
    "cut": "#9467bd",
    "error": "#8c564b",
    "timeout": "#e377c2",
}
SERVICE_MARKS = {
    "notice": {"color": "#ff7f0e", "linestyle": "--"},
    "gone": {"color": "#d62728", "linestyle": "-"},
    "deadline": {"color": "#7f7f7f", "linestyle": ":"},
    "replacement_launched": {"color": "#1f77b4", "linestyle": "-."},
    "replacement_answered": {"color": "#2ca02c", "linestyle": "-."},
}


def requests_png(item: dict[str, Any], title: str) -> bytes:
    """Requests by outcome over time (stacked, by when each ended), the notice, the service's
    end, the deadline and the replacement's launch marked."""
    timeline = item.get("timeline") or {}
    width, start = float(timeline.get("width") or 0.25), float(timeline.get("start") or 0.0)
    counts: dict[str, list[int]] = timeline.get("counts") or {}
    fig, ax = _axes(7.5, 3.2)
    bottom: list[int] = []
    for outcome in [o for o in OUTCOME_COLOURS if o in counts] + [o for o in counts if o not in OUTCOME_COLOURS]:
        row = counts[outcome]
        if len(bottom) < len(row):
            bottom += [0] * (len(row) - len(bottom))
        xs = [start + width * index for index in range(len(row))]
        ax.bar(
            xs,
            row,
            width=width,
            align="edge",
            bottom=bottom[: len(row)],
            label=outcome,
            color=OUTCOME_COLOURS.get(outcome, "#333333"),
        )
        bottom = [b + (row[i] if i < len(row) else 0) for i, b in enumerate(bottom)]
    for name, at in (item.get("marks") or {}).items():
        if isinstance(at, int | float):
            ax.axvline(at, linewidth=1.2, label=name.replace("_", " "), **SERVICE_MARKS.get(name, {}))
    ax.set_xlabel("seconds from the notice")
    ax.set_ylabel(f"requests per {width:g} s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never on them
    ax.set_title(title, fontsize=9)
    return _png(fig)

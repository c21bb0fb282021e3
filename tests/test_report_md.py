"""The Markdown summary: rendered from the JSON alone, trainer text escaped for tables."""

from __future__ import annotations

import json

import pytest

from spotchaos.report.markdown import render_markdown

pytestmark = pytest.mark.unit  # starts no process: part of the fast loop (pytest -m unit)

DOCUMENT = {
    "seed": 42,
    "profile": "quick",
    "started": "2026-11-29T10:00:00+00:00",
    "finished": "2026-11-29T10:05:00+00:00",
    "environment": {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None, "platform": "Linux", "cpu_count": 2},
    "summary": {"scenarios": 2, "passed": 1, "failed": 1},
    "scenarios": [
        {
            "scenario": "s.py::ok[ref]",
            "job": "ref",
            "passed": True,
            "plans_tried": 4,
            "runs": [{"lost_steps": 3, "faults": [{"fault": "sigkill", "steps_late": 0, "held": True}]}],
            "figures": {"overhead": {"fraction": 0.02, "budget": 0.05}},
        },
        {
            "scenario": "s.py::bad[ref]",
            "job": "ref",
            "passed": False,
            "plans_tried": 2,
            "failing_plan": "sigkill@4",
            "runs": [
                {"lost_steps": 1, "faults": [{"fault": "sigkill", "steps_late": 2, "held": False}]},
                {"lost_steps": 2, "faults": [{"fault": "sigterm", "steps_late": 0, "held": False}]},
            ],
            "verdict": {"failures": ["loss diverged | <script>alert(1)</script>\nsecond line"]},
            "replay": "pytest --spotchaos --spotchaos-plan='sigkill@4' 's.py::bad[ref]'",
        },
    ],
}


def test_markdown_has_the_verdict_table_failures_figures_and_replay():
    text = render_markdown(DOCUMENT)
    assert "**1 of 2 scenarios passed**" in text and "seed `42`" in text
    assert "| ✅ pass | s.py::ok[ref] | ref | 4 | 3 | exact (1 held) |  |" in text
    assert "| ❌ fail | s.py::bad[ref] | ref | 2 | 3 | 1 of 2 late, up to 2 step(s) | sigkill@4 |" in text
    assert "Replay: `pytest --spotchaos --spotchaos-plan='sigkill@4' 's.py::bad[ref]'`" in text
    assert "| s.py::ok[ref] | checkpoint overhead | 2.00% (budget 5.00%) |" in text


def test_trainer_text_cannot_break_the_table_or_inject_html():
    text = render_markdown(DOCUMENT)
    line = next(x for x in text.splitlines() if x.startswith("- loss diverged"))
    assert "\\|" in line and "<script>" not in text and "&lt;script&gt;" in line
    assert "second line" in line  # the newline became a space: still one list item


def test_what_was_compared_and_how_the_script_counts_are_shown_beside_each_verdict():
    """A printed loss is not a bit: the precision note and the learned step convention appear in
    report.md and report.html wherever a log-adapter verdict is shown, passing or failing."""
    from markupsafe import escape

    from spotchaos.report.html import render_html

    precision = "losses compared as printed, to 8 significant digit(s); final weights compared bit for bit"
    convention = {"text": "steps printed from 1; checkpoint key 'step' holds the number of steps completed"}
    scenarios = [
        {
            **DOCUMENT["scenarios"][0],
            "figures": {},
            "runs": [],
            "verdict": {"precision": precision},
            "reference": {
                "wall_seconds": 2.5,
                "steps": 20,
                "start_seconds": 0.4,
                "memory": {},
                "convention": convention,
            },
        },
        {
            **DOCUMENT["scenarios"][1],
            "runs": [],
            "verdict": {**DOCUMENT["scenarios"][1]["verdict"], "precision": precision},
        },
    ]
    document = {**DOCUMENT, "scenarios": scenarios}
    text = render_markdown(document)
    assert f"- s.py::ok[ref]: compared: {precision}; how the script counts: {convention['text']}" in text
    failed = text[text.index("### s.py::bad[ref]") :]
    assert f"- _compared: {precision}_" in failed
    page = render_html(document)
    assert page.count(f"compared: {precision}") == 2 and escape(f"how the script counts: {convention['text']}") in page
    assert "compared:" not in render_markdown(DOCUMENT)  # the probe's bit-exact verdicts need no note


def test_a_report_cut_anywhere_is_called_truncated_and_a_complete_bad_one_is_not(tmp_path):
    """A cut right after a nested '}' still ends before the document closes: the message must not
    depend on which byte the cut lands on (a half-way cut once landed after a '}')."""
    import json

    from spotchaos.report.document import ReportError, load_report

    text = json.dumps(DOCUMENT, indent=2)
    cuts = [i + 1 for i, char in enumerate(text[:-1]) if char in '}]",'] + [len(text) // 2]
    path = tmp_path / "cut.json"
    for cut in cuts:
        path.write_text(text[:cut])
        with pytest.raises(ReportError, match="looks truncated"):
            load_report(path)
    path.write_text(text.replace('"seed": 42,', '"seed": 42,,'))
    with pytest.raises(ReportError) as complete_but_bad:
        load_report(path)
    assert "truncated" not in str(complete_but_bad.value) and "line 2" in str(complete_but_bad.value)


SERVING = {
    "service": "model-fallback",
    "passed": True,
    "killed": False,
    "drain_seconds": 1.12,
    "notice_seconds": 6.0,
    "channel": "gcp",
    "failed": 0,
    "requests": 296,
    "steady_p50": 0.21,
    "steady_p99": 0.23,
    "drain_p50": 0.21,
    "drain_p99": 0.21,
    "ttfr_seconds": 2.96,
    "cache": "cold",
    "warm_cold_ttfr_ratio": 0.46,
    "timeline": {
        "width": 0.25,
        "start": -1.5,
        "counts": {"ok": [8, 8, 8, 8, 8, 8, 0, 0, 4, 8], "refused": [0] * 7 + [9]},
    },
    "marks": {"notice": 0.0, "deadline": 6.0, "gone": 1.12, "replacement_launched": 1.13},
    "served_by": {"first": 64, "replacement": 24},
    "longest_gap_seconds": 2.07,
    "ready_after_notice_seconds": 0.004,
    "unready_bound_seconds": 1.0,
    "routed_while_ready": 0,
    "routed_while_ready_outcomes": {},
    "replacement": {
        "instance_type": "g4dn.xlarge-spot",
        "ttfr_seconds": 1.36,
        "first_answer_after_notice": 2.49,
        "cache": "warm",
        "order_followed": [
            {"name": "g5.xlarge-spot", "memory": "3g", "cpus": None, "spot": True, "available": False},
            {"name": "g4dn.xlarge-spot", "memory": "1g", "cpus": 2, "spot": True, "available": True},
        ],
    },
}


def test_a_service_run_shows_its_timeline_cold_and_warm_starts_order_and_plot():
    from spotchaos.report.html import render_html

    document = {**DOCUMENT, "scenarios": [{**DOCUMENT["scenarios"][0], "runs": [], "figures": {"serving": [SERVING]}}]}
    text = render_markdown(document)
    assert "service replaced" not in text
    assert "timeline: notice at 0 s, service gone at 1.12 s (deadline 6.0 s), replacement launched at 1.13 s" in text
    assert "its first answer at 2.49 s; behind the balancer, answered by first 64, replacement 24" in text
    assert "longest stretch with no answer 2.07 s" in text
    readiness = "readiness: ready until 0.004 s after the notice (1.0 s allowed); 0 request(s) routed to it meanwhile"
    assert readiness in text
    row = next(line for line in text.splitlines() if line.startswith("| ✅ pass |"))
    assert row.split(" | ")[4] == "-", row  # a service has no lost steps: its drain figures say how it went
    assert "time to first request: 2.96 s (cold model cache); replacement 1.36 s (warm); warm/cold 0.46" in text
    assert (
        "fallback order followed: g5.xlarge-spot (3g, spot, no capacity) → g4dn.xlarge-spot (1g, 2 CPUs, spot): "
        "replaced on g4dn.xlarge-spot"
    ) in text
    page = render_html(document)
    assert 'alt="requests of s.py::ok[ref] by outcome over time, with the notice and the kill marked"' in page
    assert "fallback order followed" in page and page.count('class="plot"') == 1
    assert "readiness: ready until 0.004 s after the notice" in page


@pytest.mark.unit
def test_a_report_cut_anywhere_is_called_truncated(tmp_path):
    """Cut in the middle of a number or a literal (``-``, ``tr``), the parser's error sat before the
    end and the report was not called truncated: the CLI test failed when a report's size moved
    its half-way cut onto one (issue 62: a flaky test)."""
    from spotchaos.errors import ReportError
    from spotchaos.report.document import load_report

    text = json.dumps({"tool": "spotchaos", "schema_version": 1, "a": [-1.25, True, False, None, "text", {"b": 3}]})
    for cut in range(1, len(text) - 1):
        path = tmp_path / "cut.json"
        path.write_text(text[:cut])
        with pytest.raises(ReportError, match="looks truncated"):
            load_report(path)

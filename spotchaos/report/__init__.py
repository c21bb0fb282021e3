"""The report pipeline: the JSON document (the machine format) and what is rendered from it.

``document`` builds, writes and reads ``report.json`` (its names are re-exported here);
``markdown`` and ``html`` (with ``plots``) render it for people, ``summary`` words its figures,
``history`` keeps numbered copies and ``compare`` tells two of them apart. Everything renders from
the JSON alone, so a saved run renders the same later.
"""

from __future__ import annotations

from .document import (
    SCHEMA_VERSION,
    SessionOutcome,
    build_report,
    decide,
    environment,
    load_report,
    now_iso,
    number,
    strict_json,
    write_json,
    write_text,
)

__all__ = [
    "SCHEMA_VERSION",
    "SessionOutcome",
    "build_report",
    "decide",
    "environment",
    "load_report",
    "now_iso",
    "number",
    "strict_json",
    "write_json",
    "write_text",
]

"""The order a session runs its scenarios in: each job's scenarios one after another, the jobs of
the session's Ray cluster first.

Why: what a job's first scenario pays, a process of pytest pays once (its reference run, its warm
interpreter, the reference's snapshots, the plans later scenarios reuse) and a Ray cluster is
started once by each process that runs a Ray job. pytest orders a module's items by test function,
so ``pytest -n 3`` spread every job over every worker and paid those three times (a torchrun job's
reference is not cached across processes). pytest-xdist's ``worksteal`` hands each worker a
contiguous run of the list and steals from the end of the longest, so a job's scenarios kept
together stay on one worker but for the one split at a boundary; the Ray jobs, the longest chain
(their plans wait on Ray's drain poll, grace windows and restarts, on one cluster), start at once.
"""

from __future__ import annotations

from typing import Any

import pytest


def _subject(item: pytest.Item) -> Any:
    """The job or service a scenario item runs on, or None."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("spotchaos_job") or params.get("spotchaos_service")


def by_job(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with each job's scenarios together where its first one was, those of jobs on the
    Ray cluster first; every other item keeps its place among the groups."""
    first: dict[object, int] = {}
    keys = []
    for index, item in enumerate(items):
        subject = _subject(item)
        group = ("subject", subject.name) if subject is not None else ("item", index)
        first.setdefault(group, index)
        keys.append((not getattr(subject, "on_ray_cluster", False), first[group], index))
    return [item for _, item in sorted(zip(keys, items, strict=True), key=lambda pair: pair[0])]

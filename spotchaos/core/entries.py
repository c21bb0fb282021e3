"""How the ``spotchaos`` fixture finds a session's entry points: marks on the methods themselves.

The fixture (``pytest_glue/scenario.py``) offers every marked method of :class:`spotchaos.Session`
as it is, so the list of scenarios is written once, on the class, and a new family is its module
plus one marked method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Entry:
    """How the ``spotchaos`` fixture offers a Session method: a *scenario* runs inside a record
    for the report (``plans``: how many plans it counts up front, None when it counts its own),
    a *query* is handed over as it is (a reference run, crash points)."""

    scenario: bool
    plans: int | None = None


def scenario(plans: int | None = None) -> Callable[[_F], _F]:
    """Mark a Session method as a scenario entry point; the fixture records it for the report."""

    def mark(method: _F) -> _F:
        method.__spotchaos_entry__ = Entry(scenario=True, plans=plans)
        return method

    return mark


def query(method: _F) -> _F:
    """Mark a Session method the fixture hands over unchanged (it judges nothing)."""
    method.__spotchaos_entry__ = Entry(scenario=False)
    return method


def entry_of(method: object) -> Entry | None:
    """How the fixture offers ``method``: None when it is no entry point."""
    return getattr(method, "__spotchaos_entry__", None)

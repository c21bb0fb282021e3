"""Which jobs and services each scenario runs on: pytest's parametrization, decided once here.

A scenario takes the jobs (or services) its ``@pytest.mark.spotchaos(jobs=[...])`` names, else
every declared one that ``parametrize``s, narrowed by ``--spotchaos-job``; what it ``needs`` and a
job lacks is a skip that says why (when the job was named) or left out (when it was not). Apart
from the collector's other hooks because choosing what runs is not reporting what ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ..config.jobs import JobSpec
from ..errors import ConfigError
from ..families.needs import unmet

if TYPE_CHECKING:
    from .pytest_session import _State


def by_subject(metafunc: pytest.Metafunc, state: _State) -> None:
    """Each scenario once per job (``spotchaos_job``) or service (``spotchaos_service``) it takes:
    ``@pytest.mark.spotchaos(jobs=[...])`` or ``services=[...]`` names them, ``--spotchaos-job``
    chooses among them; a job that lacks what the scenario ``needs`` gets it skipped, saying why."""
    marks = marker_kwargs(metafunc.definition)
    for fixture, kind in (("spotchaos_job", "jobs"), ("spotchaos_service", "services")):
        if fixture not in metafunc.fixturenames:
            continue
        chosen = _chosen(state, metafunc, kind, marks.get(kind))
        # what was named (by --spotchaos-job or the marker) and cannot run is skipped, saying why;
        # a scenario that only fans out over everything declared leaves out what does not fit
        named = bool(state.options.jobs) or marks.get(kind) is not None
        if not chosen:
            why = _none_chosen(state, kind)
            mark = pytest.mark.skip(reason=f"spotchaos: {why}") if named else pytest.mark.spotchaos_unfit
            metafunc.parametrize(fixture, [pytest.param(None, marks=mark, id=f"no-{kind[:-1]}")])
            continue
        needs = (marks.get("needs") or ()) if kind == "jobs" else ()  # a service needs nothing yet
        params = []
        for each in chosen:
            try:
                reason = unmet(each, needs, metafunc.definition.nodeid)
            except ConfigError as exc:
                raise pytest.UsageError(f"spotchaos: {exc}") from None
            unfit = pytest.mark.skip(reason=f"spotchaos: {reason}") if named else pytest.mark.spotchaos_unfit
            params.append(pytest.param(each, marks=[unfit] if reason else [], id=each.name))
        metafunc.parametrize(fixture, params)


def _chosen(state: _State, metafunc: pytest.Metafunc, kind: str, named: list[str] | None) -> list[Any]:
    """The jobs or services a scenario takes: those its marker names, else every one declared
    (jobs: those with ``parametrize``), narrowed by --spotchaos-job."""
    selected = selected_jobs(state) if kind == "jobs" else selected_services(state)
    if named is not None:
        chosen = [each for each in selected if each.name in named]
        if not chosen and not state.options.jobs:
            declared = state.settings.jobs if kind == "jobs" else state.settings.services
            names = ", ".join(each.name for each in declared) or "none"
            where = metafunc.definition.nodeid
            raise pytest.UsageError(f"spotchaos: {where} names {kind} {named}; declared: {names}")
        return chosen
    if kind == "jobs" and not state.options.jobs:  # --spotchaos-job names the jobs: every scenario takes them
        return [job for job in selected if job.parametrize]
    return selected


def _none_chosen(state: _State, kind: str) -> str:
    """Why a scenario has no job (or service) to take; nothing declared at all is a usage error."""
    settings = state.settings
    if not settings.jobs and not settings.services:
        raise pytest.UsageError(
            "spotchaos: no job to test. Declare one in pyproject.toml:\n"
            '  [tool.spotchaos.jobs.train]\n  command = ["python", "train.py"]'
        )
    if not (settings.jobs if kind == "jobs" else settings.services):
        return f"no {kind[:-1]} declared ([tool.spotchaos.{kind}.NAME] in pyproject.toml)"
    return f"none of the selected {kind} is for this test"


def selected_jobs(state: _State) -> list[JobSpec]:
    """The declared jobs, narrowed by --spotchaos-job; in --spotchaos-image's container, on --spotchaos-backend."""
    o = state.options
    jobs = [j for j in state.settings.jobs if not o.jobs or j.name in o.jobs]
    # torchrun jobs stay local processes: a container's torchrun is not built (docs/distributed.md)
    jobs = [j.in_image(o.image) if o.image and not j.kind.local_ranks else j for j in jobs]
    return [j.on_backend(o.backend) for j in jobs] if o.backend else jobs


def selected_services(state: _State) -> list[Any]:
    """The declared services, narrowed by --spotchaos-job; in --spotchaos-image's container when given."""
    o = state.options
    services = [s for s in state.settings.services if not o.jobs or s.name in o.jobs]
    return [s.in_image(o.image) if o.image else s for s in services]


def marker_kwargs(definition: pytest.Item) -> dict[str, Any]:
    """Every ``spotchaos`` marker's keywords, the closest winning: a module's ``pytestmark`` may name
    the jobs of scenarios imported from the package, whose own markers say what they need."""
    merged: dict[str, Any] = {}
    for marker in reversed(list(definition.iter_markers("spotchaos"))):
        merged.update(marker.kwargs)
    return merged

"""pytest glue, loaded by every pytest run: options, the marker, the fixtures, and nothing heavy.

A plain ``pytest`` run (``--spotchaos`` off) pays for this module and ``hooks`` only: the session
(``spotchaos.pytest_glue.pytest_session``), the runner, hypothesis, the engine and the backends are imported
by ``pytest_configure`` when ``--spotchaos`` is given, the way pytest-xdist imports its
``DSession`` only under ``-n``. Scenarios are then skipped at collection with the reason.
"""

from __future__ import annotations

import pytest

from .config.profiles import PROFILES
from .pytest_glue import hooks
from .pytest_glue.stash import STATE

SKIP_REASON = "chaos scenario: run with --spotchaos (it starts real training jobs)"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


HISTORY_HELP = (
    "where each session's report is saved for 'spotchaos compare', relative to the project "
    "(default: .spotchaos, which holds a .gitignore of its own; off: none)"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("spotchaos", "preempt real training jobs and check they resume bit-exact")
    group.addoption("--spotchaos", action="store_true", help="run chaos scenarios (default: skipped)")
    group.addoption(
        "--spotchaos-seed",
        metavar="N|last",
        help="seed of the plan search; 'last' replays the previous session (default: random, printed)",
    )
    group.addoption(
        "--spotchaos-profile",
        choices=sorted(PROFILES),
        help="plans per scenario: "
        + ", ".join(f"{k}={v}" for k, v in PROFILES.items())
        + " (default: quick when CI is set, else standard)",
    )
    group.addoption("--spotchaos-examples", type=int, metavar="N", help="plans per scenario, overrides the profile")
    group.addoption(
        "--spotchaos-plan",
        metavar="PLAN",
        help="run exactly this plan instead of searching, e.g. 'sigterm@5,sigkill@12' (default: search)",
    )
    group.addoption(
        "--spotchaos-job", action="append", metavar="NAME", help="only this job or service (repeatable; default: all)"
    )
    group.addoption(
        "--spotchaos-output",
        metavar="DIR",
        help="where the report goes (default: [tool.spotchaos].output, else spotchaos-report)",
    )
    group.addoption(
        "--spotchaos-image",
        metavar="IMAGE",
        help="run every job in a container of this local image (Docker backend; default: as each job says)",
    )
    group.addoption(
        "--spotchaos-backend",
        metavar="NAME",
        help="run every job on this backend: subprocess, or ray (each attempt on a Ray worker node; "
        "default: as each job says)",
    )
    group.addoption(
        "--spotchaos-ray-address",
        metavar="ADDRESS",
        help="the Ray cluster of ray jobs (default: [tool.spotchaos.ray] address, else a local cluster "
        "the gate starts and ends)",
    )
    group.addoption(
        "--spotchaos-require-docker",
        action="store_true",
        help="fail container scenarios when no Docker daemon answers (default: skip them; always fail in CI)",
    )
    group.addoption(
        "--spotchaos-require-gpu",
        action="store_true",
        help="fail scenarios of jobs that ask for GPUs when there are none (default: skip them)",
    )
    group.addoption(
        "--spotchaos-parallel",
        type=int,
        metavar="N",
        help="run up to N plans of a scenario at once, then replay the search on their verdicts "
        "(default: 1; a job with gpus: as many as the GPUs lease)",
    )
    _add_shortcut_options(group)
    _add_reference_cache_options(group)
    group.addoption("--spotchaos-history", metavar="DIR|off", help=HISTORY_HELP)
    group.addoption("--spotchaos-keep-runs", action="store_true", help="keep passing runs' folders too (default: not)")


def _add_shortcut_options(group: pytest.OptionGroup) -> None:
    """The shortcuts (training/shortcuts.py): each may be turned off, and passes through them audited."""
    group.addoption(
        "--spotchaos-warm",
        choices=("on", "off"),
        help="start a local Python job's attempts warm, forked from one interpreter per job that has paid "
        "its imports (the job's preload), or every one cold (default: on; the reference run is always cold)",
    )
    group.addoption(
        "--spotchaos-prefix",
        choices=("on", "off"),
        help="searched plans start from a copy of the reference's checkpoint before their first fault, not step 0 "
        "(default: on; a job's first searched plan of the session always starts from step 0)",
    )
    group.addoption(
        "--spotchaos-tails",
        choices=("on", "off"),
        help="a plan whose last restart begins on the very checkpoint files another plan's did takes that attempt "
        "instead of training it again (default: on, where plans start from copies; off with --spotchaos-prefix=off)",
    )
    group.addoption(
        "--spotchaos-audit",
        type=int,
        metavar="N",
        help="run the first N plans per job that passed through a shortcut (a warm start, a start from the "
        "reference's copy, another plan's tail, a cached reference) again on the slow path, and fail if the "
        "verdicts differ (default: 0; a failure through a shortcut is always judged again)",
    )


def _add_reference_cache_options(group: pytest.OptionGroup) -> None:
    group.addoption(
        "--spotchaos-reference-cache",
        metavar="DIR|off",
        help="where jobs' references are kept across sessions, so an unchanged job's is not trained again "
        "(default: ~/.cache/spotchaos/references, or $XDG_CACHE_HOME's; SPOTCHAOS_REFERENCE_CACHE works too)",
    )
    group.addoption(
        "--spotchaos-fresh-reference",
        action="store_true",
        help="train every job's reference again this session, and rewrite its cache entry (default: read it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "spotchaos(jobs=None, services=None, needs=()): a chaos scenario, skipped unless --spotchaos is given; "
        "jobs=[names] (services=[names]) runs it on those only (jobs with parametrize = false are reached only "
        "this way or by --spotchaos-job); needs=['ranks'|'nodes'|'reshard'] skips it, saying why, for a job "
        "that lacks one",
    )
    config.addinivalue_line("markers", "spotchaos_unfit: set by spotchaos on a job that lacks what a scenario needs")
    if config.getoption("spotchaos"):
        from .pytest_glue.pytest_session import start

        start(config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Off: one placeholder, skipped at collection (on: the session parametrizes over the jobs)."""
    if STATE in metafunc.config.stash:
        return
    for fixture in ("spotchaos_job", "spotchaos_service"):
        if fixture in metafunc.fixturenames:
            metafunc.parametrize(fixture, [None], ids=["off"])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if STATE in config.stash:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("spotchaos") or {"spotchaos", "spotchaos_job", "spotchaos_service"} & uses:
            item.add_marker(skip)


@pytest.fixture
def spotchaos(request: pytest.FixtureRequest):
    """Run and search preemption plans (a :class:`spotchaos.pytest_glue.scenario.Scenario`); see the README's
    'Writing your own scenario'."""
    state = request.config.stash.get(STATE, None)
    if state is None:
        pytest.skip(SKIP_REASON)
    from .pytest_glue.scenario import Scenario

    return Scenario(state, request.node)


@pytest.fixture
def spotchaos_job(request: pytest.FixtureRequest):
    """Each declared job in turn (parametrized at collection)."""
    return request.param


@pytest.fixture
def spotchaos_service(request: pytest.FixtureRequest):
    """Each declared service in turn (``[tool.spotchaos.services.NAME]``, parametrized at collection)."""
    return request.param


@pytest.fixture(scope="session")
def spotchaos_moto():
    """moto's S3 on 127.0.0.1, one per test session (one per xdist worker)."""
    from .storage import MotoS3

    with MotoS3() as server:
        yield server


@pytest.fixture
def spotchaos_s3(spotchaos_moto):
    """A reset S3 behind a fault proxy, with fresh credentials: ``.add(SlowDown(0.3))``,
    ``.environment()`` for a job's env, ``.client()`` for the test itself."""
    from .storage import S3Service

    with S3Service(spotchaos_moto) as service:
        yield service

"""Run options resolved once, from the command line, the environment and pyproject.toml.

Precedence: command line > environment > ``[tool.spotchaos]`` > default. Each error names
where the bad value came from.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass

from ..config.jobs import BACKENDS, Settings
from ..config.profiles import PROFILES
from ..errors import ConfigError
from ..faults.plan import Plan
from ..report.history import HISTORY_DIR
from ..training.reference.cache import default_folder


@dataclass(frozen=True)
class RunOptions:
    seed: int
    profile: str
    max_examples: int
    output: str
    plan: Plan | None
    jobs: tuple[str, ...]
    keep_runs: bool
    image: str | None = None  # run every job in this container image
    require_docker: bool = False  # no Docker daemon: fail instead of skipping (always in CI)
    require_gpu: bool = False  # a job asks for GPUs and there are none: fail instead of skipping
    verbose: bool = False  # pytest -v: a timing-dependent failure also shows hypothesis's own account
    parallel: int | None = None  # plans of one scenario run at once (None: the job's GPU leases decide)
    backend: str | None = None  # run every job on this backend (subprocess, ray; None: as each job says)
    ray_address: str | None = None  # the user's Ray cluster instead of a local one
    warm: bool = True  # attempts of local Python jobs fork from a warm interpreter (host/warm)
    prefix: bool = True  # searched plans may start from the reference's checkpoints (training/reference/prefix.py)
    tails: bool = True  # a plan's last attempt may be another plan's on the same bytes (training/reference/tails.py)
    history: str | None = HISTORY_DIR  # where each session's report is saved for compare (None: nowhere)
    reference_cache: str | None = None  # where references are kept across sessions (None: nowhere)
    fresh_reference: bool = False  # train every reference again, and rewrite its entry
    audit: int = 0  # passes per job through a shortcut judged again on the slow path (training/shortcuts.py)


@dataclass(frozen=True)
class Given:
    """What the command line said, None (or False) where it said nothing: the first of the sources
    :func:`resolve` reads, one object rather than two dozen parameters."""

    seed: str | None = None
    profile: str | None = None
    examples: int | None = None
    output: str | None = None
    plan: str | None = None
    jobs: tuple[str, ...] | list[str] | None = None
    keep_runs: bool = False
    image: str | None = None
    require_docker: bool = False
    require_gpu: bool = False
    verbose: bool = False
    parallel: int | None = None
    backend: str | None = None
    ray_address: str | None = None
    warm: str | None = None
    prefix: str | None = None
    tails: str | None = None
    history: str | None = None
    reference_cache: str | None = None
    fresh_reference: bool = False
    audit: int | None = None


def resolve(
    given: Given, *, environ: Mapping[str, str], settings: Settings, last_seed: int | None = None
) -> RunOptions:
    """Combine the sources; ``seed='last'`` replays the previous session's seed (``last_seed``)."""
    resolved_seed = _seed(given.seed if given.seed is not None else environ.get("SPOTCHAOS_SEED"), last_seed)
    profile = given.profile or environ.get("SPOTCHAOS_PROFILE") or ("quick" if environ.get("CI") else "standard")
    if profile not in PROFILES:
        raise ConfigError(f"--spotchaos-profile: expected one of {', '.join(PROFILES)}, got {profile!r}")
    _check_numbers(given)
    _check_jobs(given.jobs, settings)
    parsed = Plan.parse(given.plan) if given.plan is not None else None
    if parsed is not None and not parsed.preemptions:
        raise ConfigError(
            f"--spotchaos-plan: {given.plan!r} holds no preemption; give at least one FAULT@STEP, e.g. sigterm@5"
        )
    warm, prefix = given.warm or environ.get("SPOTCHAOS_WARM"), given.prefix or environ.get("SPOTCHAOS_PREFIX")
    tails = given.tails or environ.get("SPOTCHAOS_TAILS")
    cache = given.reference_cache if given.reference_cache is not None else environ.get("SPOTCHAOS_REFERENCE_CACHE")
    return RunOptions(
        seed=resolved_seed,
        profile=profile,
        max_examples=given.examples or PROFILES[profile],
        output=given.output or settings.output,
        plan=parsed,
        jobs=tuple(given.jobs or ()),
        keep_runs=given.keep_runs,
        image=_image(given.image),
        # CI must never skip container scenarios for want of a daemon: that would hide a broken setup
        require_docker=given.require_docker or bool(environ.get("CI")),
        require_gpu=given.require_gpu,
        verbose=given.verbose,
        parallel=given.parallel,
        backend=given.backend,
        ray_address=given.ray_address,
        warm=_on_off("--spotchaos-warm (or SPOTCHAOS_WARM)", warm or "on"),
        prefix=_on_off("--spotchaos-prefix (or SPOTCHAOS_PREFIX)", prefix or "on"),
        tails=_on_off("--spotchaos-tails (or SPOTCHAOS_TAILS)", tails or "on"),
        history=_history(given.history if given.history is not None else environ.get("SPOTCHAOS_HISTORY")),
        reference_cache=_reference_cache(cache, environ),
        fresh_reference=given.fresh_reference,
        audit=_audit(given.audit if given.audit is not None else environ.get("SPOTCHAOS_AUDIT")),
    )


def _check_numbers(given: Given) -> None:
    """The counts and names a command line gives, each checked where one error can name its option."""
    if given.examples is not None and given.examples < 1:
        raise ConfigError(f"--spotchaos-examples: must be >= 1, got {given.examples}")
    if given.parallel is not None and not 1 <= given.parallel <= 256:
        raise ConfigError(f"--spotchaos-parallel: must be from 1 to 256 plans at once, got {given.parallel}")
    if given.backend is not None and given.backend not in BACKENDS:
        raise ConfigError(f"--spotchaos-backend: expected one of {', '.join(BACKENDS)}, got {given.backend!r}")
    address = given.ray_address
    if address is not None and (not address.strip() or any(c.isspace() for c in address)):
        raise ConfigError(f"--spotchaos-ray-address: expected an address such as 127.0.0.1:6379, got {address!r}")


def _check_jobs(jobs: tuple[str, ...] | list[str] | None, settings: Settings) -> None:
    known = {job.name for job in settings.jobs} | {service.name for service in settings.services}
    for name in jobs or ():
        if name not in known:
            raise ConfigError(
                f"--spotchaos-job: no job or service named {name!r} (declared: {', '.join(sorted(known)) or 'none'})"
            )


def _audit(value: int | str | None) -> int:
    """How many passes per job through a shortcut are run again on the slow path (0: none)."""
    if value is None or value == "":
        return 0
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise ConfigError(f"--spotchaos-audit (or SPOTCHAOS_AUDIT) must be a count of plans, 0 or more; got {value!r}")
    return count


def _reference_cache(value: str | None, environ: Mapping[str, str]) -> str | None:
    """Where references are kept across sessions: ``off`` keeps none."""
    if value is None:
        return str(default_folder(environ))
    if value == "off":
        return None
    if not value.strip() or "\0" in value:
        raise ConfigError(
            f"--spotchaos-reference-cache (or SPOTCHAOS_REFERENCE_CACHE): expected a folder or 'off', got {value!r}"
        )
    return os.path.abspath(os.path.expanduser(value))


def _history(value: str | None) -> str | None:
    """Where saved runs go, relative to the project: ``off`` saves none."""
    if value is None:
        return HISTORY_DIR
    if value == "off":
        return None
    if not value.strip() or "\0" in value:
        raise ConfigError(f"--spotchaos-history (or SPOTCHAOS_HISTORY): expected a folder or 'off', got {value!r}")
    return value


def _seed(seed: str | None, last_seed: int | None) -> int:
    """The plan search's seed: given, the last session's, or a fresh random one."""
    if seed is None:
        return random.randrange(2**32)
    if seed == "last":
        if last_seed is None:
            raise ConfigError("--spotchaos-seed=last: no previous spotchaos session is recorded in the cache")
        return last_seed
    try:
        resolved = int(seed)
    except ValueError:
        raise ConfigError(f"--spotchaos-seed: expected an integer or 'last', got {seed!r}") from None
    if resolved < 0:
        raise ConfigError(f"--spotchaos-seed: must be >= 0, got {resolved}")
    return resolved


def _on_off(option: str, value: str) -> bool:
    if value not in ("on", "off"):
        raise ConfigError(f"{option}: expected 'on' or 'off', got {value!r}")
    return value == "on"


def _image(image: str | None) -> str | None:
    if image is not None and (not image.strip() or any(c.isspace() for c in image)):
        raise ConfigError(f"--spotchaos-image: expected an image name such as 'repo/train:1.2', got {image!r}")
    return image

"""Which of a job's processes may be forked from its warm interpreter, and what that interpreter
imports first: one rule for the attempts and for the helpers that read the job's checkpoints in
its confinement (the state diff), so both fork from the same interpreter instead of each helper
paying a cold ``import torch`` (2.7 s of a Trainer checkpoint's diff here, twelve times a scenario).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...config.jobs import JobSpec

DEFAULT_PRELOAD = ("?torch", "?torch._dynamo")
# what a job declared to train with imports on each start, lazily included (``from transformers
# import Trainer`` loads transformers.trainer): 1.5-3 s an attempt here, paid once instead
FRAMEWORK_PRELOAD = {
    "transformers": ("?transformers", "?transformers.trainer"),
    "lightning": ("?lightning.pytorch",),
    "accelerate": ("?accelerate",),
}
# what a Ray Train driver imports before it joins the cluster; not ray.train, whose import of
# pyarrow starts jemalloc's background thread (a fork would not be safe)
LAUNCHER_PRELOAD = {"ray-train": ("?ray",)}
# the backend that starts a launcher's process here, on this machine: the one a warm start forks
LOCAL_BACKEND = {"python": "subprocess", "torchrun": "subprocess", "ray-train": "ray-train"}
# ``JobSpec.warm`` of a run that times its restart (the budgets' timing run): the restart stands for
# one in production, which pays the job's imports; the attempt before it may fork warm
RESTARTS_COLD = "restarts cold"


def as_attempt(job: JobSpec, restart: bool) -> JobSpec:
    """``job`` as one attempt of its run starts it: cold where it is a restart of a run whose
    restarts start cold (``RESTARTS_COLD``)."""
    return replace(job, warm=False) if restart and job.warm == RESTARTS_COLD else job


def preload_of(job: JobSpec) -> tuple[str, ...]:
    """What the job's warm interpreter imports first: the job's list, else torch, its compiler stack
    and the job's declared framework where they import ("?": a module the interpreter skips when
    it does not, instead of refusing to start warm). Why the compiler stack: a torch optimizer imports ``torch._dynamo``
    when the first one is built (sympy, fx, ...: 1.2-1.9 s here), so without it each warm attempt
    still paid most of a second import; with it, the reference trainer's attempt runs its first
    step 0.15 s after the fork."""
    if job.preload is not None:
        return job.preload
    return (*DEFAULT_PRELOAD, *FRAMEWORK_PRELOAD.get(job.framework or "", ()), *LAUNCHER_PRELOAD.get(job.launcher, ()))


def start_environment(backend: Any, job: JobSpec) -> dict[str, str]:
    """The environment a job's interpreter starts with, before an attempt's own variables: what a
    warm interpreter is keyed by, so every process of the job with it forks from the same one."""
    return {**backend.inherited_environment(), **job.environment(), "PYTHONUNBUFFERED": "1"}


def may_start_warm(job: JobSpec, backend: Any) -> bool:
    """A local Python job's process, torchrun's agents of a local multi-rank one (``python -m
    torch.distributed.run``: its ranks are its own processes), or a Ray Train job's driver (a local
    process; its workers are Ray's), on a backend that keeps warm interpreters (a container's or a
    Ray node's processes start cold)."""
    return (
        backend.warm is not None
        and job.warm
        and job.container is None
        and LOCAL_BACKEND.get(job.launcher) == backend.name
    )

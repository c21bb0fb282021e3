"""What a run of the engine is given besides the job and the plan, and the names it shares with
the job's side (the checkpoint placeholder, the files an attempt's folder holds)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ...backends import Backend
from ...host.gpu_leases import GpuPool
from ...host.leftovers import LiveJobs
from ...host.warm.pool import WarmStarts
from ..logadapter import StepConvention
from ..state.kept import KeptCopies

if TYPE_CHECKING:
    from ..reference.prefix import Prefix, Snapshots
    from ..reference.tails import Tails

CRASHPOINT_DIR = Path(__file__).resolve().parents[2] / "faults" / "crashpoint"


FS_EVENTS = "fs-events.jsonl"
FS_READS = "fs-reads.jsonl"  # each file a traced attempt read outside its Python, packages and spotchaos
FS_OUTSIDE = "fs-outside.jsonl"  # what a traced attempt wrote outside its checkpoint folder, a path once


FINAL_TENSORS = "final-tensors.pt"


@dataclass(frozen=True)
class EngineOptions:
    root: Path  # where relative job paths are resolved: the project root
    backend: Backend | None = None
    trace_fs: bool = False  # log the job's file-system events under its checkpoint directory
    extra_env: tuple[tuple[str, str], ...] = ()  # set last: S3 endpoint, credentials, an s3:// checkpoint URI
    # called with the attempt's index before each restart; may return variables that replace the
    # run's for that attempt and the ones after it (credentials swapped for a refused key)
    before_restart: Callable[[int], Mapping[str, str] | None] | None = None
    # a planned preemption also waits until this says so (a checkpoint upload is in flight)
    preempt_when: Callable[[], bool] | None = None
    # where running attempts are written down, so a later pytest ends them if this one dies
    live: LiveJobs = field(default_factory=LiveJobs)
    # how a log-adapter job counts its steps, learned from its uninterrupted run; None: this run
    # is the uninterrupted one, and learns it (RunRecord.convention)
    convention: StepConvention | None = None
    # a restart that fails before its first step is a verdict on the plan (a torn checkpoint, a
    # resume flag with nothing to resume), not an error; off where a family expects the failure
    judge_restarts: bool = False
    # keep copies of the checkpoints as they appear, for the state diff: "all" (the uninterrupted
    # run), "resumed" (those written by attempts after a resume), "" (none)
    keep_checkpoints: str = ""
    # the session's kept copies: their budget, identical files linked (None: unbounded, each copied)
    kept: KeptCopies | None = None
    # a torchrun job: the rank whose file-system events trace_fs logs (crash points are per rank)
    trace_rank: int | None = None
    # a torchrun job resumed on another world size: the ranks per node of every attempt after the first
    resume_nproc: int | None = None
    # the machine's GPUs, for a job that needs some: each attempt leases its own (None: it needs none)
    gpus: GpuPool | None = None
    # the session's warm interpreters: a local Python job's attempts fork from one (None: all cold)
    warm: WarmStarts | None = None
    # the reference run: copy its checkpoint folder at each checkpoint, while it holds (None: not)
    snapshots: Snapshots | None = None
    # a plan that starts from the reference's checkpoint after a step, not from step 0 (None: from 0)
    prefix: Prefix | None = None
    # the session's kept tails: a last attempt on a folder another plan's last attempt began on,
    # byte for byte, takes that attempt's events instead of training (None: every tail trains);
    # given with the job's key (shortcuts.verdict_key)
    tails: Tails | None = None
    tails_key: str = ""

"""What one attempt's processes start with, and what that environment holds while they run.

The contract's variables (events file, checkpoint URI, run id, attempt), and what the attempt's
fault needs: the step hold (and the reference's checkpoint hold), a crash point or the file-system
trace armed through ``sitecustomize``, a cloud's metadata server, leased GPUs, the platform's
variables (Slurm's), an attempt's own temporary folder. Each is a resource the attempt gives back
on every way out (the ``ExitStack`` :meth:`AttemptEnvironment.build` is handed). Kept apart from
the attempt's launch, watch and record (``attempt.py``): what a process starts with is decided
before it starts, and is all the engine knows of the job's surroundings.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...backends import Backend
from ...config.exit_status import SLURM
from ...config.jobs import JobSpec
from ...config.placeholders import CHECKPOINT_DIR, fill
from ...errors import ConfigError
from ...faults import PREEMPTIONS, slurm, traits
from ...faults.notices import MetadataNotice, channel
from ...faults.plan import Preemption
from ...host.gpu_leases import GpuLease, GpuPool, GpuUnavailable
from ...probe import ENV_ATTEMPT, ENV_CHECKPOINT_URI, ENV_EVENTS, ENV_FINAL_TENSORS, ENV_RUN_ID
from ..logadapter import StepConvention
from .hold import (
    ENV_HOLD_PATTERN,
    ENV_HOLD_PHASE_LINE,
    ENV_HOLD_PRINTED,
    ENV_HOLD_PROBE,
    ENV_HOLD_SKIP,
    ENV_HOLD_STREAM,
    PROBE_FILE,
    CheckpointHold,
    Hold,
)
from .options import CRASHPOINT_DIR, FINAL_TENSORS, FS_EVENTS, FS_OUTSIDE, FS_READS, EngineOptions
from .warmth import may_start_warm, start_environment


@dataclass(frozen=True)
class RunContext:
    """What every attempt of one run shares: its folder, the job's working folder, the checkpoint
    folder, the run's id (its processes' marker) and the backend that starts them."""

    workdir: Path
    cwd: Path
    checkpoints: Path
    run_id: str
    backend: Backend


def attempt_folder(context: RunContext, index: int) -> Path:
    """Attempt ``index``'s own folder inside the run's."""
    return context.workdir / f"attempt-{index}"


class AttemptEnvironment:
    """One attempt's environment and the resources behind it (see the module's docstring)."""

    def __init__(
        self, job: JobSpec, index: int, preemption: Preemption | None, context: RunContext, options: EngineOptions
    ) -> None:
        self.job, self.index, self.preemption, self.options = job, index, preemption, options
        self.workdir, self.cwd, self.checkpoints = context.workdir, context.cwd, context.checkpoints
        self.run_id, self.backend = context.run_id, context.backend
        self.crash_at = preemption.fs_event if preemption is not None else None
        self.folder = attempt_folder(context, index)
        self.events_path = self.folder / "events.jsonl"
        self.hold: Hold | None = None
        self.checkpoint_hold: CheckpointHold | None = None
        self.scratch: Path | None = None
        self.start_env: dict[str, str] | None = None  # set with the environment, where it may start warm
        self.metadata: MetadataNotice | None = None
        self.lease: GpuLease | None = None
        self.hooked = False

    def build(self, resources: contextlib.ExitStack) -> dict[str, str]:
        """The job's environment: the contract's variables, and what this attempt's fault needs (the
        hold, a crash point, a cloud's metadata, leased GPUs); each resource taken is given back by
        ``resources``."""
        job, options, preemption = self.job, self.options, self.preemption
        self.hold = arm_hold(job, preemption, options, self.folder)  # before the scratch folder
        if self.hold is not None:
            resources.callback(self.hold.close)
        if options.snapshots is not None and self.index == 0:  # the reference: held at each checkpoint
            self.checkpoint_hold = CheckpointHold(self.folder / "snapshot-hold", seconds=job.event_timeout_seconds / 2)
            resources.callback(self.checkpoint_hold.close)
        # The attempt's own temporary folder: what the job leaves there (multiprocessing's pymp-* folders
        # of DataLoader workers killed mid-run) goes with the attempt instead of piling up in /tmp. Short,
        # since multiprocessing puts Unix sockets in it (108 bytes at most); a container needs none: its
        # own /tmp goes with it.
        if job.container is None:
            self.scratch = Path(tempfile.mkdtemp(prefix="spotchaos-tmp-"))
            # fd-based: links inside are removed, never followed
            resources.callback(shutil.rmtree, self.scratch, ignore_errors=True)
        env = start_environment(self.backend, job)
        # what the job's interpreter may start with before this attempt's own variables: a warm one
        self.start_env = dict(env) if self._may_start_warm() else None
        for name, value in self.job.env:  # the run's own folder: the warm interpreter's stays unfilled
            if CHECKPOINT_DIR in value and env.get(name) == value:
                env[name] = fill(value, self.checkpoints)
        self.hooked = self.crash_at is not None or options.trace_fs or (self.hold is not None and job.log is not None)
        if self.hooked:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CRASHPOINT_DIR), env.get("PYTHONPATH")]))
        if self.crash_at is not None or options.trace_fs:
            env.update(self._crash_environment())
        env.update(
            {
                ENV_EVENTS: str(self.events_path),
                ENV_CHECKPOINT_URI: self.checkpoints.as_uri(),
                ENV_RUN_ID: self.run_id,
                ENV_ATTEMPT: str(self.index),
            }
        )
        if self.scratch is not None:
            env["TMPDIR"] = str(self.scratch)
        if job.exactness == "envelope" and job.log is None:
            env[ENV_FINAL_TENSORS] = str(self.folder / FINAL_TENSORS)  # the probe saves the weights themselves
        if self.checkpoint_hold is not None:
            env.update(self.checkpoint_hold.environment())
        if self.hold is not None:
            env.update(self.hold.environment())
            if job.log is not None:
                env.update(hook_hold_environment(job, self.hold, options.convention))
        provider = traits(preemption.fault if preemption is not None else None).metadata
        if provider:
            self.metadata = channel(provider)
            resources.callback(self.metadata.close)
            env.update(self.metadata.environment())
        env.update(dict(options.extra_env))
        env.update(platform_environment(job, self.folder, self.run_id, self.index, env.get("PATH", "")))
        # before the clock starts: a wait is no start-up time. A Ray node's GPUs are Ray's to hand out
        self.lease = lease_gpus(job, self.index, self.run_id, options) if self.backend.name != "ray" else None
        if self.lease is not None:
            resources.callback(self.lease.release)
            if job.container is None:  # a container sees its devices only, numbered from 0
                env["CUDA_VISIBLE_DEVICES"] = ",".join(self.lease.devices)
        return env

    def _may_start_warm(self) -> bool:
        """Where ``may_start_warm`` allows, in a session that keeps warm interpreters; the reference
        run starts cold: its string-hash seed and imports are a fresh process's, as in production."""
        return self.options.warm is not None and may_start_warm(self.job, self.backend)

    def _crash_environment(self) -> dict[str, str]:
        """A crash point armed, or every file-system event under the checkpoint folder traced."""
        env = {
            "SPOTCHAOS_CRASH_ROOT": str(self.checkpoints),
            "SPOTCHAOS_CRASH_LOG": str(self.folder / FS_EVENTS),
            "SPOTCHAOS_CRASH_AT": str(self.crash_at or 0),
        }
        if self.options.trace_fs:  # and what it writes elsewhere: a copy of its checkpoints would not hold it
            env["SPOTCHAOS_OUTSIDE_LOG"] = str(self.folder / FS_OUTSIDE)
            # where a write is the run's own or the job's (its run folder, its working folder), not a
            # library's cache every run shares (torch's compiled kernels in the system's temporary folder)
            env["SPOTCHAOS_OUTSIDE_WITHIN"] = os.pathsep.join(map(str, (self.workdir, self.cwd)))
            env["SPOTCHAOS_READS_LOG"] = str(self.folder / FS_READS)  # and what it read: the cache's proof
        if self.preemption is not None and self.preemption.after_step is not None:
            env["SPOTCHAOS_CRASH_AFTER_STEP"] = str(self.preemption.after_step)
        rank = self.preemption.crash_rank if self.preemption is not None else None
        if rank is not None or (self.options.trace_rank is not None and self.job.kind.local_ranks):
            env["SPOTCHAOS_CRASH_RANK"] = str(rank if rank is not None else self.options.trace_rank)
        return env


def platform_environment(job: JobSpec, folder: Path, run_id: str, index: int, path: str) -> dict[str, str]:
    """What the platform the job runs on shows it: Slurm's variables and its ``scontrol`` first on ``path``."""
    if job.platform not in SLURM:
        return {}
    env = slurm.environment(folder, job.name, run_id, index, requeue=job.platform == "slurm-requeue")
    return slurm.with_path({**env, "PATH": path})


def lease_gpus(job: JobSpec, index: int, run_id: str, options: EngineOptions) -> GpuLease | None:
    """The GPUs this attempt holds for its whole life, distinct from every other attempt's on the
    machine; None for a job that needs none. No GPU at all is a skip (GpuUnavailable)."""
    request = job.gpu_request
    if request is None:
        return None
    pool = options.gpus or GpuPool()
    if not pool.devices:
        raise GpuUnavailable(
            f"{job.where('gpus')}: the job asks for GPUs ({request}) and this machine has none ({pool.source} "
            "lists none; declare them with [tool.spotchaos] gpus or SPOTCHAOS_GPUS)"
        )
    count = len(pool.devices) if request == "all" else int(request)
    holder = {"job": job.name, "attempt": index, "run": run_id}
    return pool.lease(count, holder, timeout=job.attempt_timeout_seconds)


def arm_hold(job: JobSpec, preemption: Preemption | None, options: EngineOptions, folder: Path) -> Hold | None:
    """The hold for this attempt's fault, or None where the fault needs none (a crash point is
    armed inside the job, a rerun waits for the end) or must not have one (a fault that waits for
    an upload in flight: a held job uploads nothing; one placed a time after its step)."""
    if preemption is None or preemption.fs_event is not None or options.preempt_when is not None:
        return None
    if preemption.offset_seconds is not None:  # lands wherever the job is by then: it must run on
        return None
    if preemption.phase is not None and job.log is not None and job.log.phase_pattern(preemption.phase) is None:
        raise ConfigError(
            f"plan {preemption}: job {job.name!r} is read through the log adapter, which knows a phase by the line "
            f"that begins it: add log.phases.{preemption.phase} (its pattern), or mark the phase with the probe's "
            f"phase({preemption.phase!r}) (docs/log-adapter.md)"
        )
    fault = PREEMPTIONS.get(preemption.fault)
    if fault is None or fault.reruns:
        return None
    target = fault.target  # a rank's fault holds that rank; a node's, its first rank
    rank = 0 if target is None else target
    if fault.on_node and job.kind.local_ranks:  # Ray Train's: rank r's node
        rank = target * job.nproc_per_node
    if fault.reclaims and job.kind.cluster_ranks:
        # every rank reads the drain through get_preemption_info(), which is rank 0's answer
        # broadcast (Ray 2.60): held anywhere else, rank 0 would already have answered None
        rank = 0
    # the job's side gives up after half the silence the harness allows, so a hold never reads as a hang
    # a container's numeric user gets the hold's FIFOs as its own (else they stay the harness's)
    owner = job.container.uid if job.container is not None else None
    seconds = job.event_timeout_seconds / 2
    phase = preemption.phase
    return Hold(folder / "hold", preemption.at_step, rank=rank, seconds=seconds, owner=owner, phase=phase)


def hook_hold_environment(job: JobSpec, hold: Hold, convention: StepConvention | None) -> dict[str, str]:
    """What the in-process hook of an unmodified script needs to know its planned step's line: the
    job's own pattern, and the number the script prints for that step."""
    assert job.log is not None
    first = convention.first_step if convention is not None else (job.log.first_step or 0)
    env = {
        ENV_HOLD_PATTERN: job.log.pattern,
        ENV_HOLD_STREAM: job.log.stream,
        ENV_HOLD_PROBE: str(PROBE_FILE),
        ENV_HOLD_PRINTED: str(hold.at + first),
    }
    if job.log.rollback_pattern:
        env[ENV_HOLD_SKIP] = job.log.rollback_pattern
    begins = job.log.phase_pattern(hold.phase) if hold.phase is not None else None
    if begins is not None:  # held at the line that begins the phase, once the planned step's line was printed
        env[ENV_HOLD_PHASE_LINE] = begins
    return env

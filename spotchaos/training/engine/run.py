"""Runs a job under a plan: start, watch the events, preempt at a step, restart, repeat.

The engine knows nothing of pytest or hypothesis: it receives a job, a plan and a working
directory, and returns a :class:`RunRecord`. Whatever happens (the trainer hangs, crashes,
writes garbage, or the caller is interrupted) every attempt is cleaned up before control
leaves, so no process of the job outlives the call.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import unquote, urlparse

from ...backends import Backend, Handle, LaunchSpec, SubprocessBackend
from ...config.jobs import JobSpec
from ...errors import JobError
from ...faults import CHECKPOINT_FAULTS, PREEMPTIONS, CheckpointSet, Damage
from ...faults.notices import MetadataNotice, channel
from ...faults.plan import Plan, Preemption
from ...host.gpu_leases import GpuLease, GpuPool, GpuUnavailable
from ...host.leftovers import LiveJobs
from ...host.processes import end_escaped
from ...probe import ENV_ATTEMPT, ENV_CHECKPOINT_URI, ENV_EVENTS, ENV_FINAL_TENSORS, ENV_RUN_ID
from ...safety.safefs import UnsafeFile, last_lines, log_tail, read_text_bounded
from ..events import EventReader
from ..logadapter import LogEventReader, StepConvention
from ..multirank import torchrun
from ..restarts import diagnose
from ..state.checkpoint_reader import ConfinedLoader
from ..state.diff import keep, kept_dir
from ..trajectory import Attempt, FaultRecord, RunRecord
from .hold import ENV_HOLD_PATTERN, ENV_HOLD_PRINTED, ENV_HOLD_PROBE, ENV_HOLD_SKIP, ENV_HOLD_STREAM, PROBE_FILE, Hold
from .landing import settle

log = logging.getLogger("spotchaos")
POLL_SECONDS = 0.003
TAIL_BYTES = 4000
FS_EVENTS_BYTES = 64 << 20
CRASHPOINT_DIR = Path(__file__).resolve().parents[2] / "faults" / "crashpoint"
FS_EVENTS = "fs-events.jsonl"
FINAL_TENSORS = "final-tensors.pt"
CHECKPOINT_PLACEHOLDER = "{checkpoint_dir}"


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
    # a torchrun job: the rank whose file-system events trace_fs logs (crash points are per rank)
    trace_rank: int | None = None
    # a torchrun job resumed on another world size: the ranks per node of every attempt after the first
    resume_nproc: int | None = None
    # the machine's GPUs, for a job that needs some: each attempt leases its own (None: it needs none)
    gpus: GpuPool | None = None


# a signal to the whole group acts on every process of it while the job is held: a DataLoader
# worker it kills is dead, and its death seen by the main process, before the main process goes
# on (released at once, a fast job's checkpoint and exit raced the workers' deaths)
GROUP_SETTLE_SECONDS = 0.5


def _tail(path: Path, limit: int = TAIL_BYTES) -> str:
    return log_tail(path, limit)


class _AttemptWatch:
    """Drives one attempt: polls events, delivers its preemption, enforces the timeouts."""

    def __init__(
        self,
        job: JobSpec,
        handle: Handle,
        reader: EventReader | LogEventReader,
        preemption: Preemption | None,
        preempt_when: Callable[[], bool] | None = None,
        on_checkpoint: Callable[[dict], None] | None = None,
        metadata: MetadataNotice | None = None,
        hold: Hold | None = None,
    ):
        self.job = job
        self.hold = hold  # the job waits after the planned step until the fault is delivered
        self.release_by: float | None = None  # a notice forwarded by torchrun's agent: release once it arrived
        self.metadata = metadata  # a cloud notice's instance metadata, served for this attempt
        self.on_checkpoint = on_checkpoint
        self.preempt_when = preempt_when
        self.handle = handle
        self.reader = reader
        self.preemption = preemption
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.first_event_at: float | None = None
        self.last_event_at = self.started
        self.last_step: int | None = None
        self.fault: FaultRecord | None = None
        self.delivered_at: float | None = None
        self.reclaimed = False  # the grace window's end took the nodes of a job that runs on (Ray Train)
        self.exit_code: int | None = None

    def run(self) -> None:
        while True:
            now = time.monotonic()
            self._consume(now)
            self._maybe_preempt(now)
            self._maybe_release(now)
            code = self.handle.poll()
            if code is not None:
                self.exit_code = code
                self._consume(time.monotonic())
                if self.fault is not None and self.delivered_at is not None:
                    self.fault.exit_seconds = time.monotonic() - self.delivered_at
                return
            self._enforce_deadlines(now)
            time.sleep(POLL_SECONDS)

    def _consume(self, now: float, new: list[dict] | None = None) -> None:
        new = self.reader.read_new() if new is None else new
        if not new:
            return
        if self.first_event_at is None:
            self.first_event_at = now
        self.last_event_at = now
        ranks = getattr(self.handle, "note_event", None)  # a torchrun job: which rank said what, and when
        # the held rank's steps time the plan's fault (rank 0's when none is held): delivered as it
        # holds, never while it runs on, released by a fault that came first for another rank's step
        timing = self.hold.rank if self.hold is not None else 0
        for event in new:
            rank = event.get("rank", 0)
            if event["event"] == "step" and rank == timing:
                self.last_step = event["step"]
            elif event["event"] == "notice" and self.hold is not None and rank == self.hold.rank:
                self.release_by = now  # the held rank has the forwarded notice: it may go on
            elif event["event"] == "checkpoint" and self.on_checkpoint is not None:
                self.on_checkpoint(event)
            if ranks is not None and isinstance(rank, int):
                if event["event"] == "start":
                    self.handle.note_rank(rank, event.get("pid"))
                ranks(rank, event["step"] if event["event"] == "step" else None)

    def _maybe_preempt(self, now: float) -> None:
        p = self.preemption
        if p is None or self.fault is not None or self.last_step is None or self.last_step < p.at_step:
            return
        if p.fault == "rerun":
            return  # the job runs to its end; run_job starts it again
        if self.preempt_when is not None and not self.preempt_when():
            return
        if isinstance(self.reader, LogEventReader):  # the checkpoints on disk now came before the fault
            self._consume(now, self.reader.look_now())
        fault = PREEMPTIONS[p.fault]
        fault.apply(self.handle)
        if self.metadata is not None:  # the notice goes up on the metadata; the deadline is the grace window's end
            self.metadata.deliver(self.handle, time.time() + float(self.job.grace_seconds or 30.0))
        self.delivered_at = now
        self.fault = FaultRecord(
            fault=p.fault,
            planned_step=p.at_step,
            observed_step=self.last_step,
            delivered_at=now - self.started,
            delivered_wall=time.time(),
            grace_seconds=self.job.grace_seconds if fault.graceful else None,
            detail=getattr(self.handle, "delivery_note", ""),  # what the notice met on its way in
        )
        if self.hold is not None:  # a notice a launcher passes on (torchrun's agent, Ray Train's watcher) comes later
            lag = getattr(self.handle, "notice_lag_seconds", 0.0) if fault.graceful else 0.0
            if getattr(fault, "whole_group", False):  # every process hears it before the job goes on
                lag = max(lag, GROUP_SETTLE_SECONDS)
            self.release_by = now + min(lag, float(self.job.grace_seconds or 30.0) / 2)
            self._maybe_release(now)

    def _maybe_release(self, now: float) -> None:
        """Let the held job go on once its fault is delivered (a notice torchrun's agent forwards:
        once the held rank reports it, or after a few seconds)."""
        if self.hold is not None and self.release_by is not None and now >= self.release_by:
            self.hold.release()
            self.release_by = None

    def _enforce_deadlines(self, now: float) -> None:
        if self.fault is not None and self.delivered_at is not None:
            fault = PREEMPTIONS[self.fault.fault]
            if self.fault.grace_seconds is not None and now - self.delivered_at > self.fault.grace_seconds:
                self._grace_over()
            if getattr(fault, "hangs", False):
                self._detect_hang(now)
                return
            if not getattr(fault, "continues", False) and not self.reclaimed:
                return  # the job is being preempted: the grace window, not hang detection, applies
        if self.first_event_at is None:
            if now - self.started > self.job.start_timeout_seconds and self.job.log is not None:
                raise JobError(
                    f"job {self.job.name!r}: no line of its {self.job.log.stream} matched {self.job.log.where}.pattern "
                    f"{self.job.log.pattern!r} within {self.job.start_timeout_seconds:g} s (start_timeout_seconds)"
                )
            if now - self.started > self.job.start_timeout_seconds and self.job.multi_rank:
                raise JobError(
                    f"job {self.job.name!r} never started: no rank reported an event within "
                    f"{self.job.start_timeout_seconds:g} s (start_timeout_seconds). A rank that never joins the "
                    f"rendezvous or init_process_group holds back all {self.job.world_size} (nnodes = "
                    f"{self.job.nnodes}, nproc_per_node = {self.job.nproc_per_node}); does each create a "
                    "spotchaos.probe.Probe and call start()?"
                )
            if now - self.started > self.job.start_timeout_seconds:
                raise JobError(
                    f"job {self.job.name!r} never started: no event within {self.job.start_timeout_seconds:g} s "
                    f"(start_timeout_seconds). Does the trainer create a spotchaos.probe.Probe and call start()?"
                )
        elif self.job.multi_rank:  # silence is judged by whether ranks run, never by event_timeout
            if now - self.last_event_at <= self._rank_silence_limit():
                pass
            elif self.handle.ranks_alive():
                raise JobError(
                    f"job {self.job.name!r} hangs: no rank reported an event for {self.job.hang_seconds:g} s after "
                    f"step {self.last_step} (hang_timeout_seconds): {self.handle.describe_hang()}"
                )
            else:
                why = (
                    "does its group restart fail to rendezvous?"
                    if self.job.launcher == "torchrun"
                    else "can the cluster place its ScalingConfig's workers again (its controller's log below)?"
                )
                raise JobError(
                    f"job {self.job.name!r}: {getattr(self.handle, 'launcher', 'its launcher')} started no rank for "
                    f"{self.job.start_timeout_seconds:g} s after step {self.last_step} (start_timeout_seconds): {why}"
                )
        elif now - self.last_event_at > self.job.event_timeout_seconds:
            where = f"after step {self.last_step}" if self.last_step is not None else "after its start event"
            limit = self.job.event_timeout_seconds
            raise JobError(f"job {self.job.name!r} hangs: no event for {limit:g} s {where} (event_timeout_seconds)")
        if now - self.started > self.job.attempt_timeout_seconds:
            raise JobError(
                f"job {self.job.name!r} ran past attempt_timeout_seconds ({self.job.attempt_timeout_seconds:g} s)"
            )

    def _grace_over(self) -> None:
        """The grace window is over: the provider pulls the plug. A job that was to exit by now is
        SIGKILLed; one whose launcher outlives its nodes (a Ray Train driver, whose workers' nodes
        were drained) loses the nodes and runs on, and the watch goes on as after any other fault
        the job survives."""
        reclaim = getattr(self.handle, "reclaim", None)
        if reclaim is None:
            assert self.fault is not None
            self.fault.grace_exceeded = True
            self.handle.kill()
        elif not self.reclaimed:
            self.reclaimed = True
            reclaim()

    def _rank_silence_limit(self) -> float:
        """How long a torchrun job may be silent: hang_timeout_seconds while ranks run; while none
        does (the agent restarting its group, the new ranks importing), start_timeout_seconds."""
        return self.job.hang_seconds if self.handle.ranks_alive() else self.job.start_timeout_seconds

    def _detect_hang(self, now: float) -> None:
        """After a hang-rank fault: once no rank has reported for hang_timeout_seconds, name the
        hung rank and end the job, as a watchdog would; the restart resumes like after a kill."""
        fault = self.fault
        if fault is None or fault.hang_detected_seconds is not None:
            return
        if now - max(self.last_event_at, self.delivered_at or now) > self.job.hang_seconds:
            fault.hang_detected_seconds = now - (self.delivered_at or now)
            fault.detail = (
                f"{fault.detail}; detected after {fault.hang_detected_seconds:.1f} s: {self.handle.describe_hang()}"
            )
            self.handle.kill()


def run_job(job: JobSpec, plan: Plan, workdir: Path, options: EngineOptions) -> RunRecord:
    """Run ``job`` under ``plan`` in ``workdir`` (created; holds checkpoints, events and logs).

    The checkpoint location is always a fresh directory inside ``workdir``: the harness works on
    its own copies and never touches a checkpoint it did not create.
    """
    backend = options.backend or SubprocessBackend()
    workdir.mkdir(parents=True, exist_ok=False)
    workdir = workdir.resolve()  # resolved once, now, while only the harness has touched it
    checkpoints = workdir / "checkpoints"
    checkpoints.mkdir()
    if options.keep_checkpoints:
        kept_dir(workdir).mkdir()  # the harness's own, made before the job starts: never a link the job made
    run_id = uuid.uuid4().hex[:12]
    cwd = (options.root / job.cwd) if job.cwd else options.root
    if not cwd.is_dir():
        raise JobError(f"{job.where('cwd')}: directory {cwd} does not exist")
    started = time.monotonic()
    attempts: list[Attempt] = []
    convention = options.convention  # None until a log-adapter job's uninterrupted run teaches it
    for index in range(len(plan.preemptions) + 1):
        preemption = plan.preemptions[index] if index < len(plan.preemptions) else None
        if index > 0 and options.before_restart is not None:
            swapped = options.before_restart(index)  # e.g. the storage refuses the restarted job's credentials
            if swapped:
                options = replace(options, extra_env=(*options.extra_env, *swapped.items()))
        previous = attempts[-1] if attempts else None
        resharded = index > 0 and options.resume_nproc is not None
        attempt_job = replace(job, nproc_per_node=options.resume_nproc) if resharded else job
        attempt, learned = _run_attempt(
            attempt_job, index, preemption, workdir, cwd, checkpoints, run_id, backend, options, previous
        )
        attempts.append(attempt)
        convention = convention or learned
        log.info("job %s, plan %s, attempt %d: %s", job.name, plan, index, _attempt_line(attempt))
        if preemption is not None and preemption.fault == "rerun" and attempt.final is not None:
            attempt.fault = _rerun_record(attempt)  # finished: started again on the same checkpoints
            continue
        if attempt.fault is None or attempt.final is not None:
            break  # finished (or failed without a preemption: the verdict says which)
        if job.launcher == "ray-train" and attempt.exit_code == 0:
            break  # Ray Train called the run finished (its train function returned): nothing starts it again
        if preemption is not None and preemption.damage:
            attempt.damage = damage_newest(preemption.damage, preemption.pick, attempts, checkpoints)
    unfired, not_reached = _unfired(plan, attempts)
    if job.multi_rank:  # torchrun's agent or Ray Train restarted the worker group inside a launch
        attempts = split_group_restarts(attempts)
    log.info("job %s, plan %s: %d attempt(s) in %.1f s", job.name, plan, len(attempts), time.monotonic() - started)
    return RunRecord(
        job=job.name,
        plan=str(plan),
        attempts=attempts,
        wall_seconds=time.monotonic() - started,
        workdir=str(workdir),
        unfired=unfired,
        not_reached=not_reached,
        convention=convention.report(job.log) if convention is not None and job.log is not None else None,
    )


def _rerun_record(attempt: Attempt) -> FaultRecord:
    """A ``rerun``: the attempt finished on its own; the next starts on what it left."""
    last = attempt.steps[-1].step if attempt.steps else attempt.final["step"]
    return FaultRecord(
        fault="rerun",
        planned_step=last,
        observed_step=last,
        delivered_at=attempt.wall_seconds,
        delivered_wall=time.time(),
        grace_seconds=None,
        detail="started again after it finished",
    )


def _attempt_line(attempt: Attempt) -> str:
    """What happened to one attempt, for the log: the fault and where it landed, the exit, the time."""
    fault = attempt.fault
    if fault is None:
        what = "no fault"
    elif fault.fault == "crash" or fault.fault.startswith("crash-rank"):
        what = f"{fault.fault} {fault.detail}"
    else:
        what = f"{fault.fault} sent after step {fault.observed_step}"
    return f"{what}; exit {attempt.exit_code} after {attempt.wall_seconds:.1f} s"


def _unfired(plan: Plan, attempts: list[Attempt]) -> tuple[list[str], list[str]]:
    """The planned preemptions that never reached the job: (those whose attempt ran without them:
    the plan proved nothing about them; those whose attempt never started because an earlier,
    preempted one finished the training, which a search's plan may well outrun)."""
    unfired, not_reached = [], []
    for index, planned in enumerate(plan.preemptions):
        attempt = attempts[index] if index < len(attempts) else None
        if attempt is None:
            not_reached.append(f"{planned} (attempt {index}): training finished in attempt {len(attempts) - 1}")
        elif attempt.fault is not None or attempt.failed_restart:
            continue  # fired; or the attempt failed to restart, which the verdict says instead
        elif not attempt.steps and attempt.final is not None:  # resumed after the last step: nothing to preempt
            not_reached.append(f"{planned} (attempt {index}): no training was left when it started")
        elif planned.fs_event is not None:
            unfired.append(
                f"{planned} never fired: attempt {index} made fewer than {planned.fs_event} file-system events "
                "under its checkpoint directory (crash@N counts those events, not steps)"
            )
        else:
            last = attempt.steps[-1].step if attempt.steps else None
            reached = last is not None and last >= planned.at_step
            unfired.append(
                f"{planned} never fired: attempt {index} ran to its end (step {last}) before the harness could "
                "deliver it"
                if reached
                else f"{planned} never fired: attempt {index} ended after step {last}, before step {planned.at_step}"
            )
    return unfired, not_reached


def _run_attempt(
    job: JobSpec,
    index: int,
    preemption: Preemption | None,
    workdir: Path,
    cwd: Path,
    checkpoints: Path,
    run_id: str,
    backend: Backend,
    options: EngineOptions,
    previous: Attempt | None = None,
) -> tuple[Attempt, StepConvention | None]:
    """One attempt, and the step convention it learned (a log-adapter job's uninterrupted run)."""
    folder = workdir / f"attempt-{index}"
    try:
        folder.mkdir()
    except FileExistsError:  # an earlier attempt made it (a link to elsewhere, say): never used
        raise UnsafeFile(f"{folder} already exists: the job wrote into the harness's own folders, refused") from None
    events_path = folder / "events.jsonl"
    hold = _arm_hold(job, preemption, options, folder)  # before the scratch folder: a failed FIFO leaks nothing
    # The attempt's own temporary folder: what the job leaves there (multiprocessing's pymp-* folders
    # of DataLoader workers killed mid-run) goes with the attempt instead of piling up in /tmp. Short,
    # since multiprocessing puts Unix sockets in it (108 bytes at most); a container needs none: its
    # own /tmp goes with it.
    scratch = Path(tempfile.mkdtemp(prefix="spotchaos-tmp-")) if job.container is None else None
    env = {**backend.inherited_environment(), **job.environment()}
    crash_at = preemption.fs_event if preemption is not None else None
    hooked = crash_at is not None or options.trace_fs or (hold is not None and job.log is not None)
    if hooked:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CRASHPOINT_DIR), env.get("PYTHONPATH")]))
    if crash_at is not None or options.trace_fs:
        env["SPOTCHAOS_CRASH_ROOT"] = str(checkpoints)
        env["SPOTCHAOS_CRASH_LOG"] = str(folder / FS_EVENTS)
        env["SPOTCHAOS_CRASH_AT"] = str(crash_at or 0)
        rank = preemption.crash_rank if preemption is not None else None
        if rank is not None or (options.trace_rank is not None and job.launcher == "torchrun"):
            env["SPOTCHAOS_CRASH_RANK"] = str(rank if rank is not None else options.trace_rank)
    env.update(
        {
            ENV_EVENTS: str(events_path),
            ENV_CHECKPOINT_URI: checkpoints.as_uri(),
            ENV_RUN_ID: run_id,
            ENV_ATTEMPT: str(index),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if scratch is not None:
        env["TMPDIR"] = str(scratch)
    if job.exactness == "envelope" and job.log is None:
        env[ENV_FINAL_TENSORS] = str(folder / FINAL_TENSORS)  # the probe saves the weights themselves
    if hold is not None:
        env.update(hold.environment())
        if job.log is not None:
            env.update(_hook_hold_environment(job, hold, options.convention))
    metadata = None
    fault = PREEMPTIONS[preemption.fault] if preemption is not None and preemption.fault in PREEMPTIONS else None
    if getattr(fault, "metadata", None):
        metadata = channel(fault.metadata)  # type: ignore[union-attr]
        env.update(metadata.environment())
    env.update(dict(options.extra_env))
    # before the clock starts: a wait is no start-up time. A Ray node's GPUs are Ray's to hand out
    lease = _lease_gpus(job, index, run_id, options) if backend.name != "ray" else None
    if lease is not None and job.container is None:  # a container sees its devices only, numbered from 0
        env["CUDA_VISIBLE_DEVICES"] = ",".join(lease.devices)
    # "{checkpoint_dir}" in a command is the run's own checkpoint directory: a script that takes
    # an output directory writes where the harness works on copies.
    resume = index > 0 and (job.resume_if_exists is None or any(checkpoints.glob(job.resume_if_exists)))
    argv = tuple(a.replace(CHECKPOINT_PLACEHOLDER, str(checkpoints)) for a in job.argv(resume=resume))
    spec = LaunchSpec(
        argv=argv,
        env=env,
        cwd=cwd,
        stdout_path=folder / "stdout.log",
        stderr_path=folder / "stderr.log",
        grace_seconds=float(job.grace_seconds or 30.0),
        writable=(workdir,),
        readable=(CRASHPOINT_DIR, PROBE_FILE) if hooked else (),
        gpus=lease.devices if lease is not None else (),
    )
    reader: EventReader | LogEventReader
    if job.log is not None:
        log_path = spec.stdout_path if job.log.stream == "stdout" else spec.stderr_path
        # neither armed for crashes nor writing events: it only reads a checkpoint, as the job would
        quiet = {k: v for k, v in env.items() if not k.startswith("SPOTCHAOS_CRASH") and k != ENV_EVENTS}
        confined = ConfinedLoader(
            backend, in_container=job.container is not None, env=quiet, cwd=cwd, folder=folder, writable=spec.writable
        )
        latency = getattr(backend, "log_latency_seconds", 0.0)  # the backend's own: a container's lines come late
        reader = LogEventReader(log_path, job.log, checkpoints, job.name, confined, options.convention, latency)
    else:
        reader = EventReader(events_path)
    try:
        handle = _start(backend, job, spec, run_id)
    except BaseException:  # never started: its temporary folder goes now, not with a cleanup that never runs
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if metadata is not None:
            metadata.close()
        if hold is not None:
            hold.close()
        if lease is not None:
            lease.release()
        raise
    # written down for the next pytest, should this one die: who runs, and the folder to remove
    identity = {**getattr(handle, "identity", {}), "scratch": str(scratch) if scratch is not None else None}
    entry = options.live.add(run_id, identity)
    on_checkpoint = None
    if options.keep_checkpoints == "all" or (options.keep_checkpoints == "resumed" and index > 0):

        def on_checkpoint(event: dict) -> None:
            keep(event, index, checkpoints, kept_dir(workdir))

    watch = _AttemptWatch(
        job,
        handle,
        reader,
        None if crash_at is not None else preemption,
        options.preempt_when,
        on_checkpoint,
        metadata,
        hold,
    )
    orphans: list[int] = []
    escaped: list[str] = []
    try:
        try:
            watch.run()
        except JobError as exc:
            raise JobError(f"{exc}\n  stderr (last lines):\n{last_lines(_tail(spec.stderr_path))}") from None
        orphans = handle.survivors()
    finally:
        try:
            handle.cleanup()
            reader.close()
        finally:
            # a process that left the job's group (setsid, a double fork) still carries the run's marker;
            # one that dropped its environment too was re-parented to the harness, its subreaper
            escaped = end_escaped(f"{ENV_RUN_ID}={run_id}", getattr(handle, "identity", {}).get("start"))
            options.live.discard(entry)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)  # fd-based: links inside are removed, never followed
            if metadata is not None:
                metadata.close()
            if hold is not None:
                hold.close()
            if lease is not None:
                lease.release()
    if metadata is not None and watch.fault is not None and watch.delivered_at is not None:
        watch.fault.detail = metadata.how_it_was_read(watch.delivered_at)  # did the trainer read it, how soon
    if isinstance(reader, LogEventReader) and watch.fault is None:  # a clean exit after a notice is no finish
        if watch.exit_code == 0 and index == 0 and not any(e["event"] == "step" for e in reader.events):
            stream = spec.stdout_path if job.log.stream == "stdout" else spec.stderr_path
            raise JobError(
                f"job {job.name!r} exited 0 but no line of its {job.log.stream} matched {job.log.where}.pattern "
                f"{job.log.pattern!r}; its last lines:\n{last_lines(_tail(stream))}"
            )
        reader.finish(watch.exit_code)
    learned = None
    if isinstance(reader, LogEventReader) and reader.learning and watch.exit_code == 0:
        learned = reader.learn()  # the uninterrupted run: how the script counts its steps
    if reader.torn_tail and watch.fault is None:
        raise JobError(
            f"job {job.name!r} left an unfinished event line in {events_path.name}: "
            f"{reader.torn_tail[:160].decode('utf-8', 'replace')!r} (each event must end with a newline)"
        )
    attempt = Attempt(
        index=index,
        exit_code=watch.exit_code,
        wall_seconds=time.monotonic() - watch.started,
        start_seconds=(watch.first_event_at - watch.started) if watch.first_event_at else None,
        started_wall=watch.started_wall,
        events=reader.events,
        fault=watch.fault,
        orphans=orphans,
        escaped=escaped,
        stdout_tail=_tail(spec.stdout_path),
        # torchrun's agent ends with a banner of its own: the ranks' exceptions are further up
        stderr_tail=_tail(spec.stderr_path, TAIL_BYTES * (4 if job.multi_rank else 1)),
        gpus=lease.describe() if lease is not None else None,
        placement=getattr(handle, "placement", None),
    )
    if job.launcher == "torchrun" and watch.fault is not None:
        attempt.launcher_signalled = torchrun.exited_on_notice(attempt.stderr_tail)
        attempt.launcher_killed = torchrun.killed_workers(attempt.stderr_tail)
    if watch.reclaimed:  # Ray Train's group ended with its nodes at the deadline: its checkpoint says how
        attempt.launcher_signalled = True
    if job.exactness == "envelope" and attempt.final is not None:
        final_file = reader.final_path() if isinstance(reader, LogEventReader) else folder / FINAL_TENSORS
        attempt.final_tensors = str(final_file) if final_file is not None else None
    if crash_at is not None:
        attempt.fault = _crash_record(crash_at, attempt, folder / FS_EVENTS, preemption.fault)
    elif attempt.fault is not None:
        _settle_landing(attempt, attempt.fault, hold, job, deliberate=options.preempt_when is not None)
    if attempt.fault is None and previous is not None and attempt.exit_code != 0 and options.judge_restarts:
        attempt.failed_restart = diagnose(job, attempt, previous, checkpoints, list(argv) if resume else None)
    elif attempt.fault is None:
        _check_unprovoked_exit(job, attempt)
    return attempt, learned


def _lease_gpus(job: JobSpec, index: int, run_id: str, options: EngineOptions) -> GpuLease | None:
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


def _arm_hold(job: JobSpec, preemption: Preemption | None, options: EngineOptions, folder: Path) -> Hold | None:
    """The hold for this attempt's fault, or None where the fault needs none (a crash point is
    armed inside the job, a rerun waits for the end) or must not have one (a fault that waits for
    an upload in flight: a held job uploads nothing)."""
    if preemption is None or preemption.fs_event is not None or options.preempt_when is not None:
        return None
    fault = PREEMPTIONS.get(preemption.fault)
    if fault is None or preemption.fault == "rerun":
        return None
    target = getattr(fault, "target", None)  # a rank's fault holds that rank; a node's, its first rank
    rank = 0 if target is None else target
    if preemption.fault.startswith("lose-node") and job.launcher == "torchrun":  # Ray Train's: rank r's node
        rank = target * job.nproc_per_node
    # the job's side gives up after half the silence the harness allows, so a hold never reads as a hang
    # a container's numeric user gets the hold's FIFOs as its own (else they stay the harness's)
    owner = job.container.uid if job.container is not None else None
    seconds = job.event_timeout_seconds / 2
    return Hold(folder / "hold", preemption.at_step, rank=rank, seconds=seconds, owner=owner)


def _hook_hold_environment(job: JobSpec, hold: Hold, convention: StepConvention | None) -> dict[str, str]:
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
    return env


def _settle_landing(
    attempt: Attempt, fault: FaultRecord, hold: Hold | None, job: JobSpec, *, deliberate: bool = False
) -> None:
    """Where the fault landed (spotchaos/training/engine/landing.py), from the attempt's events and the hold.
    ``deliberate``: the family held the fault back on purpose (until an upload was in flight), so
    where it landed is recorded but is not lateness."""
    if fault.fault == "rerun" or fault.fault.startswith("crash"):
        return
    kind = PREEMPTIONS.get(fault.fault)
    ends_job = kind is not None and not kind.graceful and not getattr(kind, "continues", False)
    held = hold.poll() if hold is not None else None
    settle(fault, attempt.events, held_step=held, ends_job=ends_job, job_clock=job.log is None)
    if deliberate:
        fault.steps_late = fault.passed_checkpoint = None
    if fault.held and hold is not None:
        step_t = next(
            (e["t"] for e in attempt.events if e["event"] == "step" and e.get("rank", 0) == 0 and e["step"] == held),
            None,
        )
        end = hold.released_wall or fault.delivered_wall
        fault.held_seconds = max(0.0, end - step_t) if step_t is not None else None


def _start(backend: Backend, job: JobSpec, spec: LaunchSpec, run_id: str) -> Handle:
    """One attempt started by its launcher: torchrun's agents, a Ray Train driver, else the command."""
    if job.launcher == "torchrun":
        return torchrun.start(backend, job, spec, run_id)
    if job.launcher == "ray-train":
        if not hasattr(backend, "start_job"):
            raise JobError(f"{job.where('launcher')}: a Ray Train job needs the session's Ray cluster (spotchaos[ray])")
        return backend.start_job(job, spec, run_id)
    return backend.start(spec)


def split_group_restarts(attempts: list[Attempt]) -> list[Attempt]:
    """One launch of a torchrun job may hold several runs of its worker group: the agent restarts
    every rank when one dies (or a lost node's replacement joins). Each run becomes an attempt of
    its own, as a restart by the harness would, so every verdict (resumed from the newest durable
    checkpoint, steps replayed bit-exact) applies to it. A rank's n-th start event opens its n-th
    group run; the fault stays with the run it hit, the exit and the damage with the last."""
    split: list[Attempt] = []
    for launch in attempts:
        runs: list[list] = [[]]
        starts: dict[int, int] = {}
        for event in launch.events:
            rank = event.get("rank", 0)
            if event["event"] == "start":
                starts[rank] = starts.get(rank, -1) + 1
            group_run = max(starts.get(rank, 0), 0)
            while len(runs) <= group_run:
                runs.append([])
            runs[group_run].append(event)
        for number, events in enumerate(runs):
            last = number == len(runs) - 1
            part = replace(
                launch,
                index=len(split),
                events=events,
                fault=launch.fault if number == 0 else None,
                damage=launch.damage if last else None,
                exit_code=launch.exit_code if last else None,
                failed_restart=launch.failed_restart if last else None,
                group_restart=number,
                launch=launch.index,
            )
            if number:
                first = events[0]["t"] if events else launch.started_wall
                part.started_wall, part.start_seconds = first, 0.0
            split.append(part)
    return split


def read_fs_events(path: Path) -> list[dict]:
    """The file-system events a traced or crash-armed attempt logged (see spotchaos/faults/crashpoint).

    The job's own process writes this log, so it is read like any file of the job: bounded, no
    link followed, and a line that is not an event is an error naming the file."""
    events = []
    text = read_text_bounded(path, FS_EVENTS_BYTES)
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not (
            isinstance(event, dict) and isinstance(event.get("index"), int) and isinstance(event.get("t"), float | int)
        ):
            raise JobError(f"{path.name} line {number}: not a file-system event the crash-point hook wrote")
        events.append(event)
    return events


def _crash_record(crash_at: int, attempt: Attempt, log: Path, name: str = "crash") -> FaultRecord | None:
    """The crash as it happened, or None when the job never reached that file-system event (a
    rank's crash ends the rank, not the launcher: its logged hit is the evidence)."""
    hit = [e for e in read_fs_events(log) if e["index"] == crash_at] if log.exists() else []
    if not hit or (attempt.exit_code != -9 and name == "crash"):
        return None
    steps = attempt.steps
    return FaultRecord(
        fault=name,
        planned_step=crash_at,
        observed_step=steps[-1].step if steps else -1,
        delivered_at=hit[0]["t"] - attempt.started_wall,
        delivered_wall=hit[0]["t"],
        exit_seconds=0.0,
        detail=f"before {hit[0]['event']} {'/'.join(Path(hit[0]['path']).parts[-2:])} (file-system event {crash_at})",
    )


def _check_unprovoked_exit(job: JobSpec, attempt: Attempt) -> None:
    """An attempt that ended without our fault must have finished training cleanly."""
    last = attempt.steps[-1].step if attempt.steps else None
    at = f"after step {last}" if last is not None else "before its first step"
    if attempt.exit_code != 0:
        died = torchrun.rank_errors(attempt.stderr_tail) if job.launcher == "torchrun" else ""
        cause = f"the ranks died with: {died}" if died else f"stderr (last lines):\n{last_lines(attempt.stderr_tail)}"
        raise JobError(
            f"job {job.name!r} exited with status {attempt.exit_code} in attempt {attempt.index} {at}, "
            f"without any preemption due.\n  {cause}"
        )
    if attempt.final is None:
        raise JobError(
            f"job {job.name!r} exited 0 in attempt {attempt.index} {at} without a 'final' event: "
            "call probe.final(model.state_dict(), step=...) when training ends"
        )


def _durable_checkpoints(attempts: list[Attempt], root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint the run reported durable that still exists inside ``root``,
    oldest first (``root`` is absolute). Anything outside the run's own directory is never a target.

    A reported path is normalised as text, never resolved: resolving would follow the links the
    job made (``ckpt-5 -> /home/user``) and take their targets for checkpoints."""
    found: dict[Path, int] = {}
    for attempt in attempts:
        for event in attempt.of_kind("checkpoint"):
            parsed = urlparse(event["uri"])
            path = Path(os.path.normpath(unquote(parsed.path) or "."))
            if parsed.scheme == "s3":
                raise OutsideCheckpoint(
                    f"checkpoint {event['uri']} is in S3: damaging S3 objects between attempts is not supported yet"
                )
            if (
                parsed.scheme not in ("", "file")
                or not path.is_absolute()
                or not path.is_relative_to(root)
                or path == root
            ):
                raise OutsideCheckpoint(
                    f"the job reported checkpoint {event['uri']} outside the run's own directory {root.as_uri()} "
                    "(SPOTCHAOS_CHECKPOINT_URI): spotchaos damages only checkpoints its run created, so it refuses"
                )
            found[path] = event["step"]
    return sorted(((step, path) for path, step in found.items() if os.path.lexists(path)), key=lambda sp: sp[0])


class OutsideCheckpoint(JobError):
    """A checkpoint fault was asked for a checkpoint the harness did not create."""


class DamageRefused(JobError):
    """A checkpoint fault could not change the checkpoint (read-only, a full disk)."""


def damage_newest(fault_name: str, pick: float, attempts: list[Attempt], root: Path) -> Damage:
    """Apply a checkpoint fault to the newest durable checkpoint of this run, between attempts."""
    root = Path(os.path.abspath(root))  # once, as text: never resolved (that would follow the job's links)
    durable = _durable_checkpoints(attempts, root)
    if not durable:
        return Damage(fault_name, "", applied=False, detail="no durable checkpoint yet")
    checkpoints = CheckpointSet(tuple(path for _, path in durable), root)
    checkpoints.verify()  # UnsafeCheckpoint: a link or a special file in it, and nothing is touched
    try:
        damage = CHECKPOINT_FAULTS[fault_name].apply(checkpoints, pick)
    except ValueError as exc:
        return Damage(fault_name, str(checkpoints.newest), applied=False, detail=str(exc))
    except UnsafeFile:
        raise
    except OSError as exc:  # read-only checkpoints (the job chmod-ed them), a full disk: nothing was changed
        where = Path(exc.filename).name if isinstance(exc.filename, str) else checkpoints.newest.name
        raise DamageRefused(
            f"{fault_name} could not be applied to checkpoint {checkpoints.newest.name} ({where}: "
            f"{exc.strerror or exc}): the job left its checkpoints unwritable for the harness's user, so this "
            "plan tests nothing; nothing was changed (make them writable, or leave this fault out of the plan)"
        ) from None
    damage.damaged_step = durable[-1][0]
    if damage.makes_unloadable:
        damage.expected_resume = durable[-2][0] if len(durable) > 1 else None
    else:
        damage.expected_resume = durable[-1][0]
    return damage

"""One attempt of a run, in the order it happens: its folder, its environment (the contract's
variables, the hold, a crash point, a cloud's metadata, a GPU lease), its launch, the watch, and
its record. Every resource it takes is released on every way out of it (one ExitStack), so a
refused lease or a launch that fails leaves no folder, FIFO or metadata server behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ...backends import Backend, Handle, LaunchSpec
from ...config.jobs import JobSpec
from ...errors import JobError
from ...faults import PREEMPTIONS
from ...faults.notices import MetadataNotice, channel
from ...faults.plan import Preemption
from ...host.gpu_leases import GpuLease, GpuPool, GpuUnavailable
from ...host.processes import end_escaped
from ...probe import ENV_ATTEMPT, ENV_CHECKPOINT_URI, ENV_EVENTS, ENV_FINAL_TENSORS, ENV_RUN_ID
from ...safety.safefs import UnsafeFile, last_lines, log_tail, read_text_bounded
from ..events import EventReader
from ..logadapter import LogEventReader, StepConvention
from ..multirank import torchrun
from ..restarts import diagnose
from ..state.checkpoint_reader import ConfinedLoader
from ..state.kept import keep, kept_dir
from ..trajectory import Attempt, FaultRecord
from .hold import (
    ENV_HOLD_PATTERN,
    ENV_HOLD_PRINTED,
    ENV_HOLD_PROBE,
    ENV_HOLD_SKIP,
    ENV_HOLD_STREAM,
    PROBE_FILE,
    CheckpointHold,
    Hold,
)
from .landing import settle
from .options import (
    CHECKPOINT_PLACEHOLDER,
    CRASHPOINT_DIR,
    FINAL_TENSORS,
    FS_EVENTS,
    FS_OUTSIDE,
    FS_READS,
    EngineOptions,
)
from .warmth import may_start_warm, preload_of, start_environment
from .watch import AttemptWatch

TAIL_BYTES = 4000


FS_EVENTS_BYTES = 64 << 20


def _tail(path: Path, limit: int = TAIL_BYTES) -> str:
    return log_tail(path, limit)


@dataclass
class _Watched:
    """What the watch of a started attempt leaves: the watch, the processes that outlived the job's
    group, those that escaped it (ended by the run's marker), and where it ran (a Ray node)."""

    watch: AttemptWatch
    orphans: list[int]
    escaped: list[str]
    placement: dict | None
    start_kind: str  # "warm", or "cold" and why not warm


class AttemptRun:
    """One attempt, a method a phase: the environment, the launch, the watch (start to teardown, in
    one ExitStack), and the record made of what happened. ``run()`` returns the attempt and the step
    convention it learned (a log-adapter job's uninterrupted run)."""

    def __init__(
        self,
        job: JobSpec,
        index: int,
        preemption: Preemption | None,
        workdir: Path,
        cwd: Path,
        checkpoints: Path,
        run_id: str,
        backend: Backend,
        options: EngineOptions,
        previous: Attempt | None,
    ) -> None:
        self.job, self.index, self.preemption, self.previous = job, index, preemption, previous
        self.workdir, self.cwd, self.checkpoints = workdir, cwd, checkpoints
        self.run_id, self.backend, self.options = run_id, backend, options
        self.crash_at = preemption.fs_event if preemption is not None else None
        self.folder = workdir / f"attempt-{index}"
        self.events_path = self.folder / "events.jsonl"
        self.hold: Hold | None = None
        self.checkpoint_hold: CheckpointHold | None = None
        self.scratch: Path | None = None
        self.start_env: dict[str, str] | None = None  # set with the environment, where it may start warm
        self.metadata: MetadataNotice | None = None
        self.lease: GpuLease | None = None
        self.hooked = False

    def run(self) -> tuple[Attempt, StepConvention | None]:
        try:
            self.folder.mkdir()
        except FileExistsError:  # an earlier attempt made it (a link to elsewhere, say): never used
            raise UnsafeFile(
                f"{self.folder} already exists: the job wrote into the harness's own folders, refused"
            ) from None
        with contextlib.ExitStack() as resources:  # released on every way out, started or not
            env = self._environment(resources)
            resume = self.index > 0 and (
                self.job.resume_if_exists is None or any(self.checkpoints.glob(self.job.resume_if_exists))
            )
            spec = self._launch_spec(env, resume)
            reader = self._reader(spec, env)
            watched = self._watch(spec, reader)
        return self._record(spec, reader, watched, resume)

    def _environment(self, resources: contextlib.ExitStack) -> dict[str, str]:
        """The job's environment: the contract's variables, and what this attempt's fault needs (the
        hold, a crash point, a cloud's metadata, leased GPUs); each resource taken is given back by
        ``resources``."""
        job, options, preemption = self.job, self.options, self.preemption
        self.hold = _arm_hold(job, preemption, options, self.folder)  # before the scratch folder
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
                env.update(_hook_hold_environment(job, self.hold, options.convention))
        fault = PREEMPTIONS[preemption.fault] if preemption is not None and preemption.fault in PREEMPTIONS else None
        if getattr(fault, "metadata", None):
            self.metadata = channel(fault.metadata)  # type: ignore[union-attr]
            resources.callback(self.metadata.close)
            env.update(self.metadata.environment())
        env.update(dict(options.extra_env))
        # before the clock starts: a wait is no start-up time. A Ray node's GPUs are Ray's to hand out
        self.lease = _lease_gpus(job, self.index, self.run_id, options) if self.backend.name != "ray" else None
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
        if rank is not None or (self.options.trace_rank is not None and self.job.launcher == "torchrun"):
            env["SPOTCHAOS_CRASH_RANK"] = str(rank if rank is not None else self.options.trace_rank)
        return env

    def _launch_spec(self, env: dict[str, str], resume: bool) -> LaunchSpec:
        # "{checkpoint_dir}" in a command is the run's own checkpoint directory: a script that takes
        # an output directory writes where the harness works on copies.
        argv = tuple(a.replace(CHECKPOINT_PLACEHOLDER, str(self.checkpoints)) for a in self.job.argv(resume=resume))
        return LaunchSpec(
            argv=argv,
            env=env,
            cwd=self.cwd,
            stdout_path=self.folder / "stdout.log",
            stderr_path=self.folder / "stderr.log",
            grace_seconds=float(self.job.grace_seconds or 30.0),
            writable=(self.workdir,),
            readable=(CRASHPOINT_DIR, PROBE_FILE) if self.hooked else (),
            gpus=self.lease.devices if self.lease is not None else (),
            start_env=self.start_env,
            preload=preload_of(self.job),
        )

    def _reader(self, spec: LaunchSpec, env: dict[str, str]) -> EventReader | LogEventReader:
        """The probe's events file, or (an unmodified script) its printed lines and checkpoint files."""
        job = self.job
        if job.log is None:
            return EventReader(self.events_path)
        log_path = spec.stdout_path if job.log.stream == "stdout" else spec.stderr_path
        # neither armed for crashes nor writing events: it only reads a checkpoint, as the job would
        quiet = {k: v for k, v in env.items() if not k.startswith("SPOTCHAOS_CRASH") and k != ENV_EVENTS}
        confined = ConfinedLoader(
            self.backend,
            in_container=job.container is not None,
            env=quiet,
            cwd=self.cwd,
            folder=self.folder,
            writable=spec.writable,
            start_env=self.start_env,
            preload=preload_of(job),
        )
        latency = getattr(self.backend, "log_latency_seconds", 0.0)  # the backend's own: a container's lines come late
        return LogEventReader(log_path, job.log, self.checkpoints, job.name, confined, self.options.convention, latency)

    def _watch(self, spec: LaunchSpec, reader: EventReader | LogEventReader) -> _Watched:
        """Start the job, watch it to its end, and end whatever it left behind."""
        handle = _start(self.backend, self.job, spec, self.run_id)
        # written down for the next pytest, should this one die: who runs, and the folder to remove
        scratch = str(self.scratch) if self.scratch is not None else None
        entry = self.options.live.add(self.run_id, {**getattr(handle, "identity", {}), "scratch": scratch})
        on_checkpoint = None
        keep_mode = self.options.keep_checkpoints
        keeping = keep_mode == "all" or (keep_mode == "resumed" and self.index > 0)
        snapshots, held = self.options.snapshots, self.checkpoint_hold
        if keeping or held is not None:

            def on_checkpoint(event: dict) -> None:
                if keeping:
                    keep(event, self.index, self.checkpoints, kept_dir(self.workdir), self.options.kept)
                if snapshots is not None and held is not None:
                    snapshots.take(event, self.checkpoints, held)

        preemption = None if self.crash_at is not None else self.preemption
        watch = AttemptWatch(
            self.job, handle, reader, preemption, self.options.preempt_when, on_checkpoint, self.metadata, self.hold
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
                escaped = end_escaped(f"{ENV_RUN_ID}={self.run_id}", getattr(handle, "identity", {}).get("start"))
                self.options.live.discard(entry)
        return _Watched(
            watch, orphans, escaped, getattr(handle, "placement", None), getattr(handle, "start_kind", "cold")
        )

    def _record(
        self,
        spec: LaunchSpec,
        reader: EventReader | LogEventReader,
        watched: _Watched,
        resume: bool,
    ) -> tuple[Attempt, StepConvention | None]:
        """What the attempt did, judged as far as one attempt can be: a clean exit with no step
        matched, a torn event line, an exit nobody provoked, a restart that failed and why."""
        job, watch = self.job, watched.watch
        if self.metadata is not None and watch.fault is not None and watch.delivered_at is not None:
            watch.fault.detail = self.metadata.how_it_was_read(watch.delivered_at)  # did the trainer read it
        learned = self._finish_reader(spec, reader, watch)
        attempt = Attempt(
            index=self.index,
            exit_code=watch.exit_code,
            wall_seconds=time.monotonic() - watch.started,
            start_seconds=_start_seconds(watch),
            started_wall=watch.started_wall,
            events=reader.events,
            fault=watch.fault,
            orphans=watched.orphans,
            escaped=watched.escaped,
            stdout_tail=_tail(spec.stdout_path),
            # torchrun's agent ends with a banner of its own: the ranks' exceptions are further up
            stderr_tail=_tail(spec.stderr_path, TAIL_BYTES * (4 if job.multi_rank else 1)),
            gpus=self.lease.describe() if self.lease is not None else None,
            placement=watched.placement,
            start_kind=watched.start_kind,
        )
        if job.launcher == "torchrun" and watch.fault is not None:
            attempt.launcher_signalled = torchrun.exited_on_notice(attempt.stderr_tail)
            attempt.launcher_killed = torchrun.killed_workers(attempt.stderr_tail)
            attempt.launcher_shutdown_seconds = torchrun.shutdown_seconds(job, spec.env)
        if watch.reclaimed:  # Ray Train's group ended with its nodes at the deadline: its checkpoint says how
            attempt.launcher_signalled = True
        if job.exactness == "envelope" and attempt.final is not None:
            final_file = reader.final_path() if isinstance(reader, LogEventReader) else self.folder / FINAL_TENSORS
            attempt.final_tensors = str(final_file) if final_file is not None else None
        if self.crash_at is not None:
            attempt.fault = _crash_record(self.preemption, attempt, self.folder / FS_EVENTS)
        elif attempt.fault is not None:
            settle_landing(attempt, attempt.fault, self.hold, job, deliberate=self.options.preempt_when is not None)
        restarted = self.previous is not None and attempt.exit_code != 0 and self.options.judge_restarts
        if attempt.fault is None and restarted:
            argv = list(spec.argv) if resume else None
            attempt.failed_restart = diagnose(job, attempt, self.previous, self.checkpoints, argv)
        elif attempt.fault is None:
            _check_unprovoked_exit(job, attempt)
        return attempt, learned

    def _finish_reader(
        self, spec: LaunchSpec, reader: EventReader | LogEventReader, watch: AttemptWatch
    ) -> StepConvention | None:
        """The reader's last word: a log-adapter job's final weights and the step convention its
        uninterrupted run teaches; an event line left unfinished is the job's error."""
        job = self.job
        if isinstance(reader, LogEventReader) and watch.fault is None:  # a clean exit after a notice is no finish
            if watch.exit_code == 0 and self.index == 0 and not any(e["event"] == "step" for e in reader.events):
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
                f"job {job.name!r} left an unfinished event line in {self.events_path.name}: "
                f"{reader.torn_tail[:160].decode('utf-8', 'replace')!r} (each event must end with a newline)"
            )
        return learned


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
    node_fault = preemption.fault.startswith(("lose-node", "drain-node"))
    if node_fault and job.launcher == "torchrun":  # Ray Train's: rank r's node
        rank = target * job.nproc_per_node
    if preemption.fault.startswith("drain-node") and job.launcher == "ray-train":
        # every rank reads the drain through get_preemption_info(), which is rank 0's answer
        # broadcast (Ray 2.60): held anywhere else, rank 0 would already have answered None
        rank = 0
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


def settle_landing(
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
    settle(
        fault,
        attempt.events,
        held_step=held,
        ends_job=ends_job,
        job_clock=job.log is None,
        started_wall=attempt.started_wall or None,
    )
    if deliberate:
        fault.steps_late = fault.passed_checkpoint = None
    if fault.held and hold is not None:
        step_t = next(
            (e["t"] for e in attempt.events if e["event"] == "step" and e.get("rank", 0) == 0 and e["step"] == held),
            None,
        )
        end = hold.released_wall or fault.delivered_wall
        fault.held_seconds = max(0.0, end - step_t) if step_t is not None else None


def _start_seconds(watch: AttemptWatch) -> float | None:
    """Launch to the job's first step: the imports, the model and data built, a checkpoint
    restored (an integration that says "start" when its callback is made would have them all
    count as training); launch to its first event where it never stepped (killed while loading)."""
    ended = watch.first_step_at or watch.first_event_at
    return None if ended is None else ended - watch.started


def _start(backend: Backend, job: JobSpec, spec: LaunchSpec, run_id: str) -> Handle:
    """One attempt started by its launcher: torchrun's agents, a Ray Train driver, else the command."""
    if job.launcher == "torchrun":
        return torchrun.start(backend, job, spec, run_id)
    if job.launcher == "ray-train":
        if not hasattr(backend, "start_job"):
            raise JobError(f"{job.where('launcher')}: a Ray Train job needs the session's Ray cluster (spotchaos[ray])")
        return backend.start_job(job, spec, run_id)
    return backend.start(spec)


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


def _crash_record(planned: Preemption, attempt: Attempt, log: Path) -> FaultRecord | None:
    """The crash as it happened, or None when the job never reached that file-system event (a
    rank's crash ends the rank, not the launcher: its logged hit is the evidence)."""
    crash_at, after, name = planned.at_step, planned.after_step, planned.fault
    events = read_fs_events(log) if log.exists() else []
    if after is None:
        hit = [e for e in events if e["index"] == crash_at]
    else:  # counted from the job's report of step ``after`` (the hook logs the last step and the count since)
        hit = [e for e in events if e.get("step") == after and e.get("since") == crash_at]
    if not hit or (attempt.exit_code != -9 and name == "crash"):
        return None
    steps = attempt.steps
    where = f"file-system event {crash_at}" if after is None else f"file-system event {crash_at} after step {after}"
    return FaultRecord(
        fault=name,
        planned_step=crash_at,
        observed_step=steps[-1].step if steps else -1,
        delivered_at=hit[0]["t"] - attempt.started_wall,
        delivered_wall=hit[0]["t"],
        exit_seconds=0.0,
        detail=f"before {hit[0]['event']} {'/'.join(Path(hit[0]['path']).parts[-2:])} ({where})",
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

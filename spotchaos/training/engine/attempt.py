"""One attempt of a run, in the order it happens: its folder, its environment (the contract's
variables, the hold, a crash point, a cloud's metadata, a GPU lease), its launch, the watch, and
its record. Every resource it takes is released on every way out of it (one ExitStack), so a
refused lease or a launch that fails leaves no folder, FIFO or metadata server behind."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...backends import Backend, Handle, LaunchSpec
from ...config.jobs import JobSpec
from ...config.placeholders import fill, latest_checkpoint, wants_latest
from ...errors import JobError
from ...faults import PREEMPTIONS, traits
from ...faults.plan import Preemption
from ...host.processes import end_escaped
from ...probe import ENV_EVENTS, ENV_RUN_ID
from ...safety.safefs import UnsafeFile, last_lines, log_tail, read_text_bounded
from ..events import EventReader, LineReader
from ..logadapter import LogEventReader, StepConvention
from ..multirank import torchrun
from ..restarts import diagnose
from ..state.checkpoint_reader import ConfinedLoader, Confinement
from ..state.kept import keep, kept_dir
from ..trajectory import Attempt, FaultRecord
from .environment import AttemptEnvironment, RunContext
from .hold import (
    PROBE_FILE,
    Hold,
)
from .landing import settle
from .options import (
    CRASHPOINT_DIR,
    FINAL_TENSORS,
    FS_EVENTS,
    EngineOptions,
)
from .warmth import preload_of
from .watch import AttemptFault, AttemptWatch

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


def _latest(job: JobSpec, index: int, checkpoints: Path) -> Path | None:
    """A restart's newest checkpoint, for ``{latest_checkpoint}`` in its resume arguments; a restart
    with none starts fresh, as ``resume_if_exists`` does (config/placeholders.py)."""
    if index == 0 or not wants_latest(job.argv(resume=True)):
        return None
    pattern = job.resume_if_exists or (job.log.checkpoints if job.log is not None else None)
    return latest_checkpoint(checkpoints, pattern)


class AttemptRun:
    """One attempt, a method a phase: the environment, the launch, the watch (start to teardown, in
    one ExitStack), and the record made of what happened. ``run()`` returns the attempt and the step
    convention it learned (a log-adapter job's uninterrupted run)."""

    def __init__(
        self,
        job: JobSpec,
        index: int,
        preemption: Preemption | None,
        context: RunContext,
        options: EngineOptions,
        previous: Attempt | None,
    ) -> None:
        self.job, self.index, self.preemption, self.previous = job, index, preemption, previous
        self.workdir, self.cwd, self.checkpoints = context.workdir, context.cwd, context.checkpoints
        self.run_id, self.backend, self.options = context.run_id, context.backend, options
        self.setup = AttemptEnvironment(job, index, preemption, context, options)
        # derived once, by the environment that arms them
        self.crash_at, self.folder, self.events_path = self.setup.crash_at, self.setup.folder, self.setup.events_path

    def run(self) -> tuple[Attempt, StepConvention | None]:
        try:
            self.folder.mkdir()
        except FileExistsError:  # an earlier attempt made it (a link to elsewhere, say): never used
            raise UnsafeFile(
                f"{self.folder} already exists: the job wrote into the harness's own folders, refused"
            ) from None
        with contextlib.ExitStack() as resources:  # released on every way out, started or not
            env = self.setup.build(resources)
            latest = _latest(self.job, self.index, self.checkpoints)
            resume = (
                self.index > 0
                and (self.job.resume_if_exists is None or any(self.checkpoints.glob(self.job.resume_if_exists)))
                and (latest is not None or not wants_latest(self.job.argv(resume=True)))
            )
            spec = self._launch_spec(env, resume, latest)
            reader = self._reader(spec, env)
            watched = self._watch(spec, reader)
        return self._record(spec, reader, watched, resume)

    def _launch_spec(self, env: dict[str, str], resume: bool, latest: Path | None = None) -> LaunchSpec:
        # "{checkpoint_dir}" in a command is the run's own checkpoint directory: a script that takes
        # an output directory writes where the harness works on copies.
        argv = tuple(fill(a, self.checkpoints, latest) for a in self.job.argv(resume=resume))
        return LaunchSpec(
            argv=argv,
            env=env,
            cwd=self.cwd,
            stdout_path=self.folder / "stdout.log",
            stderr_path=self.folder / "stderr.log",
            grace_seconds=float(self.job.grace_seconds or 30.0),
            writable=(self.workdir,),
            readable=(CRASHPOINT_DIR, PROBE_FILE) if self.setup.hooked else (),
            gpus=self.setup.lease.devices if self.setup.lease is not None else (),
            start_env=self.setup.start_env,
            preload=preload_of(self.job),
            marker=f"{ENV_RUN_ID}={self.run_id}",
        )

    def _reader(self, spec: LaunchSpec, env: dict[str, str]) -> EventReader | LogEventReader:
        """The probe's events file, or (an unmodified script) its printed lines and checkpoint files."""
        job = self.job
        if job.log is None:
            return EventReader(self.events_path)
        log_path = spec.stdout_path if job.log.stream == "stdout" else spec.stderr_path
        # neither armed for crashes nor writing events: it only reads a checkpoint, as the job would
        quiet = {k: v for k, v in env.items() if not k.startswith("SPOTCHAOS_CRASH") and k != ENV_EVENTS}
        confinement = Confinement(
            env=quiet,
            cwd=self.cwd,
            writable=spec.writable,
            in_container=job.container is not None,
            start_env=self.setup.start_env,
            preload=preload_of(job),
        )
        confined = ConfinedLoader(self.backend, confinement, self.folder)
        latency = self.backend.log_latency_seconds  # the backend's own: a container's lines come late
        # a torchrun job's rank 0 writes its own log in torchrun's folder: read there, not a tee's poll later
        if job.kind.local_ranks:
            lines: LineReader = torchrun.RankLogLines(torchrun.log_dir(spec), job.log.stream, latency)
        else:
            lines = LineReader(log_path, f"{job.log.stream} log", latency)
        return LogEventReader(lines, job.log, self.checkpoints, job.name, confined, self.options.convention)

    def _watch(self, spec: LaunchSpec, reader: EventReader | LogEventReader) -> _Watched:
        """Start the job, watch it to its end, and end whatever it left behind."""
        handle = _start(self.backend, self.job, spec, self.run_id)
        # written down for the next pytest, should this one die: who runs, and the folder to remove
        scratch = str(self.setup.scratch) if self.setup.scratch is not None else None
        entry = self.options.live.add(self.run_id, {**handle.identity, "scratch": scratch})
        on_checkpoint = None
        keep_mode = self.options.keep_checkpoints
        keeping = keep_mode == "all" or (keep_mode == "resumed" and self.index > 0)
        snapshots, held = self.options.snapshots, self.setup.checkpoint_hold
        if keeping or held is not None:

            def on_checkpoint(event: dict) -> None:
                if keeping:
                    keep(event, self.index, self.checkpoints, kept_dir(self.workdir), self.options.kept)
                if snapshots is not None and held is not None:
                    snapshots.take(event, self.checkpoints, held)

        preemption = None if self.crash_at is not None else self.preemption
        fault = AttemptFault(preemption, self.options.preempt_when, self.setup.metadata, self.setup.hold)
        watch = AttemptWatch(self.job, handle, reader, fault, on_checkpoint)
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
                escaped = end_escaped(f"{ENV_RUN_ID}={self.run_id}", handle.identity.get("start"))
                self.options.live.discard(entry)
        return _Watched(watch, orphans, escaped, handle.placement, handle.start_kind)

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
        if self.setup.metadata is not None and watch.fault is not None and watch.delivered_at is not None:
            watch.fault.detail = self.setup.metadata.how_it_was_read(watch.delivered_at)  # did the trainer read it
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
            gpus=self.setup.lease.describe() if self.setup.lease is not None else None,
            placement=watched.placement,
            start_kind=watched.start_kind,
        )
        if job.kind.local_ranks and watch.fault is not None:
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
            settle_landing(
                attempt, attempt.fault, self.setup.hold, job, deliberate=self.options.preempt_when is not None
            )
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
        if isinstance(reader, LogEventReader) and job.kind.local_ranks:  # a script printing on every rank
            for rank, lines in sorted(torchrun.other_ranks_lines(spec, job, job.log.stream).items()):
                reader.events.extend(reader.rank_steps(rank, lines))
        if reader.torn_tail and watch.fault is None:
            raise JobError(
                f"job {job.name!r} left an unfinished event line in {self.events_path.name}: "
                f"{reader.torn_tail[:160].decode('utf-8', 'replace')!r} (each event must end with a newline)"
            )
        return learned


def settle_landing(
    attempt: Attempt, fault: FaultRecord, hold: Hold | None, job: JobSpec, *, deliberate: bool = False
) -> None:
    """Where the fault landed (spotchaos/training/engine/landing.py), from the attempt's events and the hold.
    ``deliberate``: the family held the fault back on purpose (until an upload was in flight), so
    where it landed is recorded but is not lateness."""
    if traits(fault.fault).reruns or traits(fault.fault).armed_by_environment:
        return
    kind = PREEMPTIONS.get(fault.fault)
    ends_job = kind is not None and not kind.graceful and not kind.continues
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


def _start_ray_train(backend: Backend, job: JobSpec, spec: LaunchSpec, run_id: str) -> Handle:
    if not hasattr(backend, "start_job"):  # the session's Ray Train backend; imported only for such a job
        raise JobError(f"{job.where('launcher')}: a Ray Train job needs the session's Ray cluster (spotchaos[ray])")
    return backend.start_job(job, spec, run_id)


# each launcher's way to start an attempt, by the name a job declares: looked up once, here
STARTERS: dict[str, Callable[[Backend, JobSpec, LaunchSpec, str], Handle]] = {
    "python": lambda backend, job, spec, run_id: backend.start(spec),
    "torchrun": torchrun.start,
    "ray-train": _start_ray_train,
}


def _start(backend: Backend, job: JobSpec, spec: LaunchSpec, run_id: str) -> Handle:
    """One attempt started by its launcher: torchrun's agents, a Ray Train driver, else the command."""
    return STARTERS[job.launcher](backend, job, spec, run_id)


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
    else:  # counted from the job's first report of step ``after`` (the hook logs that count, armed)
        hit = [e for e in events if e.get("counted") == crash_at]
    whole_job = not traits(name).targeted  # a rank's crash point ends its launcher otherwise than by SIGKILL
    if not hit or (attempt.exit_code != -9 and whole_job):
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
        at_fs_event=crash_at,
        detail=f"before {hit[0]['event']} {'/'.join(Path(hit[0]['path']).parts[-2:])} ({where})",
    )


def _check_unprovoked_exit(job: JobSpec, attempt: Attempt) -> None:
    """An attempt that ended without our fault must have finished training cleanly."""
    last = attempt.steps[-1].step if attempt.steps else None
    at = f"after step {last}" if last is not None else "before its first step"
    if attempt.exit_code != 0:
        died = torchrun.rank_errors(attempt.stderr_tail) if job.kind.local_ranks else ""
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

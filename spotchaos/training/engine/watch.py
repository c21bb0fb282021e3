"""The watch over one running attempt: it reads the job's events as they come, delivers the
planned fault at its step (and releases the step hold), and enforces every timeout, so a job that
hangs, never starts or outlives its grace window ends in one line naming which."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...backends import Handle
from ...config.exit_status import slurm_lead
from ...config.jobs import JobSpec
from ...errors import BackendError, JobError
from ...faults import PREEMPTIONS, PreemptionFault, traits
from ...faults.notices import MetadataNotice
from ...faults.plan import Preemption
from ...host.extension_locks import build_lock_note
from ..events import EventReader
from ..logadapter import LogEventReader
from ..trajectory import FaultRecord
from .hold import Hold

POLL_SECONDS = 0.003


# a signal to the whole group acts on every process of it while the job is held: a DataLoader
# worker it kills is dead, and its death seen by the main process, before the main process goes
# on (released at once, a fast job's checkpoint and exit raced the workers' deaths)
GROUP_SETTLE_SECONDS = 0.5
# how long a fault of an unmodified script's other rank waits for that rank's hold after rank 0's
# line of the planned step: in step with rank 0, it prints its own line about then
OTHER_RANK_HOLD_SECONDS = 5.0


def _lead(job: JobSpec) -> float:
    """Seconds from Slurm's warning signal to its SIGTERM (the job's ``slurm_signal``)."""
    return slurm_lead(job.slurm_signal)[1]


def _window(job: JobSpec, fault: PreemptionFault, handle: Handle) -> float | None:
    """The window a graceful fault gives: the job's grace, a launcher's own (KubeRay's drain
    timeout), or Slurm's lead plus its KillWait (the job's grace)."""
    if fault.warns:
        return _lead(job) + float(job.grace_seconds or 30.0)
    window = handle.notice_window_seconds
    return job.grace_seconds if window is None else window


@dataclass(frozen=True)
class AttemptFault:
    """The fault one attempt is to receive and how: the preemption (None: none), a condition it
    also waits for besides its step (an S3 upload under way), the cloud metadata a notice is
    served through, and the hold that keeps the job at the planned step until it is delivered."""

    preemption: Preemption | None = None
    when: Callable[[], bool] | None = None
    metadata: MetadataNotice | None = None
    hold: Hold | None = None


class AttemptWatch:
    """Drives one attempt: polls events, delivers its preemption, enforces the timeouts."""

    def __init__(
        self,
        job: JobSpec,
        handle: Handle,
        reader: EventReader | LogEventReader,
        fault: AttemptFault,
        on_checkpoint: Callable[[dict], None] | None = None,
    ):
        preemption, preempt_when, metadata, hold = fault.preemption, fault.when, fault.metadata, fault.hold
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
        self.first_step_at: float | None = None  # the start-up ends here: imports, model, restore done
        self.last_event_at = self.started
        self.last_step: int | None = None
        self.phase_entered: int | None = None  # the step after which the planned phase began (``sigterm@7/eval``)
        self.planned_step_at: float | None = None  # when the planned step was read (``sigterm@7+0.15s`` counts from it)
        self.fault: FaultRecord | None = None
        self.delivered_at: float | None = None
        self.reclaimed = False  # the grace window's end took the nodes of a job that runs on (Ray Train)
        self.termed = False  # a Slurm warning's SIGTERM, sent its lead after the warning
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
        # the held rank's steps time the plan's fault (rank 0's when none is held): delivered as it
        # holds, never while it runs on, released by a fault that came first for another rank's step
        # an unmodified script's other ranks are read once the attempt is over: rank 0's lines time it
        timing = self.hold.rank if self.hold is not None and self.job.log is None else 0
        for event in new:
            rank = event.get("rank", 0)
            if event["event"] == "step" and self.first_step_at is None:
                self.first_step_at = now
            if event["event"] == "step" and rank == timing:
                self.last_step = event["step"]
                self._note_planned_step(now)
            elif event["event"] == "phase" and rank == timing:
                self._note_phase(event)
            elif event["event"] == "notice" and self.hold is not None and rank == self.hold.rank:
                self.release_by = now  # the held rank has the forwarded notice: it may go on
            elif event["event"] == "checkpoint" and self.on_checkpoint is not None:
                self.on_checkpoint(event)  # a copy of it, or of the folder, while the job may hold
                self.last_event_at = time.monotonic()  # the harness's own time is no silence of the job
            if isinstance(rank, int):  # a multi-rank handle times its ranks by them (which rank said what, when)
                if event["event"] == "start":
                    self.handle.note_rank(rank, event.get("pid"))
                self.handle.note_event(rank, event["step"] if event["event"] == "step" else None)

    def _note_planned_step(self, now: float) -> None:
        """When the planned step was first read: a fault placed a time after it counts from here."""
        p = self.preemption
        if (
            p is not None
            and self.planned_step_at is None
            and self.last_step is not None
            and self.last_step >= p.at_step
        ):
            self.planned_step_at = now

    def _note_phase(self, event: dict) -> None:
        """The planned phase began after the planned step: the job holds there for its fault."""
        p, step = self.preemption, event.get("step")
        if p is None or p.phase is None or self.phase_entered is not None or event.get("state") != "begin":
            return
        if event.get("name") == p.phase and isinstance(step, int) and step >= p.at_step:
            self.phase_entered = step

    def _maybe_preempt(self, now: float) -> None:
        p = self.preemption
        if p is None or self.fault is not None or self.last_step is None or self.last_step < p.at_step:
            return
        if p.phase is not None and self.phase_entered is None:
            return  # a fault inside a phase waits for the phase to begin
        if p.offset_seconds is not None and (self.planned_step_at or now) + p.offset_seconds > now:
            return  # placed a time after the step: the job runs on meanwhile
        if traits(p.fault).reruns:
            return  # the job runs to its end; run_job starts it again
        if self._other_rank_not_held_yet(now):
            return
        if self.preempt_when is not None and not self.preempt_when():
            return
        if isinstance(self.reader, LogEventReader):  # the checkpoints on disk now came before the fault
            self._consume(now, self.reader.look_now())
        fault = PREEMPTIONS[p.fault]
        before = self.handle.delivery
        fault.apply(self.handle)
        delivery = self.handle.delivery
        delivery = delivery if delivery is not before else None
        if delivery is not None and delivery.outlived:
            raise BackendError(
                f"{delivery.signal} reached {len(delivery.reached)} process(es) of job {self.job.name!r}, but "
                f"{'; '.join(delivery.outlived)} still ran 2 s later: a harness error, not a landed fault"
            )
        if self.metadata is not None:  # the notice goes up on the metadata; the deadline is the grace window's end
            self.metadata.deliver(self.handle, time.time() + float(self.job.grace_seconds or 30.0))
        self.delivered_at = now
        self.fault = FaultRecord(
            fault=p.fault,
            planned_step=p.at_step,
            observed_step=self.last_step,
            delivered_at=now - self.started,
            delivered_wall=time.time(),
            # the window the notice gave: the job's grace, or the launcher's own (KubeRay's drain timeout)
            grace_seconds=_window(self.job, fault, self.handle) if fault.graceful else None,
            detail=self.handle.delivery_note,  # what the notice met on its way in
            inside=self._inside(p),
            reached=delivery.reached if delivery is not None else [],
        )
        if self.hold is not None:  # a notice a launcher passes on (torchrun's agent, Ray Train's watcher) comes later
            lag = self.handle.notice_lag_seconds if fault.graceful else 0.0
            if fault.whole_group:  # every process hears it before the job goes on
                lag = max(lag, GROUP_SETTLE_SECONDS)
            self.release_by = now + min(lag, float(self.job.grace_seconds or 30.0) / 2)
            self._maybe_release(now)

    def _other_rank_not_held_yet(self, now: float) -> bool:
        """An unmodified script's rank other than 0 is held by the hook at its own line of the
        planned step, read by no one live: its fault waits for the hold's announcement, at most
        OTHER_RANK_HOLD_SECONDS after rank 0's line (a rank that prints nothing is never held)."""
        hold = self.hold
        if hold is None or self.job.log is None or hold.rank == 0 or hold.poll() is not None:
            return False
        return now - (self.planned_step_at or now) < OTHER_RANK_HOLD_SECONDS

    def _inside(self, p: Preemption) -> str | None:
        """Where a fault placed inside something landed, in words (None: between steps, as planned)."""
        if p.phase is not None:
            return f"the job's {p.phase} phase, begun after step {self.phase_entered}"
        if p.offset_seconds is not None:
            return f"step {(self.last_step or 0) + 1}, {p.offset_seconds:g} s after step {p.at_step} was reported"
        return None

    def _maybe_release(self, now: float) -> None:
        """Let the held job go on once its fault is delivered (a notice torchrun's agent forwards:
        once the held rank reports it, or after a few seconds)."""
        if self.hold is not None and self.release_by is not None and now >= self.release_by:
            self.hold.release()
            self.release_by = None

    def _enforce_deadlines(self, now: float) -> None:
        if self.fault is not None and self.delivered_at is not None:
            fault = PREEMPTIONS[self.fault.fault]
            if fault.warns and not self.termed and now - self.delivered_at >= _lead(self.job):
                self.termed = True  # Slurm: the warning's lead is over, SIGTERM to every process, KillWait runs
                self.handle.notify(signal.SIGTERM, whole_group=True)
            if self.fault.grace_seconds is not None and now - self.delivered_at > self.fault.grace_seconds:
                self._grace_over()
            if fault.hangs:
                self._detect_hang(now)
                return
            if not fault.continues and not self.reclaimed:
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
                    + build_lock_note({**os.environ, **self.job.environment()})
                )
            if now - self.started > self.job.start_timeout_seconds:
                raise JobError(
                    f"job {self.job.name!r} never started: no event within {self.job.start_timeout_seconds:g} s "
                    f"(start_timeout_seconds). Does the trainer create a spotchaos.probe.Probe and call start()?"
                    + build_lock_note({**os.environ, **self.job.environment()})
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
                why = self.job.kind.silent_group_hint
                raise JobError(
                    f"job {self.job.name!r}: {self.handle.launcher} started no rank for "
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
        assert self.fault is not None
        if self.reclaimed:
            return  # the nodes went at the window's end already
        reclaim = self.handle.reclaim
        if reclaim is not None:
            self.reclaimed = True
            reclaim()
        elif PREEMPTIONS[self.fault.fault].reclaims:
            # one node's window is over: its VM goes, and the torchrun job, whose other agents cannot
            # finish without it (they wait in torchrun's exit barrier), ends with it
            self.reclaimed = True
            self.fault.detail += "; the grace window's end took the node, and the job with it"
            self.handle.kill()
        else:
            self.fault.grace_exceeded = True
            self.handle.kill()

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

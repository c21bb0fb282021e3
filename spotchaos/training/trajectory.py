"""What a run left behind: every attempt's events, exit and the fault it received.

Plain data with no behaviour beyond convenient views, so the verdict can stay pure and the
report can serialise it as it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..faults.checkpoint import Damage
from .events import Event


@dataclass
class FaultRecord:
    """One preemption as it really happened."""

    fault: str
    planned_step: int
    observed_step: int  # last step the attempt had reported when the fault was delivered
    delivered_at: float  # seconds since the attempt started
    delivered_wall: float  # Unix time of delivery, comparable with the events' "t"
    exit_seconds: float | None = None  # from delivery until the main process exited
    grace_seconds: float | None = None
    grace_exceeded: bool = False
    detail: str = ""  # for a crash point: the file-system event it died before
    at_fs_event: int | None = None  # a crash point's: the index of that event (the report tells it by this)
    # a fault planned inside a phase (FAULT@S/PHASE) or a time after a step (FAULT@S+0.15s): where it landed
    inside: str | None = None
    hang_detected_seconds: float | None = None  # hang-rank: from the stop until the harness named the rank
    # where it really landed (see spotchaos/training/engine/landing.py): held after the planned step, or late
    held: bool = False  # the job waited after the planned step until the fault was delivered
    landed_step: int | None = None  # the last step the job had finished when the fault reached it
    # landed_step past the step the plan named (or the attempt's first); None: not a timed fault, or one a
    # family held back on purpose (until an upload was in flight)
    steps_late: int | None = None
    passed_checkpoint: int | None = None  # late past a checkpoint it was meant to precede: that checkpoint's step
    held_seconds: float | None = None  # how long the job waited, from its planned step's report to the release
    # the processes a signal to the whole job reached (pid and command line), read just before it
    reached: list[str] = field(default_factory=list)


@dataclass
class StepRecord:
    attempt: int
    step: int
    loss: str
    fingerprints: dict[str, Any]
    seconds: float | None


@dataclass
class Attempt:
    index: int
    exit_code: int | None
    wall_seconds: float
    start_seconds: float | None  # until the first step (else the first event): imports, model, restore
    started_wall: float = 0.0  # Unix time of the launch, comparable with the events' "t"
    events: list[Event] = field(default_factory=list)
    fault: FaultRecord | None = None
    damage: Damage | None = None  # applied after this attempt ended, before the next one started
    orphans: list[int] = field(default_factory=list)  # processes left after the main one exited
    escaped: list[str] = field(default_factory=list)  # processes that left the job's group, found and ended
    stdout_tail: str = ""
    stderr_tail: str = ""
    failed_restart: str | None = None  # a restart that exited non-zero before training: why, as far as seen
    final_tensors: str | None = None  # envelope mode: the file holding its final weights' values
    # torchrun jobs: the launch this attempt belongs to and which run of its worker group it is
    # (the agent restarts the group when a rank dies); whether the launcher ended the group because
    # of the notice (torchrun's agent exits 1; Ray Train's group goes with its nodes at the deadline)
    launch: int | None = None
    group_restart: int = 0
    launcher_signalled: bool = False
    launcher_killed: bool = False  # the agent SIGKILLed workers its shutdown timeout after forwarding the notice
    launcher_shutdown_seconds: float = 30.0  # that timeout on this launch (torchrun's --shutdown-timeout)
    gpus: dict[str, Any] | None = None  # the GPUs it leased: devices, when acquired and released, the wait
    placement: dict[str, Any] | None = None  # where it ran on a cluster: the Ray node, its id and resources
    start_kind: str = "cold"  # "warm" (forked from the job's warm interpreter), or "cold" and why
    requeued: bool | None = None  # on Slurm: whether it called `scontrol requeue` for its job id (None: not Slurm)
    # a tail another plan ran (start_kind "tail"): the run folder it trained in, which its checkpoints'
    # contents may name (a Trainer's output_dir); the state diff reads that path as the run's own
    trained_in: str | None = None

    def of_kind(self, kind: str) -> list[Event]:
        return [e for e in self.events if e["event"] == kind]

    def of_rank(self, kind: str, rank: int = 0) -> list[Event]:
        """Events of one kind from one rank (a single-process job is rank 0)."""
        return [e for e in self.events if e["event"] == kind and e.get("rank", 0) == rank]

    def rank_steps(self, rank: int) -> list[StepRecord]:
        return [
            StepRecord(self.index, e["step"], e["loss"], dict(e.get("fp") or {}), e.get("seconds"))
            for e in self.of_rank("step", rank)
        ]

    @property
    def gpu_count(self) -> int:
        """The GPUs the attempt held, for its device-seconds on the gate's cost: those it leased or
        Ray gave it, or, where it leased none, each rank whose probe reported CUDA memory (a job
        that simply uses the machine's GPU holds it all the same)."""
        leased = len((self.gpus or {}).get("devices") or ()) or len((self.placement or {}).get("ray_gpus") or ())
        using = set()
        for event in self.events:
            memory = event.get("memory") if isinstance(event.get("memory"), dict) else {}
            if isinstance(memory.get("gpu_max_allocated"), int) and memory["gpu_max_allocated"] > 0:
                using.add(event.get("rank", 0) if isinstance(event.get("rank", 0), int) else 0)
        return max(leased, len(using))

    @property
    def ranks(self) -> list[int]:
        return sorted({e.get("rank", 0) for e in self.events if isinstance(e.get("rank", 0), int)})

    @property
    def steps(self) -> list[StepRecord]:
        """Rank 0's steps: the trajectory every verdict compares first (each rank's: rank_steps)."""
        return self.rank_steps(0)

    @property
    def final(self) -> Event | None:
        finals = self.of_rank("final")
        return finals[-1] if finals else None

    @property
    def ready_seconds(self) -> float | None:
        """Launch until training ran its first step, less that step: start-up plus restore."""
        steps = self.of_rank("step")
        if not steps or not self.started_wall:
            return None
        return max(0.0, steps[0]["t"] - self.started_wall - float(steps[0].get("seconds") or 0.0))


@dataclass
class RunRecord:
    """All attempts of one run of a job under one plan."""

    job: str
    plan: str
    attempts: list[Attempt]
    wall_seconds: float
    workdir: str
    unfired: list[str] = field(default_factory=list)  # planned faults that never reached a running attempt, and why
    not_reached: list[str] = field(default_factory=list)  # planned for attempts that never started: training was done
    # earlier runs of this plan that tested nothing: a crash point counted from a step never fired in them
    missed_tries: list[str] = field(default_factory=list)
    convention: dict[str, Any] | None = None  # a log-adapter job's step convention, learned by its uninterrupted run
    audit: dict[str, Any] | None = None  # the reference's: what the job's repeated uninterrupted runs showed
    # the run started from the reference's checkpoint after this step: attempt 0 is the reference's
    # own steps through it, copied, not trained (spotchaos/training/reference/prefix.py); None: from step 0
    prefix_step: int | None = None
    # the reference's: the copies of its checkpoint folder later plans may start from
    snapshots: dict[str, Any] | None = None
    reused: bool = False  # the session had run this plan on this job already (another scenario): its verdict, again
    # the reference's: whether it was read from the reference cache, stored in it, or why neither
    # (spotchaos/training/reference/cache.py)
    cache: dict[str, Any] | None = None
    # a run whose fast and slow paths disagreed: the shortcuts it took and what that changed (training/shortcuts.py)
    shortcuts: dict[str, Any] | None = None
    # a reference read from the cache: the folder it was trained in, which its checkpoints' contents name
    # (a Trainer's output_dir); the state diff takes a path under it for the run's own, as under ``workdir``
    trained_in: str | None = None
    # its last attempt is another plan's, reused (its restart began on the same bytes: training/reference/tails.py)
    tail_of: str | None = None

    @property
    def trained(self) -> list[Attempt]:
        """The attempts that ran (a prefix attempt is the reference's steps, a tail another plan's:
        credited, not run)."""
        return [a for a in self.attempts if a.start_kind not in ("prefix", "tail")]

    @property
    def saved_steps(self) -> list[int]:
        """Steps after which the run reported a checkpoint, each once, in order (a job may report
        one step twice: Lightning's ``last.ckpt`` after its named one)."""
        return sorted({e["step"] for a in self.attempts for e in a.of_kind("checkpoint")})

    def late_checkpoint(self) -> int | None:
        """The newest checkpoint with two steps or more after it: where a fault late in the job still
        lands before the job ends, and a plan starts from the reference's copy of it; None if none."""
        late = [step for step in self.saved_steps if step <= len(self.steps) - 3]
        return late[-1] if late else None

    @property
    def steps(self) -> list[StepRecord]:
        return [s for a in self.attempts for s in a.steps]

    @property
    def final(self) -> Event | None:
        return self.attempts[-1].final if self.attempts else None

    @property
    def faults(self) -> list[FaultRecord]:
        return [a.fault for a in self.attempts if a.fault is not None]

    def memory_peaks(self) -> dict[str, int | None]:
        """The highest memory any attempt reported (None when the trainer reports none)."""
        peaks: dict[str, int | None] = {"max_rss": None, "gpu_max_allocated": None}
        for attempt in self.attempts:
            for event in attempt.events:
                for key, value in (event.get("memory") or {}).items():
                    if key in peaks and isinstance(value, int):
                        peaks[key] = max(value, peaks[key] or 0)
        return peaks

    def series(self) -> dict[str, Any]:
        """The loss trajectory and its marks (preemptions, resumes, rollbacks), for the report's plots.

        Losses are floats here (the verdict compares the exact hex strings); an attempt's marks
        carry its index so a plot can tell the attempts apart.
        """
        marks: list[dict[str, Any]] = []
        for attempt in self.attempts:
            for event in attempt.events:
                if event["event"] == "resume":
                    marks.append({"kind": "resume", "attempt": attempt.index, "step": event["from_step"]})
                elif event["event"] == "rollback":
                    resumed = next((e["from_step"] for e in attempt.of_kind("resume")), None)
                    marks.append(
                        {"kind": "rollback", "attempt": attempt.index, "step": resumed, "reason": event.get("reason")}
                    )
            if attempt.fault is not None:
                marks.append(
                    {
                        "kind": "preemption",
                        "attempt": attempt.index,
                        "step": _landed(attempt.fault),
                        "fault": attempt.fault.fault,
                    }
                )
        points = [[s.attempt, s.step, _loss_value(s.loss)] for s in self.steps]
        return {"points": points, "marks": marks}

    def to_dict(self, *, with_events: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_events:
            for attempt in data["attempts"]:
                attempt.pop("events")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """The record ``to_dict(with_events=True)`` wrote (a reference read back from the cache);
        a field this version does not know is a ``TypeError``, as a changed format should be."""
        attempts = []
        for attempt in data["attempts"]:
            fault, damage = attempt.get("fault"), attempt.get("damage")
            attempts.append(
                Attempt(
                    **{
                        **attempt,
                        "fault": FaultRecord(**fault) if fault is not None else None,
                        "damage": Damage(**damage) if damage is not None else None,
                    }
                )
            )
        return cls(**{**data, "attempts": attempts})


def _landed(fault: FaultRecord) -> int:
    return fault.landed_step if fault.landed_step is not None else fault.observed_step


def _loss_value(loss: Any) -> float | None:
    try:
        return float.fromhex(loss) if isinstance(loss, str) else float(loss)
    except (TypeError, ValueError):
        return None

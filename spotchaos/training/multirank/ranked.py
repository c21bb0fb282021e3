"""The ranks of one attempt of a multi-rank job, as one handle: what torchrun's agents and a Ray
Train driver have in common.

Ranks are known from the probe's ``start`` events (pid and rank) and trusted only once the process
carries the run's marker variable, which also finds every process of the attempt wherever its
launcher started it (torchrun's workers in sessions of their own, Ray Train's workers under a Ray
node's raylet). A launcher subclasses :class:`RankedHandle`, starts its processes into
``self.nodes`` and says what losing a node means for it.
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import time
from dataclasses import dataclass

from ...backends.base import Handle
from ...config.jobs import JobSpec
from ...errors import BackendError, JobError
from ...host.processes import (
    PROC,
    Delivery,
    carrying,
    end,
    environment_value,
    is_running,
    parent_of,
    start_time,
)
from ...probe import ENV_RUN_ID


@dataclass
class LaunchedNode:
    index: int
    handle: Handle


@dataclass
class RankProcess:
    rank: int
    pid: int
    started: int | None
    last_step: int | None = None


class RankedHandle(Handle, abc.ABC):
    """Every process a launcher started for one attempt (``nodes``) and every rank they run."""

    notice_lag_seconds = 0.0  # how long a notice takes to reach the ranks (a held rank waits for it)

    def __init__(self, job: JobSpec, run_id: str) -> None:
        self.job = job
        self.run_id = run_id
        self.marker = f"{ENV_RUN_ID}={run_id}"
        self.nodes: list[LaunchedNode] = []
        self.ranks: dict[int, RankProcess] = {}
        self.delivery_note = ""
        self.lost: list[str] = []  # what lose_node did, for the fault record
        self.delivery: Delivery | None = None  # what the last signal to the whole job reached
        self.identity: dict = {}

    # --- what the engine learns from the events -------------------------------------------------
    def note_rank(self, rank: int, pid: object) -> None:
        """A rank said who it is (its start event); believed only if the process carries the run's marker."""
        if not isinstance(pid, int) or pid <= 1 or pid not in carrying(self.marker):
            return
        self.ranks[rank] = RankProcess(rank, pid, start_time(pid))

    def note_event(self, rank: int, step: int | None) -> None:
        process = self.ranks.get(rank)
        if process is not None and step is not None:
            process.last_step = step  # the rank behind the others is the hung one

    def _ranks_from_environment(self) -> None:
        """A script read through the log adapter reports no start event: its ranks are the run's
        processes whose environment holds the ``RANK`` torchrun gave them, the newest of each (not
        a DataLoader worker, whose parent holds the same ``RANK``)."""
        if self.job.log is None:
            return
        for pid in carrying(self.marker):
            rank, parent = environment_value(pid, "RANK"), parent_of(pid)
            if rank is None or not rank.isdigit() or (parent is not None and environment_value(parent, "RANK") == rank):
                continue
            known, started = self.ranks.get(int(rank)), start_time(pid)
            if known is None or not is_running(known.pid, known.started) or (started or 0) > (known.started or 0):
                self.ranks[int(rank)] = RankProcess(int(rank), pid, started)

    def ranks_alive(self) -> bool:
        """Whether any rank it knows still runs: none while the agent restarts the group (its new
        ranks have not said who they are yet), when a hang is no rank's to name."""
        self._ranks_from_environment()
        return any(start_time(p.pid) == p.started for p in self.ranks.values())

    def _live_rank(self, rank: int) -> RankProcess:
        self._ranks_from_environment()
        process = self.ranks.get(rank)
        if process is None or start_time(process.pid) != process.started:
            known = ", ".join(str(r) for r in sorted(self.ranks)) or "none"
            raise JobError(
                f"job {self.job.name!r}: rank {rank} is not running (ranks found so far: {known}, by their "
                f"{'RANK variable' if self.job.log is not None else 'start events'}; the job has "
                f"{self.job.world_size} rank(s))"
            )
        return process

    # --- rank-level faults ------------------------------------------------------------------------
    def kill_rank(self, rank: int) -> None:
        process = self._live_rank(rank)
        end([process.pid])
        self.delivery_note = f"rank {rank} (pid {process.pid}) SIGKILLed"

    def stop_rank(self, rank: int) -> None:
        process = self._live_rank(rank)
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGSTOP)
        self.delivery_note = f"rank {rank} (pid {process.pid}) stopped with SIGSTOP"

    @abc.abstractmethod
    def lose_node(self, index: int) -> None:
        """``lose-node<index>``: every process of one node gone at once; each launcher's own."""

    @abc.abstractmethod
    def drain_node(self, index: int) -> None:
        """``drain-node<index>``: one node's reclaim notice, the others told nothing; each launcher's own."""

    def describe_hang(self) -> str:
        """Which rank hangs: a stopped one, else one behind the others, else every rank waiting."""
        self._ranks_from_environment()
        states = {rank: _state(p.pid) for rank, p in sorted(self.ranks.items()) if start_time(p.pid) == p.started}
        stopped = [rank for rank, state in states.items() if state in ("T", "t")]
        if stopped:
            others = [r for r in states if r not in stopped]
            waiting = f"; rank(s) {', '.join(map(str, others))} wait in a collective for it" if others else ""
            return f"rank {stopped[0]} (pid {self.ranks[stopped[0]].pid}) is stopped (SIGSTOP){waiting}"
        steps = {rank: p.last_step for rank, p in self.ranks.items() if rank in states}
        known = [s for s in steps.values() if s is not None]
        if known and min(known) < max(known):
            behind = min((r for r, s in steps.items() if s is not None), key=lambda r: steps[r])
            return (
                f"rank {behind} (pid {self.ranks[behind].pid}) stopped reporting at step {steps[behind]} while others "
                f"reached step {max(known)}: it hangs and they wait for it"
            )
        busy = [rank for rank, state in states.items() if state == "R"]
        if busy and len(busy) < len(states):
            pid = self.ranks[busy[0]].pid
            return f"rank {busy[0]} (pid {pid}) runs while the others sleep: it never reaches the next collective"
        alive = ", ".join(map(str, states)) or "none alive"
        return f"every rank ({alive}) stopped reporting at the same step: no rank stands out"

    @property
    def placement(self) -> dict | None:
        return None

    @property
    def pid(self) -> int:
        return self.nodes[0].handle.pid

    def notify(self, signum: int, *, whole_group: bool) -> None:
        """Every agent gets the notice (a job-wide preemption); ``whole_group``: every worker too."""
        for node in self.nodes:
            node.handle.notify(signum, whole_group=whole_group)
        if whole_group:
            for pid in carrying(self.marker):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
            self.delivery = self._joined(signum)

    def kill(self) -> None:
        for node in self.nodes:
            node.handle.kill()
        end(carrying(self.marker))
        self.delivery = self._joined(signal.SIGKILL)

    def _joined(self, signum: int) -> Delivery:
        """What one signal to every node reached, from each node's own delivery where it keeps one."""
        joined = Delivery(signal.Signals(signum).name)
        for node in self.nodes:
            delivery = node.handle.delivery
            if delivery is not None:
                joined.reached += delivery.reached
                joined.outlived += delivery.outlived
        return joined

    def poll(self) -> int | None:
        codes = [node.handle.poll() for node in self.nodes]
        if any(code is None for code in codes):
            return None
        return next((code for code in codes if code), 0)

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + max(timeout, 0)
        while True:
            code = self.poll()
            if code is not None or time.monotonic() >= deadline:
                return code
            time.sleep(0.05)

    def survivors(self) -> list[int]:
        return sorted({pid for node in self.nodes for pid in node.handle.survivors()} | set(carrying(self.marker)))

    def cleanup(self) -> None:
        deadline = time.monotonic() + 10
        for pid in [p.pid for p in self.ranks.values()]:  # a stopped rank would not die until continued
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
        while True:
            end(carrying(self.marker))
            for node in self.nodes:  # the job's processes, not the machine: a Ray node stays in the cluster
                node.handle.end_processes()
            if not carrying(self.marker) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for node in self.nodes:
            node.handle.cleanup()
        left = carrying(self.marker)
        if left:
            raise BackendError(f"processes {left} of {self.launcher} job {self.job.name!r} survived SIGKILL for 10 s")


def _state(pid: int) -> str:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return "?"
    return text[text.rfind(")") + 2 :].split()[0]

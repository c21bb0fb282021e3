"""Faults that reach one rank or one node of a torchrun job, not the job as a whole.

Named with their target (``kill-rank1``, ``hang-rank1``, ``lose-node1``, ``drain-node1``,
``crash-rank1``) so that a plan says which: ``kill-rank1@5``. The job runs on after each of them
(torchrun's agent restarts the group or exits; the harness names a hung rank and ends the job; the
other nodes notice the loss), so the engine keeps watching for hangs instead of waiting for an
exit; a node's notice is the exception: it has its grace window.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from typing import ClassVar

from ..backends.base import Handle
from ..errors import JobError
from .traits import Traits

NAMES = re.compile(r"(kill-rank|hang-rank|lose-node|drain-node|crash-rank)(\d{1,3})")


@dataclass(frozen=True)
class TargetedFault(Traits, abc.ABC):
    """One rank's or one node's fault; ``target`` is the rank (or node) number in its name."""

    target: int
    kind: ClassVar[str] = ""
    graceful: ClassVar[bool] = False
    continues: ClassVar[bool] = True  # the job runs on: hang detection, not an exit, ends the attempt
    targeted: ClassVar[bool] = True

    @property
    def name(self) -> str:
        return f"{self.kind}{self.target}"

    def apply(self, handle: Handle) -> None:
        if not hasattr(handle, "kill_rank"):
            raise JobError(
                f'{self.name} needs a multi-rank job (launcher = "torchrun" or "ray-train"): this job is one process'
            )
        self.deliver(handle)

    @abc.abstractmethod
    def deliver(self, handle) -> None:  # a RankedHandle (spotchaos/training/multirank/ranked.py)
        """Do it to the target; each fault's own."""


class KillRank(TargetedFault):
    """SIGKILL to one worker rank: an OOM kill, a failed GPU. The agent restarts the group
    (``max_restarts``), or exits non-zero and the job is restarted."""

    kind = "kill-rank"

    def deliver(self, handle) -> None:
        handle.kill_rank(self.target)


class HangRank(TargetedFault):
    """SIGSTOP to one rank: the others block in their next collective (gloo waits 30 min by
    default). The harness must notice within ``hang_timeout_seconds``, name the rank, and end
    the job, whose restart must then resume as after any hard kill."""

    kind = "hang-rank"
    hangs: ClassVar[bool] = True

    def deliver(self, handle) -> None:
        handle.stop_rank(self.target)


class LoseNode(TargetedFault):
    """Every process of one node SIGKILLed at once (a reclaimed spot VM). The other nodes' ranks
    lose their peers; their agents exit (or restart the group and wait at the rendezvous for a
    node that never comes, which the silence limits name), and the restart brings a replacement."""

    kind = "lose-node"
    on_node: ClassVar[bool] = True

    def deliver(self, handle) -> None:
        handle.lose_node(self.target)


class DrainNode(TargetedFault):
    """One node's reclaim notice: a spot reclaim takes one VM, not the job. The node's processes
    get the notice and the grace window; at the window's end the node goes. The ranks elsewhere
    hear nothing from the provider, so a job that checkpoints on a notice must agree on it across
    ranks (one all-reduce of the flag a step) or its noticed ranks save alone and the rest run on.
    Judged like the job-wide notice: a checkpoint at or after the notice's step before the window
    ended, and a bit-exact resume from it."""

    kind = "drain-node"
    on_node: ClassVar[bool] = True
    graceful: ClassVar[bool] = True
    continues: ClassVar[bool] = False  # the grace window, not hang detection, applies until it ends
    # at the window's end the node goes, and a job that cannot go on without it with it: judged by
    # the checkpoint it took in the window, not by whether every node's process had exited
    reclaims: ClassVar[bool] = True

    def deliver(self, handle) -> None:
        handle.drain_node(self.target)


class CrashRank(TargetedFault):
    """A crash point armed in one rank only (``crash-rank1@N``: rank 1 dies before its N-th
    file-system event under the checkpoint directory), in the first run of its worker group:
    a rank killed between writing its shard and the coordinator's ``.metadata``, say. Armed
    through the environment before the attempt starts: nothing is delivered from outside."""

    kind = "crash-rank"
    armed_by_environment: ClassVar[bool] = True

    def apply(self, handle: Handle) -> None:
        pass  # armed by the environment: nothing to deliver

    def deliver(self, handle) -> None:
        pass


KINDS = {fault.kind: fault for fault in (KillRank, HangRank, LoseNode, DrainNode, CrashRank)}


def rank_fault(name: str) -> TargetedFault | None:
    match = NAMES.fullmatch(name)
    return KINDS[match.group(1)](int(match.group(2))) if match else None

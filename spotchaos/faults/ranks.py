"""Faults that reach one rank or one node of a torchrun job, not the job as a whole.

Named with their target (``kill-rank1``, ``hang-rank1``, ``lose-node1``) so that a plan says
which rank: ``kill-rank1@5``. The job runs on after each of them (torchrun's agent restarts the
worker group; the harness names a hung rank and ends the job; a lost node's replacement joins), so
the engine keeps watching for hangs instead of waiting for an exit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..backends.base import Handle
from ..errors import JobError

NAMES = re.compile(r"(kill-rank|hang-rank|lose-node|crash-rank)(\d{1,3})")


def _torchrun(handle: Handle, what: str):
    if not hasattr(handle, "kill_rank"):
        raise JobError(f'{what} needs a torchrun job (launcher = "torchrun"): this job is one process')
    return handle


@dataclass(frozen=True)
class KillRank:
    """SIGKILL to one worker rank: an OOM kill, a failed GPU. The agent restarts the group
    (``max_restarts``), or exits non-zero and the job is restarted."""

    rank: int
    graceful: bool = field(default=False, init=False)
    continues: bool = field(default=True, init=False)

    @property
    def name(self) -> str:
        return f"kill-rank{self.rank}"

    def apply(self, handle: Handle) -> None:
        _torchrun(handle, self.name).kill_rank(self.rank)


@dataclass(frozen=True)
class HangRank:
    """SIGSTOP to one rank: the others block in their next collective (gloo waits 30 min by
    default). The harness must notice within ``hang_timeout_seconds``, name the rank, and end
    the job, whose restart must then resume as after any hard kill."""

    rank: int
    graceful: bool = field(default=False, init=False)
    continues: bool = field(default=True, init=False)
    hangs: bool = field(default=True, init=False)

    @property
    def name(self) -> str:
        return f"hang-rank{self.rank}"

    def apply(self, handle: Handle) -> None:
        _torchrun(handle, self.name).stop_rank(self.rank)


@dataclass(frozen=True)
class LoseNode:
    """Every process of one node SIGKILLed at once (a reclaimed spot VM). The other nodes' ranks
    lose their peers; their agents exit (or restart the group and wait at the rendezvous for a
    node that never comes, which hang detection names), and the restart brings a replacement."""

    node: int
    graceful: bool = field(default=False, init=False)
    continues: bool = field(default=True, init=False)

    @property
    def name(self) -> str:
        return f"lose-node{self.node}"

    def apply(self, handle: Handle) -> None:
        _torchrun(handle, self.name).lose_node(self.node)


@dataclass(frozen=True)
class CrashRank:
    """A crash point armed in one rank only (``crash-rank1@N``: rank 1 dies before its N-th
    file-system event under the checkpoint directory), in the first run of its worker group:
    a rank killed between writing its shard and the coordinator's ``.metadata``, say."""

    rank: int
    graceful: bool = field(default=False, init=False)
    continues: bool = field(default=True, init=False)
    armed_by_environment: bool = field(default=True, init=False)

    @property
    def name(self) -> str:
        return f"crash-rank{self.rank}"

    def apply(self, handle: Handle) -> None:
        pass


def rank_fault(name: str) -> KillRank | HangRank | LoseNode | CrashRank | None:
    match = NAMES.fullmatch(name)
    if match is None:
        return None
    kind, number = match.group(1), int(match.group(2))
    return {"kill-rank": KillRank, "hang-rank": HangRank, "lose-node": LoseNode, "crash-rank": CrashRank}[kind](number)

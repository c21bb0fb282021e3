"""What each launcher is, as the engine asks it: one object a launcher, looked up once by the name a
job declares (``launcher = "torchrun"``), so no code below the loader tests a launcher's name.

The traits are plain data: config stays about declarations. What a launcher *does* (start an
attempt, read its messages) lives with the launcher in ``training/multirank``, registered by the
same name at the edge (``training/engine/attempt.py``'s starters, ``judgement.py``'s explanations).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LauncherKind:
    """One launcher's traits."""

    name: str
    # the job is one local process: it takes the reference's copies, its state is diffed by
    # default, the log adapter reads it, a container may run it
    one_process: bool = False
    # its ranks are local processes its agents start (torchrun): per-rank stderr, DCP's files, a
    # crash point armed in one rank, ranks numbered node by node
    local_ranks: bool = False
    # its ranks run on the session's Ray cluster and it restarts them itself (Ray Train): exit 0
    # is the run finished, a notice to the group is the same as to the driver, node faults are
    # one rank's node, a drain is read through rank 0's answer
    cluster_ranks: bool = False
    # what to ask when no rank runs and none reports
    silent_group_hint: str = ""

    @property
    def multi_rank(self) -> bool:
        """Whether its ranks are processes of their own that each report."""
        return self.local_ranks or self.cluster_ranks


KINDS: dict[str, LauncherKind] = {
    kind.name: kind
    for kind in (
        LauncherKind("python", one_process=True),
        LauncherKind("torchrun", local_ranks=True, silent_group_hint="does its group restart fail to rendezvous?"),
        LauncherKind(
            "ray-train",
            cluster_ranks=True,
            silent_group_hint="can the cluster place its ScalingConfig's workers again (its controller's log below)?",
        ),
    )
}
LAUNCHERS = tuple(KINDS)

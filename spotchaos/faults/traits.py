"""What the engine asks of a fault, answered by the fault: each fault class inherits these, False
unless it says otherwise, so no code tests a fault's name to learn what it does."""

from __future__ import annotations

from typing import ClassVar


class Traits:
    graceful: ClassVar[bool] = False  # the job may checkpoint and exit inside a grace window
    whole_group: ClassVar[bool] = False  # a signal to every process of the job, not the main one
    continues: ClassVar[bool] = False  # the job runs on: hang detection, not an exit, ends the attempt
    hangs: ClassVar[bool] = False  # a rank stopped: the harness (or the job's watchdog) must end it
    reclaims: ClassVar[bool] = False  # one node's notice: at the window's end the node goes
    on_node: ClassVar[bool] = False  # acts on one node's processes (its target is a node)
    reruns: ClassVar[bool] = False  # nothing while the job runs: started again once it has finished
    warns: ClassVar[bool] = False  # Slurm's warning: SIGTERM follows after the job's lead
    armed_by_environment: ClassVar[bool] = False  # a crash point: armed before the start, fired from inside
    counts_from_a_step: ClassVar[bool] = False  # a crash point that may count its events after a step (crash@S+N)
    targeted: ClassVar[bool] = False  # one rank's or one node's, not the whole job's
    metadata: ClassVar[str | None] = None  # a cloud's notice on its instance metadata: the provider
    target: int | None = None  # a targeted fault's rank (or node) number; None: the whole job's
    to_the_main_process: str | None = None  # the same fault sent to the main process only (sigterm-group's sigterm)


NO_FAULT = Traits()  # what an attempt without a fault (or an unknown name) is asked

"""What the harness knows of the frameworks users train with: the entries of their checkpoints that
legitimately differ between an uninterrupted run and a resumed one, so the state diff does not call
them latent failures.

A job names its framework (``framework = "lightning"``) or its integration says so in its start
event (``spotchaos.integrations``); a job's own ``state_diff_ignore`` comes on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Lightning's ModelCheckpoint keeps its own bookkeeping in every checkpoint: which files it wrote
# (paths of the run, and a resumed run has written last.ckpt before the reference had at the same
# step) and their scores. Its loops count how often an epoch or batch was made ready and started,
# which a resume does once more; what was completed and processed is still compared. The state a
# resume must restore is elsewhere (those counts, optimizers, model).
_MODEL_CHECKPOINT_BOOKKEEPING = (
    "last_model_path",
    "best_model_path",
    "best_model_score",
    "kth_best_model_path",
    "kth_value",
    "best_k_models*",
    "dirpath",
)


def _model_checkpoint_entries(names: tuple[str, ...]) -> tuple[str, ...]:
    """Patterns of ``names`` in any ModelCheckpoint's state. A callback's state is keyed by its class
    name and its state key: a subclass (lightning_exact's StepBoundaryCheckpoint, a user's own) has
    another name and the same state, whose key starts with the monitor it watches
    (``StepBoundaryCheckpoint{'monitor': None, ...}``)."""
    return (
        *(f"*ModelCheckpoint*.{name}" for name in names),
        *(f"callbacks.*{{'monitor'*.{name}" for name in names),
    )


_LIGHTNING = ("loops.*.ready", "loops.*.started", *_model_checkpoint_entries(_MODEL_CHECKPOINT_BOOKKEEPING))

# The paths among that bookkeeping (the run's own folder, its files): Lightning reloads them only
# into a ModelCheckpoint of the same ``dirpath`` (``ModelCheckpoint.load_state_dict``, Lightning
# 2.6.x), best_model_path aside, which it reads only to delete a file inside its own dirpath. A run
# started from a copy of the reference's folder has another dirpath, so it never reaches the
# reference's files by them: a checkpoint naming them there still takes prefixes.
_MODEL_CHECKPOINT_PATHS = ("last_model_path", "best_model_path", "kth_best_model_path", "best_k_models*", "dirpath")
_LIGHTNING_PATHS = _model_checkpoint_entries(_MODEL_CHECKPOINT_PATHS)
PATHS_NEVER_FOLLOWED: dict[str, tuple[str, ...]] = {
    "lightning": _LIGHTNING_PATHS,
    "pytorch_lightning": _LIGHTNING_PATHS,
}

STATE_DIFF_IGNORE: dict[str, tuple[str, ...]] = {
    # trainer_state.json's timings are caught by name (train_runtime, ...) and a path of the run's
    # own (best_model_checkpoint) compares as {run}; TrainerControl's flags say what the loop was
    # asked to do at that moment (a SIGTERM save also says "stop"), not state a resume restores
    "transformers": (
        "trainer_state.json:stateful_callbacks.TrainerControl.*",
        # log_history's "loss" is the mean of the losses since the previous log, and a resumed Trainer
        # starts that mean again at the resume: with logging_steps > 1 the first log after it averages
        # fewer steps. A report of the losses, not state; each step's own loss is compared exactly.
        "trainer_state.json:log_history.*.loss",
    ),
    "lightning": _LIGHTNING,
    "pytorch_lightning": _LIGHTNING,
    "accelerate": (),
}


def framework_of(declared: str | None, start_events: Sequence[dict[str, Any]]) -> str | None:
    """The job's framework: as declared, else as its integration's start event says."""
    if declared:
        return declared
    for event in start_events:
        name = event.get("framework")
        if isinstance(name, str) and name in STATE_DIFF_IGNORE:
            return name
    return None


def state_diff_ignore(framework: str | None, own: tuple[str, ...]) -> tuple[str, ...]:
    """The patterns the state diff skips: the framework's, then the job's own."""
    return (*STATE_DIFF_IGNORE.get(framework or "", ()), *own)


def paths_never_followed(framework: str | None) -> tuple[str, ...]:
    """Entries (patterns, as ``state_diff_ignore``'s) where the framework keeps a path of the run's
    own folder that a resume from another folder never reads."""
    return PATHS_NEVER_FOLLOWED.get(framework or "", ())

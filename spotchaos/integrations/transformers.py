"""Gate a Hugging Face ``Trainer`` job with one line:

    from spotchaos.integrations.transformers import SpotchaosCallback
    trainer = Trainer(..., callbacks=[SpotchaosCallback()])

What the callback reports, and why it looks where it looks:

- **steps** 0-based (``global_step`` counts finished steps, so the step that just ended is
  ``global_step - 1``), with the loss the step's forwards computed, unrounded (the Trainer's log
  rounds it and comes only every ``logging_steps``), and fingerprints of the batch, the learning
  rate and the weights;
- **a checkpoint** ``checkpoint-N`` only once it is whole: its ``trainer_state.json`` (written
  last) is there and no ``checkpoint-is-incomplete.txt`` sentinel, at the hook after ``on_save``
  (every callback's ``on_save`` has run by then); the JIT checkpoint (``enable_jit_checkpoint``,
  which calls ``_save_checkpoint`` directly and never ``on_save``) is found on the next hook, and
  one written in the middle of a
  step (from ``on_pre_optimizer_step``, after that step's forward drew its dropout masks) says so;
- **the resume point** at ``on_train_begin`` (``global_step`` restored from ``checkpoint-N``);
- **the final digests** at ``on_train_end``, only when ``max_steps`` was reached (a Trainer
  stopped by a signal also ends its training, but did not finish it).

:class:`SaveOnSigterm` is the fix for the JIT checkpoint's half-step state: on SIGTERM it asks
for a save at the end of the current step and stops there (docs/frameworks.md).
"""

from __future__ import annotations

import json
import math
import os
import signal
from typing import Any

import transformers
from transformers import TrainerCallback

from ._report import Report, Stopwatch
from .verified import named_step_problem, newest_verified, write_checksums

__all__ = ["SaveOnSigterm", "SpotchaosCallback", "VerifiedCheckpoints", "last_verified_checkpoint"]

STATE_FILE = "trainer_state.json"
INCOMPLETE = "checkpoint-is-incomplete.txt"  # the JIT checkpoint's sentinel while it writes
PREFIX = "checkpoint-"
MID_STEP = (
    "transformers' JIT checkpoint (enable_jit_checkpoint) wrote checkpoint-{n} from on_pre_optimizer_step, in the "
    "middle of step {n}: it holds the RNG state after that step's forward, so the resumed step {n} draws other "
    "dropout masks. Save at a step boundary instead (spotchaos.integrations.transformers.SaveOnSigterm)"
)


def checkpoint_step(folder: str) -> int | None:
    """The ``global_step`` a whole ``checkpoint-N`` folder holds, or None if it is not (yet) whole."""
    if os.path.exists(os.path.join(folder, INCOMPLETE)):
        return None
    try:
        with open(os.path.join(folder, STATE_FILE)) as f:
            step = json.load(f).get("global_step")
    except (OSError, ValueError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _missing_rng(folder: str, process_index: int) -> str | None:
    """What a resume from ``folder`` lacks: the Trainer goes on without an RNG file, saying so only
    in an INFO log, and the resumed steps draw other dropout masks and samples."""
    names = ("rng_state.pth", f"rng_state_{process_index}.pth")
    if any(os.path.exists(os.path.join(folder, name)) for name in names):
        return None
    held = "rng_state.pth" if process_index == 0 else f"rng_state_{process_index}.pth for rank {process_index}"
    return (
        f"{os.path.basename(folder)} holds no {held}: transformers resumed without restoring the RNG "
        "(an INFO log only), so the resumed steps draw other dropout masks and samples"
    )


class SpotchaosCallback(TrainerCallback):
    """Reports a ``Trainer``'s steps, checkpoints, resume and final weights to spotchaos.

    ``weights``: fingerprint the weights after every step (default: models up to 20 M parameters).
    """

    def __init__(self, *, weights: bool | None = None) -> None:
        self.report = Report("transformers", transformers.__version__, weights=weights)
        self.clock = Stopwatch()  # since the last step ended: a save's time
        self.step_clock = Stopwatch()  # since the step began: its training time
        self.in_step = False
        self.saved: dict[int, float] = {}  # global_step -> seconds, of the saves on_save announced

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.report.watch(model)
        folder = os.path.join(args.output_dir, f"{PREFIX}{state.global_step}")
        if state.global_step > 0:
            self.report.resume(state.global_step - 1, folder, caveat=_missing_rng(folder, args.process_index))
        self._seen_now(args)  # what was there before this attempt is not this attempt's checkpoint

    def on_step_begin(self, args, state, control, **kwargs):
        self._found(args, state)
        self.in_step = True
        self.step_clock.reset()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._found(args, state)

    def on_step_end(self, args, state, control, model=None, lr_scheduler=None, **kwargs):
        self.in_step = False  # the step is whole now: a checkpoint found here holds all of it
        self._found(args, state)
        loss, batch = self.report.take()
        lr = lr_scheduler.get_last_lr()[0] if lr_scheduler is not None else None
        epoch = math.ceil(state.epoch) - 1 if state.epoch else None  # the epoch this step belonged to
        seconds = self.step_clock.seconds()
        self.report.step(state.global_step - 1, loss, model=model, batch=batch, lr=lr, epoch=epoch, seconds=seconds)
        self.clock.reset()  # a save, if any, follows this hook

    def on_save(self, args, state, control, **kwargs):
        # reported at the next hook, once every callback's on_save has run (one may still be adding
        # to the folder: VerifiedCheckpoints' checksums)
        self.saved[state.global_step] = self.clock.seconds()

    def on_epoch_end(self, args, state, control, **kwargs):
        self._found(args, state)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._found(args, state)
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            self.report.final(model, state.global_step - 1)

    def _seen_now(self, args) -> None:
        for folder, step in self._checkpoints(args):
            self.report.reported.add(f"{os.path.abspath(folder)}@{step - 1}")

    def _found(self, args, state) -> None:
        """Report each whole checkpoint not reported yet: those ``on_save`` announced, and those it
        never does (the JIT checkpoint's). Looks only when there can be one: a save announced, or
        the JIT checkpoint on."""
        if not self.report.enabled or not (self.saved or args.enable_jit_checkpoint) or not state.is_world_process_zero:
            return  # on several ranks rank 0 reports the checkpoints (every rank its own steps)
        for folder, step in self._checkpoints(args):
            if f"{os.path.abspath(folder)}@{step - 1}" in self.report.reported:
                continue
            if step in self.saved:  # a periodic save
                self.report.checkpoint(step - 1, folder, seconds=self.saved.pop(step))
                continue
            mid_step = self.in_step and step == state.global_step
            caveat = MID_STEP.format(n=step) if mid_step else None
            self.report.checkpoint(step - 1, folder, seconds=self.clock.seconds(), reason="preemption", caveat=caveat)

    @staticmethod
    def _checkpoints(args) -> list[tuple[str, int]]:
        try:
            names = [n for n in os.listdir(args.output_dir) if n.startswith(PREFIX)]
        except OSError:
            return []
        found = []
        for name in names:
            folder = os.path.join(args.output_dir, name)
            step = checkpoint_step(folder)
            if step is not None and step > 0:
                found.append((folder, step))
        return sorted(found, key=lambda item: item[1])


class SaveOnSigterm(TrainerCallback):
    """On SIGTERM, save a checkpoint at the end of the step in progress and stop: a whole step's
    state, unlike the JIT checkpoint's (leave ``enable_jit_checkpoint`` off beside it)."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def on_step_end(self, args, state, control, **kwargs):
        if _any_rank(self.requested):
            control.should_save = True
            control.should_training_stop = True
        return control


def _any_rank(flag: bool) -> bool:
    """``flag`` on any rank, agreed by every rank (one all-reduce a step on several ranks).

    torchrun forwards the notice to every worker, and each gets it at its own point of its step: a
    rank that stopped to save alone would leave the others blocked in the next step's collectives
    (and the save's own barriers) until the grace window's SIGKILL. Agreed at the step's end, every
    rank saves after the same step and stops."""
    import torch
    import torch.distributed as dist

    if not _several_ranks():
        return flag
    agreed = torch.tensor([1 if flag else 0])
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return bool(agreed.item())


class VerifiedCheckpoints(TrainerCallback):
    """After each save, a sha256 of every file of ``checkpoint-N`` in ``checksums.json``, written
    whole (a temporary file, fsynced, renamed): the Trainer verifies nothing it loads, so a torn or
    bit-flipped checkpoint is resumed from, or makes every restart fail. Resume with
    :func:`last_verified_checkpoint`."""

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"{PREFIX}{state.global_step}")
        _every_rank_done()  # each rank's own files (rng_state_<r>.pth) are written before they are summed
        if state.is_world_process_zero and os.path.isdir(folder):
            write_checksums(folder)


def _every_rank_done() -> None:
    """A barrier on several ranks: every rank has finished its part of the save."""
    if _several_ranks():
        import torch.distributed as dist

        dist.barrier()


def _several_ranks() -> bool:
    """The Trainer runs in a process group of 2 or more ranks (torchrun): a collective is needed."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def last_verified_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` of ``output_dir`` whose files all match their ``checksums.json``
    (see :class:`VerifiedCheckpoints`), for ``trainer.train(resume_from_checkpoint=...)``; each newer
    one skipped is reported to spotchaos as a rollback. None when none verifies."""
    try:
        names = [n for n in os.listdir(output_dir) if n.startswith(PREFIX) and n[len(PREFIX) :].isdigit()]
    except OSError:
        return None
    newest_first = sorted(names, key=lambda n: int(n[len(PREFIX) :]), reverse=True)
    return newest_verified(
        (os.path.join(output_dir, n) for n in newest_first), required=STATE_FILE, named=_holds_its_step
    )


def _holds_its_step(folder: str) -> str | None:
    """The Trainer names a checkpoint after its ``global_step``: a ``checkpoint-13`` holding step
    12's state is an older checkpoint under the newest name (a stale copy, a restored object
    version), whose checksums still match. None when the name and the state agree."""
    named = int(os.path.basename(folder)[len(PREFIX) :])
    return named_step_problem(folder, checkpoint_step(folder), named, what="global_step")

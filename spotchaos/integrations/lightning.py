"""Gate a Lightning job with one line (``lightning`` or ``pytorch_lightning``, whichever the job
uses):

    from spotchaos.integrations.lightning import SpotchaosCallback
    trainer = L.Trainer(..., callbacks=[SpotchaosCallback(), ModelCheckpoint(...)])

What the callback reports, and why it looks where it looks:

- **steps** 0-based (``global_step`` counts finished optimizer steps), from the loss the
  ``training_step`` returned, unrounded (the progress bar prints once per epoch off a terminal),
  with fingerprints of the batch, the learning rate and the weights;
- **a checkpoint** once ``strategy.save_checkpoint`` has returned, which is where every save of
  Lightning ends (``ModelCheckpoint`` runs its callbacks last, so no public hook sees its file
  written); on-exception checkpoints (``save_on_exception``) too;
- **the resume point** at ``on_train_start`` (``trainer.ckpt_path`` and the restored
  ``global_step``), with what the checkpoint lacks: Lightning saves no RNG state, and restores a
  DataLoader's position only when the loader is stateful (``state_dict``/``load_state_dict``);
- **the final digests** at ``teardown`` when the fit finished (``on_train_end`` is skipped when a
  restart has nothing left to train).
"""

from __future__ import annotations

import importlib
import time
from collections import deque
from typing import Any

try:
    import lightning.pytorch as pl

    _NAME = "lightning"
except ImportError:  # the older package name
    import pytorch_lightning as pl

    _NAME = "pytorch_lightning"

from ._report import Report

__all__ = ["SpotchaosCallback", "has_rng_state"]

NO_RNG = (
    "Lightning's checkpoint holds no RNG state (torch, numpy, python): the resumed steps draw other dropout masks "
    "and samples. Save and restore them in on_save_checkpoint / on_load_checkpoint (docs/frameworks.md)"
)
NOT_STATEFUL = (
    "resumed inside epoch {epoch} from a plain DataLoader, which Lightning restarts from its first batch (a "
    "warning only) unless the job restores the position itself: give the loader state_dict/load_state_dict, or "
    "have its sampler skip the batches already trained"
)

ORDER_FROM_RNG = (
    "Its sampler is a RandomSampler with no generator of its own: each epoch's order is drawn from the global "
    "torch RNG when the epoch starts, and a resume inside the epoch draws it again from the RNG as restored, a "
    "different point, so the rest of the epoch comes in another order. Give the DataLoader "
    "generator=torch.Generator().manual_seed(seed + epoch) (set at each epoch's start)"
)


BETWEEN_EPOCHS = (
    "Lightning wrote this checkpoint after epoch {epoch} ended and before the next began (the on-exception "
    "checkpoint of a notice on the epoch's last batch): it holds epoch {next} with epoch {epoch}'s batch progress "
    "({batches} batches), so the resumed run ends epoch {next} after one batch and trains on in the wrong epoch "
    "(Lightning 2.6.6). Save the SIGTERM checkpoint at the end of the step instead (docs/frameworks.md)"
)


SIGTERM_ON_RANKS = (
    "on several ranks Lightning 2.6's own SIGTERM handling hangs: its signal handler calls dist.broadcast from "
    "inside the handler, where it meets whatever collective the training step was in (torchrun forwards the "
    "notice to every rank; Lightning-AI/pytorch-lightning#20806). Note the signal only and agree at the step's "
    "end: spotchaos.integrations.lightning_exact.SaveOnSigterm (docs/frameworks.md)"
)


def _order_from_global_rng(loader: Any) -> bool:
    """A shuffling DataLoader whose RandomSampler draws each epoch's order from the global RNG."""
    from torch.utils.data import RandomSampler

    sampler = getattr(loader, "sampler", None)
    own = getattr(loader, "generator", None) or getattr(sampler, "generator", None)
    return isinstance(sampler, RandomSampler) and own is None


MID_ACCUMULATION = (
    "Lightning wrote this checkpoint in the middle of gradient accumulation, after {taken} of the {accumulate} "
    "micro-batches of step {step} (their gradients are in no checkpoint, the RNG has drawn for them): resumed, "
    "the step is trained from the wrong micro-batch on. ModelCheckpoint(every_n_train_steps) saves again at the "
    "first micro-batch after a resume, where global_step has not moved yet, over the checkpoint resumed from "
    "(Lightning 2.6.6; docs/frameworks.md). Save at step boundaries only: a ModelCheckpoint whose "
    "on_train_batch_end does nothing unless the batch ended an optimizer step."
)


def accumulation(trainer: Any) -> int:
    """The micro-batches an optimizer step takes (``accumulate_grad_batches``; 1 without it)."""
    return max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))


def micro_batches_taken(trainer: Any) -> int:
    """How many micro-batches of the optimizer step in progress the batches so far have taken: 0 at
    a step boundary (and always without gradient accumulation)."""
    accumulate = accumulation(trainer)
    try:
        processed = int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
    except (AttributeError, TypeError, ValueError):
        return 0
    batches = trainer.num_training_batches
    if accumulate < 2 or (isinstance(batches, int) and processed >= batches):  # Lightning steps at an epoch's end
        return 0
    return processed % accumulate


def mid_accumulation(trainer: Any) -> str | None:
    """What a checkpoint written between the micro-batches of one optimizer step lacks."""
    taken = micro_batches_taken(trainer)
    if not taken:
        return None
    return MID_ACCUMULATION.format(taken=taken, accumulate=accumulation(trainer), step=trainer.global_step)


def between_epochs(checkpoint: Any) -> str | None:
    """Whether a checkpoint's loops say every started epoch completed while the finished epoch's
    batches still count as the current epoch's: the state Lightning cannot resume from."""
    try:
        loop = checkpoint["loops"]["fit_loop"]
        epochs = loop["epoch_progress"]["current"]
        batches = loop["epoch_loop.batch_progress"]["current"]["completed"]
    except (KeyError, TypeError):
        return None
    if batches > 0 and epochs["completed"] == epochs["ready"] and epochs["completed"] > 0:
        epoch = int(checkpoint.get("epoch", epochs["completed"]))
        return BETWEEN_EPOCHS.format(epoch=epoch - 1, next=epoch, batches=batches)
    return None


def has_rng_state(checkpoint: Any, depth: int = 0) -> bool:
    """Whether a checkpoint dict holds anything named like RNG state, in its first three levels."""
    if not isinstance(checkpoint, dict) or depth > 2:
        return False
    for key, value in checkpoint.items():
        name = str(key).lower()
        if "rng" in name or "random" in name:
            return True
        if has_rng_state(value, depth + 1):
            return True
    return False


def _threaded(checkpoint_io: Any) -> Any:
    """The IO that Lightning's ``AsyncCheckpointIO`` runs in its writer thread, or None when the
    saves are synchronous."""
    asynchronous = getattr(importlib.import_module(f"{pl.__name__}.plugins.io"), "AsyncCheckpointIO", None)
    if asynchronous is None or not isinstance(checkpoint_io, asynchronous):
        return None
    return checkpoint_io.checkpoint_io


def _report_when_written(threaded: Any) -> deque:
    """Where a save to ``AsyncCheckpointIO`` leaves its report until the write is done.

    ``AsyncCheckpointIO.save_checkpoint`` returns once it has handed the write to its thread: a
    checkpoint reported then is reported durable before a byte of it is written, and a kill in
    between leaves a checkpoint the harness believes in and the restart cannot load. So the report
    waits: the IO the thread runs is wrapped, and the thread reports each checkpoint (in the order
    saved: one writer) once the file is whole."""
    pending: deque = deque()
    write = threaded.save_checkpoint

    def save_then_report(*args: Any, **kwargs: Any) -> None:
        durable = pending.popleft()  # this save's own report, whatever becomes of the write
        write(*args, **kwargs)  # raises on a failed write: nothing reported, Lightning raises it later
        durable()

    threaded.save_checkpoint = save_then_report
    return pending


def _report_removals(deleting: Any, trainer: Any, report: Report) -> None:
    """A rotation's deletions, reported as they happen, by the IO that deletes (an asynchronous
    one's may queue them behind its writes): the harness names one that deleted the last complete
    checkpoint before a newer one was written."""
    remove = deleting.remove_checkpoint

    def remove_checkpoint(path: Any) -> None:
        remove(path)
        if trainer.is_global_zero:
            report.removed(str(path))

    deleting.remove_checkpoint = remove_checkpoint


class SpotchaosCallback(pl.Callback):
    """Reports a Lightning fit's steps, checkpoints, resume and final weights to spotchaos."""

    def __init__(self, *, weights: bool | None = None) -> None:
        self.report = Report(_NAME, pl.__version__, weights=weights)
        self._last_step: int | None = None
        self._step_started: float | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        strategy = trainer.strategy
        original = strategy.save_checkpoint
        report = self.report
        threaded = _threaded(strategy.checkpoint_io)  # AsyncCheckpointIO's: the file is written later
        written = _report_when_written(threaded) if threaded is not None else None

        def save_checkpoint(checkpoint: dict, filepath: Any, storage_options: Any = None) -> None:
            started = time.perf_counter()
            said = None
            if trainer.is_global_zero:  # what the checkpoint is, read now: the trainer moves on
                step = int(checkpoint.get("global_step", trainer.global_step)) - 1
                reason = "preemption" if trainer.received_sigterm else "periodic"
                midway = mid_accumulation(trainer)
                caveats = [midway, between_epochs(checkpoint), None if has_rng_state(checkpoint) else NO_RNG]
                caveat = " ".join(c for c in caveats if c) or None
                # saved again over the checkpoint of its step (after a resume): a new state, reported
                said = {"step": step, "reason": reason, "caveat": caveat, "rewritten": bool(midway)}

            def durable() -> None:
                if said is not None:
                    report.checkpoint(**said, path=str(filepath), seconds=time.perf_counter() - started)

            if written is None:
                original(checkpoint, filepath, storage_options=storage_options)
                durable()
            else:
                written.append(durable)  # reported by the writer thread once the file is whole
                original(checkpoint, filepath, storage_options=storage_options)

        strategy.save_checkpoint = save_checkpoint  # the instance's: every save of this fit ends here
        _report_removals(threaded if threaded is not None else strategy.checkpoint_io, trainer, report)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.world_size > 1 and not any(getattr(c, "agrees_on_sigterm", False) for c in trainer.callbacks):
            # said up front: a hang leaves nothing to report from
            self.report.probe.emit("caveat", about="sigterm", text=SIGTERM_ON_RANKS)
        if trainer.ckpt_path and trainer.global_step > 0:
            self.report.resume(
                trainer.global_step - 1, str(trainer.ckpt_path), data_caveat=self._resume_caveat(trainer)
            )
        self._last_step = trainer.global_step

    def _resume_caveat(self, trainer: Any) -> str | None:
        """What a resume inside an epoch does to the data (a data caveat: the verdict names it only
        where the batches differ). A checkpoint without RNG state says so itself, on its event."""
        said = []
        batches = trainer.num_training_batches
        loader = trainer.train_dataloader
        stateful = hasattr(loader, "state_dict") and hasattr(loader, "load_state_dict")
        trained = trainer.global_step * accumulation(trainer)  # batches, not steps
        if isinstance(batches, int) and batches > 0 and trained % batches and not stateful:
            said.append(NOT_STATEFUL.format(epoch=trainer.current_epoch))
            if _order_from_global_rng(loader):
                said.append(ORDER_FROM_RNG)
        return " ".join(said) or None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._step_started is None:  # the first micro-batch of a step
            self._step_started = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self._last_step:
            return  # a micro-batch of gradient accumulation: the step is not over
        self._last_step = trainer.global_step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        _, fingerprint = self.report.take(batch)
        optimizers = trainer.optimizers
        lr = optimizers[0].param_groups[0]["lr"] if optimizers else None
        started, self._step_started = self._step_started, None
        seconds = time.perf_counter() - started if started is not None else None
        self.report.step(
            trainer.global_step - 1,
            loss,
            model=pl_module,
            batch=fingerprint,
            lr=lr,
            epoch=trainer.current_epoch,
            seconds=seconds,
        )

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or trainer.interrupted or trainer.received_sigterm or not trainer.fit_loop.done:
            return
        self.report.final(pl_module, trainer.global_step - 1)

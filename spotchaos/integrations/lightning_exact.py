"""What a Lightning job needs to resume bit-exact, shipped: each part one line to opt in.

Lightning's own defaults are not exact across a resume (docs/frameworks.md: its checkpoint holds no
RNG state, a plain DataLoader restarts its epoch from the first batch, its on-exception SIGTERM
checkpoint can land in the wrong epoch, ``ModelCheckpoint`` saves again mid-accumulation after a
resume, and nothing it loads is verified). The fixes were ~37 lines of a job of its own; here:

    from spotchaos.integrations.lightning_exact import (
        RngState, ResumableSampler, StepBoundaryCheckpoint, SaveOnSigterm, VerifiedIO, newest_verified_checkpoint,
    )
    sampler = ResumableSampler(len(data), batch_size=4, seed=0)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    trainer = L.Trainer(
        callbacks=[SpotchaosCallback(), RngState(), sampler.follow(),
                   StepBoundaryCheckpoint(dirpath=out, every_n_train_steps=6, save_last=True),
                   SaveOnSigterm(out)],
        plugins=[VerifiedIO()],
    )
    trainer.fit(model, loader, ckpt_path=newest_verified_checkpoint(out))

Checkpoints written in a thread (Lightning's ``AsyncCheckpointIO``): ``plugins=[OrderedAsyncCheckpointIO(
VerifiedIO())]``, whose deletions wait for the writes before them.

Each part stands alone and is independent of spotchaos being on: outside a gate they change
nothing but what they fix. On several ranks (``strategy="ddp"`` under torchrun) the same lines
hold: every rank's RNG is kept, each rank's sampler skips its own share, and the notice is agreed
at a step's end (Lightning's own SIGTERM handler hangs there). Imports Lightning (``lightning`` or
``pytorch_lightning``) and torch.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from .lightning import accumulation, micro_batches_taken
from .verified import SIDECAR, newest_verified, write_checksums

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
    from lightning.pytorch.utilities.exceptions import SIGTERMException
except ImportError:  # the older package name
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
    from pytorch_lightning.utilities.exceptions import SIGTERMException

__all__ = [
    "ResumableSampler",
    "RngState",
    "SaveOnSigterm",
    "StepBoundaryCheckpoint",
    "VerifiedIO",
    "newest_verified_checkpoint",
]

RNG_KEY = "spotchaos_rng_state"


def _world() -> tuple[int, int]:
    """(this process's rank, the number of ranks): from the process group once there is one, else
    from what torchrun tells each worker (before Lightning sets the group up)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class RngState(pl.Callback):
    """Saves torch's, numpy's and Python's global RNG states in every checkpoint and restores them
    on load: Lightning saves none, so dropout masks and augmentation after a resume differ. Stored
    as tensors and plain values (Lightning 2.6 loads with ``weights_only=True``). On several ranks
    every rank's states are gathered into the one checkpoint rank 0 writes (``ranks``), and each
    rank takes its own back: a rank's dropout draws from a stream of its own."""

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        state = _rng_states()
        world = _world()[1]
        if world > 1:  # every rank builds the checkpoint (Lightning's dump_checkpoint): one gather
            gathered: list[Any] = [None] * world
            torch.distributed.all_gather_object(gathered, state)
            state = {**gathered[0], "ranks": gathered}
        checkpoint[RNG_KEY] = state

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        state = checkpoint.get(RNG_KEY)
        if state is None:
            return  # a checkpoint from before the job opted in: nothing to restore
        rank, _ = _world()
        ranks = state.get("ranks")
        if ranks is not None and rank < len(ranks):
            state = ranks[rank]
        # .cpu(): a checkpoint loaded with map_location="cuda" brings the CPU generator's state along
        torch.set_rng_state(state["torch"].cpu())
        kind, words, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, words.cpu().numpy().astype(np.uint32), pos, has_gauss, gauss))
        random.setstate(state["python"])


def _rng_states() -> dict[str, Any]:
    kind, words, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(words.astype(np.int64)), pos, has_gauss, gauss],
        "python": random.getstate(),
    }


class ResumableSampler(DistributedSampler):
    """A shuffled order that is a function of (seed, epoch) alone, starting where the epoch stands:
    the batches of this epoch already trained (the restored global step, times the micro-batches a
    step takes) are skipped, after any resume, a second one inside the epoch included. Lightning
    calls ``set_epoch`` at each epoch's start; ``follow()`` is the callback that tells it the trainer.

    On several ranks (torchrun's ``RANK`` and ``WORLD_SIZE``, or the arguments) each rank takes
    every ``world``-th sample of the order, padded as ``DistributedSampler`` pads it, and skips its
    own share of what was trained. It is a ``DistributedSampler`` so that Lightning leaves it as it
    is: Lightning wraps any other sampler in a ``DistributedSamplerWrapper``, which splits whatever
    the sampler yields and pads a shortened epoch with samples from its start."""

    def __init__(
        self, n: int, batch_size: int, seed: int = 0, *, num_replicas: int | None = None, rank: int | None = None
    ) -> None:
        own_rank, world = _world()
        super().__init__(
            range(n),
            num_replicas=num_replicas or world,
            rank=own_rank if rank is None else rank,
            shuffle=False,
            drop_last=False,
        )
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.trainer: Any = None

    def follow(self) -> pl.Callback:
        """The callback that hands this sampler its trainer (``callbacks=[..., sampler.follow()]``)."""
        return _Follow(self)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        order += order[: self.total_size - self.n]  # every rank the same number of samples
        mine = order[self.rank : self.total_size : self.num_replicas]
        trainer = self.trainer
        if trainer is None:
            return iter(mine)
        per_epoch = -(-len(mine) // self.batch_size)
        done = trainer.global_step * accumulation(trainer) - self.epoch * per_epoch
        return iter(mine[max(0, done) * self.batch_size :])


class _Follow(pl.Callback):
    def __init__(self, sampler: ResumableSampler) -> None:
        self.sampler = sampler

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.sampler.trainer = trainer


class StepBoundaryCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that never saves between the micro-batches of one optimizer step: with
    ``accumulate_grad_batches`` > 1 Lightning 2.6.6's saves again at the first micro-batch after a
    resume, over the checkpoint resumed from (docs/frameworks.md)."""

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        if micro_batches_taken(trainer):
            return
        super().on_train_batch_end(trainer, *args, **kwargs)


class SaveOnSigterm(pl.Callback):
    """The SIGTERM checkpoint, saved at the end of the optimizer step in progress (Lightning's own,
    ``save_on_exception=True``, is written after the epoch counter moved on when the notice lands on
    an epoch's last batch, and resumes into the wrong epoch: docs/frameworks.md).

    On several ranks the notice reaches each rank at its own step (torchrun forwards it to every
    worker), and Lightning 2.6's own SIGTERM handler calls ``dist.broadcast`` from inside the signal
    handler, where it meets whatever collective the training step was in: the ranks hang until the
    grace window's SIGKILL (docs/frameworks.md). So here the handler only notes the signal; at each
    step's end the ranks agree (any rank noticed: every rank saves, after the same step) and then
    stop together."""

    agrees_on_sigterm = True  # the integration's callback looks for this: no caveat on several ranks

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath
        self._noticed = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if _world()[1] > 1:  # after Lightning registered its own handler at the fit's start

            def note(signum: int, frame: Any) -> None:
                self._noticed = True

            signal.signal(signal.SIGTERM, note)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if micro_batches_taken(trainer):
            return
        if _world()[1] == 1:
            if trainer.received_sigterm:
                trainer.save_checkpoint(self._path(trainer))
            return
        if trainer.strategy.reduce_boolean_decision(self._noticed, all=False):  # a collective: every rank, every step
            trainer._signal_connector.received_sigterm = True  # the checkpoint is the notice's (the report says so)
            trainer.save_checkpoint(self._path(trainer))
            raise SIGTERMException  # every rank, after the same step: Lightning ends the fit as on a notice

    def _path(self, trainer: Any) -> str:
        return os.path.join(self.dirpath, f"sigterm-step={trainer.global_step}.ckpt")


class VerifiedIO(TorchCheckpointIO):
    """Every checkpoint file gets its sha256 beside it once written: Lightning verifies nothing it
    loads (``ckpt_path="last"`` takes last.ckpt as it is, even when a newer checkpoint exists)."""

    def save_checkpoint(self, checkpoint: dict, path: Any, storage_options: Any = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        write_checksums(str(path))


class OrderedAsyncCheckpointIO(AsyncCheckpointIO):
    """Lightning's ``AsyncCheckpointIO`` with its deletions queued behind its writes.

    ``AsyncCheckpointIO`` (Lightning 2.6.6) writes in a thread but deletes at once: a
    ``ModelCheckpoint`` with ``save_top_k`` removes the older checkpoint as soon as the new save is
    handed off, and a kill before the write ends leaves no complete checkpoint at all (the gate
    names it: *its rotation removed the last complete checkpoint*). Here a deletion waits its turn
    on the same one-thread queue, so it happens only once every write handed off before it is done.
    Wrap the IO that writes: ``OrderedAsyncCheckpointIO(VerifiedIO())``."""

    def remove_checkpoint(self, path: Any) -> None:
        self._ensure_setup()
        assert self._executor is not None and self.checkpoint_io is not None
        self._executor.submit(self.checkpoint_io.remove_checkpoint, path)
        if self._error:  # a write that failed since the last call, raised as AsyncCheckpointIO does
            raise self._error


def newest_verified_checkpoint(dirpath: str) -> str | None:
    """The newest checkpoint file of ``dirpath`` (last.ckpt included: the last one written) whose
    sha256 matches; each newer one that does not is reported to spotchaos as a rollback. A
    checkpoint whose file is gone but whose ``.sha256`` is still there (deleted, or lost with its
    disk) is one of them, dated by that sidecar: without it the resume would fall back silently."""
    if not os.path.isdir(dirpath):
        return None
    names = [n for n in os.listdir(dirpath) if not n.startswith(".")]
    files = {os.path.join(dirpath, n) for n in names if n.endswith(".ckpt")}
    files |= {os.path.join(dirpath, n[: -len(SIDECAR)]) for n in names if n.endswith(".ckpt" + SIDECAR)}

    def written(path: str) -> int:
        for candidate in (path, path + SIDECAR):
            with contextlib.suppress(OSError):
                return os.stat(candidate).st_mtime_ns
        return 0

    return newest_verified(sorted(files, key=written, reverse=True))

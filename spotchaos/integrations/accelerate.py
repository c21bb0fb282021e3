"""Gate an accelerate job: accelerate has no callbacks, so the job wraps its ``Accelerator`` once
and reports each step and the end itself (three lines):

    from spotchaos.integrations.accelerate import Spotchaos
    chaos = Spotchaos(accelerator)         # save_state / load_state now report to spotchaos
    ...
    chaos.step(step, loss, batch=batch, model=model)   # after each optimizer step, step 0-based
    ...
    chaos.final(model, step)               # training finished after ``step``

``save_state`` reports its folder as a checkpoint of the state after the last reported step once
it has returned (every file written; a job that saves to a temporary ``.name`` and renames it
reports the final name with ``chaos.checkpoint(folder)``); ``load_state`` is reported as the resume at the next step,
with what its checkpoint lacked: accelerate's ``load_state`` skips a missing
``random_states_*.pkl`` with an INFO log and goes on.
"""

from __future__ import annotations

import os
import time
from typing import Any

import accelerate

from ._report import Report

__all__ = ["Spotchaos"]

RNG_FILE = "random_states_{index}.pkl"
NO_RNG = (
    "{folder} holds no {name}: accelerate's load_state went on without restoring the RNG (an INFO log only), "
    "so the resumed steps draw other dropout masks and samples"
)
SAMPLER_FROM_RNG = (
    "resumed mid-epoch with a shuffling DataLoader that has no generator of its own: after load_state restores "
    "the RNG, its RandomSampler seeds the epoch's order from it, and iter(DataLoader) draws its base seed a draw "
    "later than the uninterrupted run did, so the documented load_state + skip_first_batches recipe is exact "
    "only from an epoch boundary. Give the DataLoader generator=torch.Generator().manual_seed(seed + epoch)"
)


class Spotchaos:
    """Reports an accelerate job's steps, checkpoints, resume and final weights to spotchaos.

    ``steps_per_epoch``: when given, a resume that is not at an epoch boundary from a shuffling
    DataLoader without a generator of its own says why it cannot be exact.
    """

    def __init__(self, accelerator: Any, *, steps_per_epoch: int | None = None, weights: bool | None = None):
        self.accelerator = accelerator
        self.steps_per_epoch = steps_per_epoch
        self.report = Report("accelerate", accelerate.__version__, weights=weights)
        self._loaded: str | None = None
        self._last: int | None = None
        self._seconds = 0.0  # the last save_state's
        self._since = time.perf_counter()  # when the last step was reported (or the job set up)
        self._saving = 0.0  # seconds spent in save_state since then
        self._model: tuple[Any, Any] | None = None  # (the model handed in, unwrapped)
        save, load = accelerator.save_state, accelerator.load_state

        def save_state(output_dir: str | None = None, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            where = save(output_dir, *args, **kwargs)
            folder = str(where or output_dir)
            self._seconds = time.perf_counter() - started
            self._saving += self._seconds
            if not os.path.basename(folder).startswith("."):  # a temporary name: reported once renamed
                self.checkpoint(folder)
            return where

        def load_state(input_dir: str | None = None, *args: Any, **kwargs: Any) -> Any:
            result = load(input_dir, *args, **kwargs)
            self._loaded = str(input_dir) if input_dir is not None else None
            self._since, self._saving = time.perf_counter(), 0.0  # restoring is not training
            return result

        accelerator.save_state, accelerator.load_state = save_state, load_state

    def step(self, step: int, loss: Any, *, batch: Any = None, model: Any = None, lr: Any = None) -> None:
        """Step ``step`` (0-based) finished with ``loss``."""
        if self._loaded is not None:
            caveat, data_caveat = self._caveats(step)
            self.report.resume(step - 1, self._loaded, caveat=caveat, data_caveat=data_caveat)
            self._loaded = None
        _, fingerprint = self.report.take(batch)
        unwrapped = self._unwrapped(model) if model is not None and self.report.weights is not False else None
        epoch = step // self.steps_per_epoch if self.steps_per_epoch else None
        now = time.perf_counter()  # the step's time: since the last report, less the saves in between
        seconds = max(0.0, now - self._since - self._saving)
        self._since, self._saving = now, 0.0
        self.report.step(step, loss, model=unwrapped, batch=fingerprint, lr=lr, epoch=epoch, seconds=seconds)
        self._last = step

    def _unwrapped(self, model: Any) -> Any:
        """The model under accelerate's wrappers (the same object each step: asked once)."""
        if self._model is None or self._model[0] is not model:
            self._model = (model, self.accelerator.unwrap_model(model))
        return self._model[1]

    def _caveats(self, step: int) -> tuple[str | None, str | None]:
        """What the resume lacks: (of its state, of its data order)."""
        caveat = data = None
        name = RNG_FILE.format(index=self.accelerator.process_index)
        if self._loaded and not os.path.exists(os.path.join(self._loaded, name)):
            caveat = NO_RNG.format(folder=os.path.basename(self._loaded), name=name)
        if self.steps_per_epoch and step % self.steps_per_epoch and self._shuffles_from_global_rng():
            data = SAMPLER_FROM_RNG
        return caveat, data

    def _shuffles_from_global_rng(self) -> bool:
        for loader in getattr(self.accelerator, "_dataloaders", []):  # what prepare() returned
            # a prepared loader keeps the shuffling sampler inside its batch sampler
            samplers = (
                getattr(loader, "sampler", None),
                getattr(getattr(loader, "batch_sampler", None), "sampler", None),
            )
            shuffles = [s for s in samplers if type(s).__name__ in ("RandomSampler", "SeedableRandomSampler")]
            if (
                any(getattr(s, "generator", None) is None for s in shuffles)
                and getattr(loader, "generator", None) is None
            ):
                return True
        return False

    def checkpoint(self, folder: str) -> None:
        """``folder`` holds the state after the last reported step, whole: what ``save_state`` says
        of its own folder, unless that folder's name starts with ``.`` (a temporary one the job
        renames into place, then reports with this)."""
        if self.accelerator.is_main_process and self._last is not None:
            self.report.checkpoint(self._last, folder, seconds=self._seconds)

    def final(self, model: Any, step: int) -> None:
        """Training finished after ``step``: the digests of the (unwrapped) model's weights."""
        self.report.final(self.accelerator.unwrap_model(model), step)

"""What the framework integrations share: the contract's events for one framework's run.

Frameworks count steps their own way (transformers' ``global_step`` and Lightning's count
finished optimizer steps, from 1 at the first event a callback sees), round the loss they log,
and write checkpoints as folders whose completion only they know. An integration translates:
steps 0-based, the loss unrounded (as the step computed it), a fingerprint of the batch and of
the weights beside it, and a checkpoint reported only once it is whole on disk.

Imports the standard library and :mod:`spotchaos.probe` only (torch when handed tensors), so it
runs wherever the job's framework runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from ..probe import Probe, fingerprint

# Digesting every weight after every step costs about one read of the model: free for the tiny
# configurations a CI gate trains, not for a real one (the final digests still compare those).
WEIGHTS_FINGERPRINT_LIMIT = 20_000_000  # parameters


def loss_of(output: Any) -> Any:
    """The loss in a model's or a step's output: ``output.loss`` (transformers' ModelOutput),
    ``output["loss"]`` (a dict, Lightning's step output), or a 0-d tensor itself; else None."""
    if isinstance(output, Mapping):
        return output.get("loss")
    if hasattr(output, "loss"):
        return output.loss
    if hasattr(output, "dim") and output.dim() == 0:
        return output
    return None


def tensors_in(value: Any) -> list[Any]:
    """Every tensor in a batch (tensors, dicts, lists, tuples), in a stable order."""
    if hasattr(value, "detach"):
        return [value]
    if isinstance(value, Mapping):
        return [t for k in sorted(value, key=str) for t in tensors_in(value[k])]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors_in(v)]
    return []


def folder_bytes(path: str) -> int:
    """Bytes of the regular files in a checkpoint (a file or a folder), no link followed."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


class Report:
    """The events of one framework's run, through the probe (a no-op without ``SPOTCHAOS_EVENTS``).

    ``weights``: fingerprint the weights after every step (None: only models up to
    WEIGHTS_FINGERPRINT_LIMIT parameters).
    """

    def __init__(self, framework: str, version: str, *, probe: Probe | None = None, weights: bool | None = None):
        self.probe = probe if probe is not None else Probe.from_env()
        self.framework = framework
        self.weights = weights
        self.reported: set[str] = set()  # checkpoints already reported, by path and step
        self.last_step: int | None = None
        self._losses: list[Any] = []
        self._batches: list[str] = []
        self._hooked: set[int] = set()
        self.probe.start(framework=framework, framework_version=version)

    @property
    def enabled(self) -> bool:
        return self.probe.enabled

    def watch(self, model: Any) -> None:
        """Take each training forward's loss and inputs from ``model``'s output (once per model):
        a step's loss is what its forwards computed, not what the framework logs (rounded)."""
        if not self.enabled or model is None or id(model) in self._hooked:
            return
        self._hooked.add(id(model))

        def hook(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
            if not module.training:
                return
            loss = loss_of(output)
            if loss is not None:
                self._losses.append(loss.detach() if hasattr(loss, "detach") else loss)
                self._batches.append(fingerprint(*tensors_in(args), *tensors_in(kwargs)))

        model.register_forward_hook(hook, with_kwargs=True)

    def take(self, batch: Any = None) -> tuple[Any, str | None]:
        """The loss of the step that just ended (the sum of its micro-batches' losses) and its
        batch's fingerprint, from the watched forwards (or ``batch`` when given)."""
        losses, batches = self._losses, self._batches
        self._losses, self._batches = [], []
        loss = None
        if losses:
            loss = sum(float(x.float().item()) if hasattr(x, "item") else float(x) for x in losses)
        shown = fingerprint(*tensors_in(batch)) if batch is not None else (fingerprint(*batches) if batches else None)
        return loss, shown

    def step(
        self,
        step: int,
        loss: Any,
        *,
        model: Any = None,
        batch: str | None = None,
        lr: Any = None,
        epoch: int | None = None,
        seconds: float | None = None,
    ) -> None:
        """Step ``step`` (0-based) finished with ``loss``; fingerprints of its batch, the learning
        rate, the epoch it belongs to and the weights after it go beside it (the epochs also tell
        the harness where epoch boundaries are, to aim resumes at them and inside them);
        ``seconds`` is the step's training time, which checkpoint overhead is measured against."""
        if not self.enabled:
            return
        fingerprints: dict[str, Any] = {}
        if epoch is not None:
            fingerprints["epoch"] = int(epoch)
        if batch is not None:
            fingerprints["batch"] = batch
        if lr is not None:
            fingerprints["lr"] = float(lr)
        if model is not None and self._fingerprint_weights(model):
            fingerprints["weights"] = fingerprint(*(p for _, p in sorted(model.state_dict().items())))
        self.last_step = step
        self.probe.step(step, loss if loss is not None else float("nan"), seconds=seconds, fingerprints=fingerprints)

    def _fingerprint_weights(self, model: Any) -> bool:
        if self.weights is None:
            self.weights = sum(p.numel() for p in model.parameters()) <= WEIGHTS_FINGERPRINT_LIMIT
        return self.weights

    def checkpoint(
        self,
        step: int,
        path: str,
        *,
        seconds: float,
        reason: str = "periodic",
        caveat: str | None = None,
        rewritten: bool = False,
    ) -> None:
        """The framework's checkpoint of the state after ``step`` is whole at ``path``;
        ``rewritten``: written again over the one of that name and step (other state than it held)."""
        path = os.path.abspath(path)
        if not self.enabled or (f"{path}@{step}" in self.reported and not rewritten):
            return
        self.reported.add(f"{path}@{step}")  # a name saved again (Lightning's last.ckpt) is a new checkpoint
        self.probe.checkpoint(step, seconds=seconds, nbytes=folder_bytes(path), uri=path, reason=reason, caveat=caveat)

    def removed(self, path: str) -> None:
        """The framework deleted the checkpoint at ``path`` (its rotation)."""
        if self.enabled:
            self.probe.removed(os.path.abspath(path))

    def resume(self, from_step: int, path: str, *, caveat: str | None = None, data_caveat: str | None = None) -> None:
        """Training goes on after ``from_step``, restored from ``path`` (caveats: see Probe.resume)."""
        self.reported.add(f"{os.path.abspath(path)}@{from_step}")
        self.probe.resume(from_step, os.path.abspath(path), caveat=caveat, data_caveat=data_caveat)

    def final(self, model: Any, step: int) -> None:
        """Training finished after ``step``: the digests of the weights."""
        self.probe.final(model.state_dict(), step=step)


class Stopwatch:
    """Seconds since the last ``reset``: how long a framework's save took, seen from its hooks."""

    def __init__(self) -> None:
        self.since = time.perf_counter()

    def reset(self) -> None:
        self.since = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.since

"""A training script that survives spot preemption, bit-exact: the essential pattern, to copy.

What makes a resume exact, each a few lines below: every random number generator saved and
restored (torch's and Python's); the data order a function of (seed, epoch) and the position in
the epoch saved; optimizer and scheduler state saved at the same instant as the weights; an
atomic save (temporary folder, fsync, a manifest with a digest written last, rename) so a kill
mid-save never leaves a checkpoint that loads wrong; a resume from the newest checkpoint whose
manifest verifies (older ones stay as a fallback); SIGTERM sets a flag, the current step
finishes, a checkpoint is written and the script exits 0. The ``probe`` calls tell spotchaos what
happened; without ``SPOTCHAOS_EVENTS`` set they do nothing.

    python examples/train_with_probe.py --steps 24 --checkpoint-every 6
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import torch
from torch import nn

from spotchaos.probe import Probe, checkpoint_dir_from_env

SEED, SAMPLES, BATCH = 1234, 256, 16
stop_requested = False


def batches_of_epoch(epoch: int) -> list[torch.Tensor]:
    """The epoch's sample order depends on (seed, epoch) only, so a restart can rebuild it."""
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(SEED + epoch))
    return list(order.split(BATCH))


def save(root: Path, step: int, state: dict, keep: int = 2) -> Path:
    """Atomic: written to a temporary folder, fsynced, verified by a manifest written last, renamed."""
    final = root / f"ckpt-{step:08d}"
    tmp = root / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with open(tmp / "state.pt", "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    digest = hashlib.sha256((tmp / "state.pt").read_bytes()).hexdigest()
    with open(tmp / "manifest.json", "w") as f:
        json.dump({"step": step, "state.pt": {"sha256": digest}}, f)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():  # a checkpoint of this step that failed to verify: the resume rolled back past it
        shutil.rmtree(final)
    os.rename(tmp, final)
    directory = os.open(root, os.O_RDONLY)
    os.fsync(directory)  # the rename itself is durable
    os.close(directory)
    for old in sorted(root.glob("ckpt-*"))[:-keep]:
        shutil.rmtree(old)
    return final


def newest_valid(root: Path, probe: Probe) -> tuple[Path, dict] | None:
    """The newest checkpoint whose manifest verifies and that holds the step its name says (another
    step's content under this name is damage too); each one skipped is reported as a rollback."""
    for ckpt in sorted(root.glob("ckpt-*"), reverse=True):
        try:
            manifest = json.loads((ckpt / "manifest.json").read_text())
            data = (ckpt / "state.pt").read_bytes()
            if hashlib.sha256(data).hexdigest() != manifest["state.pt"]["sha256"]:
                raise ValueError("digest mismatch")
            state = torch.load(ckpt / "state.pt", weights_only=True)  # plain tensors and containers
            if not int(ckpt.name.split("-")[1]) == manifest["step"] == state["step"]:
                raise ValueError(f"holds step {state['step']}, not the step its name says")
            return ckpt, state
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            probe.rollback(ckpt.as_uri(), f"{type(exc).__name__}: {exc}")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--checkpoint-every", type=int, default=6)
    args = parser.parse_args()

    probe = Probe.from_env()
    probe.start()

    def on_sigterm(signum, frame) -> None:
        global stop_requested
        stop_requested = True
        probe.notice(signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    torch.set_num_threads(1)  # a fixed thread count: reductions sum in the same order every run
    torch.manual_seed(SEED)
    random.seed(SEED)
    inputs, targets = torch.randn(SAMPLES, 8), torch.randn(SAMPLES, 1)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
    root = Path(checkpoint_dir_from_env("checkpoints"))
    root.mkdir(parents=True, exist_ok=True)

    step, epoch, position = 0, 0, 0
    found = newest_valid(root, probe)
    if found is not None:
        ckpt, state = found
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate((state["python_rng"][0], tuple(state["python_rng"][1]), state["python_rng"][2]))
        step, epoch, position = state["step"] + 1, state["epoch"], state["position"]
        probe.resume(state["step"], ckpt.as_uri())

    batches = batches_of_epoch(epoch)
    while step < args.steps:
        if position == len(batches):  # the epoch is over: the next one has its own order
            epoch, position = epoch + 1, 0
            batches = batches_of_epoch(epoch)
        ids = batches[position]
        started = time.perf_counter()
        noise = random.random() * 1e-3  # an augmentation that draws from Python's RNG
        loss = nn.functional.mse_loss(model(inputs[ids] + noise), targets[ids])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        position += 1
        seconds = time.perf_counter() - started
        probe.step(step, loss.item(), seconds=seconds, fingerprints={"lr": scheduler.get_last_lr()[0], "batch": ids})
        if (step + 1) % args.checkpoint_every == 0 or stop_requested:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(),
                "step": step,
                "epoch": epoch,
                "position": position,
            }
            started = time.perf_counter()
            ckpt = save(root, step, state)
            size = sum(p.stat().st_size for p in ckpt.iterdir())
            reason = "preemption" if stop_requested else "periodic"
            probe.checkpoint(step, seconds=time.perf_counter() - started, nbytes=size, uri=ckpt.as_uri(), reason=reason)
            if stop_requested:
                return  # exit 0 inside the grace window: the checkpoint is durable
        step += 1
    probe.final(model.state_dict(), step=args.steps - 1)


if __name__ == "__main__":
    main()

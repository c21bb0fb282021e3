"""What a framework integration costs per step, as a ratio of a tiny model's step time, measured in
one run (never asserted in a test).

For each framework, the same tiny training loop is timed twice in this process: without the
integration, and with it reporting to an events file (forward hook, loss, batch and learning-rate
fingerprints, and the weights fingerprint, which is the largest part and is on by default for
models up to 20 M parameters). The ratio is (with - without) / without, per step.

    .venv/bin/python benchmarks/framework_costs.py --steps 200 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Tokens(Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 12), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def transformers_seconds(steps: int, integrated: bool, out: str, weights: bool) -> float:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from spotchaos.integrations.transformers import SpotchaosCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=4, save_strategy="no", report_to=[],
        use_cpu=True, disable_tqdm=True, logging_steps=10**9, seed=0,
    )  # fmt: skip
    callbacks = [SpotchaosCallback(weights=weights)] if integrated else []
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(64), callbacks=callbacks)
    started = time.perf_counter()
    trainer.train()
    return time.perf_counter() - started


def lightning_seconds(steps: int, integrated: bool, out: str, weights: bool) -> float:
    import lightning.pytorch as L

    from spotchaos.integrations.lightning import SpotchaosCallback

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Dropout(0.3), nn.Linear(256, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)), batch_size=4)
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, callbacks=[SpotchaosCallback(weights=weights)] if integrated else [],
        default_root_dir=out,
    )  # fmt: skip
    started = time.perf_counter()
    trainer.fit(Model(), loader)
    return time.perf_counter() - started


def accelerate_seconds(steps: int, integrated: bool, out: str, weights: bool) -> float:
    from accelerate import Accelerator

    from spotchaos.integrations.accelerate import Spotchaos

    accelerator = Accelerator(cpu=True)
    chaos = Spotchaos(accelerator, weights=weights) if integrated else None
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    model = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Dropout(0.3), nn.Linear(256, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4, shuffle=True))
    started = time.perf_counter()
    step = 0
    while step < steps:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if chaos is not None:
                chaos.step(step, loss, batch=(x, y), model=model)
            step += 1
            if step >= steps:
                break
    return time.perf_counter() - started


FRAMEWORKS = {"transformers": transformers_seconds, "lightning": lightning_seconds, "accelerate": accelerate_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    print(f"{'framework':<13} {'step ms':>8} {'+ integration ms':>17} {'ratio':>7} {'ratio, no weights fp':>21}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, run in FRAMEWORKS.items():
            times = {}
            for label, integrated, weights in (("bare", False, False), ("full", True, True), ("light", True, False)):
                os.environ["SPOTCHAOS_EVENTS"] = os.path.join(tmp, f"{name}-{label}.jsonl")
                run(10, integrated, tmp, weights)  # warm-up: imports, first allocations
                times[label] = statistics.median(run(args.steps, integrated, tmp, weights) for _ in range(args.repeats))
                os.environ.pop("SPOTCHAOS_EVENTS")
            bare, full, light = (times[k] / args.steps * 1000 for k in ("bare", "full", "light"))
            ratios = f"{(full - bare) / bare:7.1%} {(light - bare) / bare:21.1%}"
            print(f"{name:<13} {bare:8.2f} {full - bare:17.3f} {ratios}")


if __name__ == "__main__":
    main()

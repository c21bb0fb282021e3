"""What the state diff costs, as ratios measured in one run (never asserted in a test).

- keeping a checkpoint as it appears (a link-refusing copy, done in the engine's poll loop)
  against the job's own ``torch.save`` of the same state;
- comparing two kept checkpoints key by key (two ``weights_only`` loads and a digest per
  tensor) against one ``torch.load`` of the file;
- learning nothing new: the same figures for a small (reference-trainer-sized) and a large state;
- hostile files (an .npz zip bomb inflating to 1 GiB, a safetensors file declaring a 90 MB header)
  against an ordinary 16 MiB .npz: the time and the peak memory (tracemalloc) of reading each.

    .venv/bin/python benchmarks/state_diff_costs.py --repeats 3
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch
from trust_costs import timed  # the same median-of-repeats timer

from spotchaos.training.state.diff import DiffRules, _compare_folders
from spotchaos.training.state.kept import keep


def state(megabytes: float) -> dict:
    count = max(1, int(megabytes * (1 << 20) / 4 / 8))
    g = torch.Generator().manual_seed(0)
    model = {f"layer{i}.weight": torch.randn(count, generator=g) for i in range(8)}
    return {"model": model, "optimizer": {"state": {0: {"step": torch.tensor(12.0)}}}, "step": 12}


def measure(megabytes: float, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "checkpoints"
        root.mkdir()
        payload = state(megabytes)
        path = root / "ckpt.pt"
        save = timed(lambda: torch.save(payload, path), repeats)
        load = timed(lambda: torch.load(path, weights_only=True), repeats)
        into = Path(tmp) / "kept"
        into.mkdir()
        counter = iter(range(10**6))

        def keep_once() -> None:
            keep({"uri": path.as_uri(), "step": next(counter)}, 0, root, into)

        copy = timed(keep_once, repeats)
        kept = sorted(into.iterdir())
        other = Path(tmp) / "other"
        shutil.copytree(kept[0], other)
        compare = timed(lambda: _compare_folders(kept[0], other, None, DiffRules()), repeats)
        size = path.stat().st_size / (1 << 20)
        print(
            f"{size:8.1f} MiB: torch.save {save * 1e3:8.1f} ms, "
            f"keep {copy * 1e3:8.1f} ms ({copy / save:.2f}x the save), "
            f"compare {compare * 1e3:8.1f} ms ({compare / load:.2f}x one load of {load * 1e3:.1f} ms)"
        )


def hostile(repeats: int) -> None:
    import time
    import tracemalloc
    import zipfile

    import numpy as np

    from spotchaos.training.state.formats import AsBytes, load_state

    with tempfile.TemporaryDirectory() as tmp:
        ordinary = Path(tmp) / "ordinary.npz"
        np.savez(ordinary, w=np.random.default_rng(0).standard_normal(2 << 20).astype(np.float64))
        bomb = Path(tmp) / "bomb.npz"
        header = np.lib.format.header_data_from_array_1_0(np.zeros(1, dtype=np.uint8))
        header["shape"] = (1 << 30,)
        with (
            zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive,
            archive.open("x.npy", "w", force_zip64=True) as member,
        ):
            np.lib.format.write_array_header_1_0(member, header)
            for _ in range(64):
                member.write(bytes(1 << 24))
        big_header = Path(tmp) / "model.safetensors"
        big_header.write_bytes((90 << 20).to_bytes(8, "little") + b"{" + b" " * (90 << 20))
        for path in (ordinary, bomb, big_header):
            seconds = []
            for _ in range(repeats):
                tracemalloc.start()
                started = time.perf_counter()
                try:
                    load_state(path)
                    outcome = "read"
                except AsBytes as exc:
                    outcome = f"as bytes ({str(exc)[:60]}...)"
                seconds.append(time.perf_counter() - started)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            size = path.stat().st_size / (1 << 20)
            print(
                f"{path.name:18} {size:7.1f} MiB on disk: {sorted(seconds)[len(seconds) // 2] * 1e3:8.1f} ms, "
                f"peak {peak / (1 << 20):7.1f} MiB, {outcome}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for megabytes in (0.1, 16, 128):
        measure(megabytes, args.repeats)
    hostile(args.repeats)


if __name__ == "__main__":
    main()

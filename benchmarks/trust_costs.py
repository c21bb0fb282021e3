"""What the trust boundary costs, as ratios measured in one run (never asserted in a test).

- the marker sweep at the end of each attempt (every process's environment read from /proc),
  against the start of one trivial Python process, the least an attempt costs;
- a checkpoint read the safe way (link-refusing fd, ``weights_only=True``) against a plain
  ``torch.load(weights_only=False)`` of the same file, both computing the same step and digests;
- a read in the job's confinement (a fresh Python with torch: only for checkpoints that need a
  full unpickle) against the safe in-process read;
- redaction of 1 MB of text with 50 secrets (every 8-character window and its encodings).

    .venv/bin/python benchmarks/trust_costs.py --repeats 5
"""

from __future__ import annotations

import argparse
import random
import secrets
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from spotchaos.backends import SubprocessBackend
from spotchaos.host.processes import sweep as sweep_marked
from spotchaos.safety.redact import SecretMatcher
from spotchaos.training.state.checkpoint_reader import ConfinedLoader, Confinement, read_checkpoint
from spotchaos.training.state.confined.load_checkpoint import summarize


def timed(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    r = args.repeats

    python_start = timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), r)
    sweep = timed(lambda: sweep_marked("SPOTCHAOS_RUN_ID=benchmark-none"), r)
    print(f"marker sweep per attempt: {sweep * 1e3:.2f} ms = {sweep / python_start:.3f} x a bare Python start")

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        path = root / "ckpt.pt"
        state = {"step": 100, "model": {f"layer{i}.weight": torch.randn(256, 256) for i in range(8)}}
        torch.save(state, path)
        plain = timed(lambda: summarize(torch.load(path, map_location="cpu", weights_only=False), "step", "model"), r)
        safe = timed(lambda: read_checkpoint(path, "step", "model", root=root), r)
        size = path.stat().st_size / 1e6
        print(
            f"checkpoint read ({size:.1f} MB, step and digests): safe (link-refusing fd, weights_only) "
            f"{safe * 1e3:.1f} ms vs a plain full unpickle {plain * 1e3:.1f} ms = {safe / plain:.2f} x"
        )
        where = Confinement(env=dict(__import__("os").environ), cwd=root, writable=(root,))
        loader = ConfinedLoader(SubprocessBackend(), where, root)
        confined = timed(lambda: loader(path, "step", "model"), max(1, r // 2))
        print(f"confined read: {confined:.2f} s = {confined / safe:.0f} x the safe in-process read")

    keys = [secrets.token_urlsafe(30) for _ in range(50)]
    text = "".join(random.choice(string.ascii_letters + " \n") for _ in range(1_000_000))
    matcher = SecretMatcher(keys)
    redaction = timed(lambda: matcher.redact_text(text), r)
    print(f"redaction: {1 / redaction:.1f} MB/s with 50 secrets ({sum(map(len, matcher.windows.values()))} windows)")


if __name__ == "__main__":
    main()

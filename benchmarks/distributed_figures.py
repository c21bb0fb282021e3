"""Multi-rank figures, measured in one run: per world size (2, 3, 4 ranks of the reference
distributed trainer under torchrun, gloo on CPU), whether two uninterrupted runs agree bit for
bit, whether a preempt-and-resume is bit-exact, and the preempt-and-resume cycle divided by an
uninterrupted run. Also resharding 4 -> 2 and 4 -> 3.

    .venv/bin/python benchmarks/distributed_figures.py [--worlds 2,3,4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spotchaos import Session  # noqa: E402
from spotchaos.config.jobs import load_settings  # noqa: E402
from spotchaos.errors import ScenarioFailure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,3,4")
    args = parser.parse_args()
    worlds = tuple(int(w) for w in args.worlds.split(","))
    job = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == "ddp")
    with tempfile.TemporaryDirectory() as work, Session(ROOT, workdir=Path(work)) as session:
        started = time.monotonic()
        rows = session.determinism_baseline(job, worlds)
        for row in rows:
            print(
                f"{row['world']} ranks: uninterrupted {row['uninterrupted_seconds']:.1f} s, repeatable "
                f"{row['repeatable']}, preempt-and-resume bit-exact {row['resume_bit_exact']}, cycle "
                f"{row['cycle_seconds']:.1f} s = {row['cycle_ratio']:.2f}x an uninterrupted run"
            )
        for resume in (2, 3):
            try:
                figures = session.check_reshard(replace(job, nproc_per_node=4), resume)
                print(f"reshard 4 -> {resume}: passed, resumed after step {figures['resumed_from']}")
            except ScenarioFailure as failure:
                print(f"reshard 4 -> {resume}: FAILED\n{failure}")
        print(json.dumps({"rows": rows, "seconds": round(time.monotonic() - started, 1)}, indent=1))


if __name__ == "__main__":
    main()

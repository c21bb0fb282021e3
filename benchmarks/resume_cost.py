"""What one preemption costs: wall time of a preempt-and-resume run divided by an uninterrupted
run of the same job, measured in this one process (ratios, never absolute thresholds).

    python benchmarks/resume_cost.py [--repeats 5] [--steps 24]

Prints, for each preemption kind, the median wall time, the ratio to the uninterrupted run,
the median restart latency (process start to first event) and the steps recomputed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from spotchaos.config.jobs import JobSpec
from spotchaos.faults.plan import Plan
from spotchaos.training.engine.run import EngineOptions, run_job
from spotchaos.training.verdict import judge

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args()
    command = (
        "python",
        "fixtures/reference_trainer.py",
        "--steps",
        str(args.steps),
        "--num-workers",
        str(args.num_workers),
    )
    job = JobSpec(name="reference", command=command, grace_seconds=30)
    middle = args.steps // 2
    plans = {
        "uninterrupted": "",
        "sigterm": f"sigterm@{middle}",
        "sigterm-group": f"sigterm-group@{middle}",
        "sigkill": f"sigkill@{middle}",
    }
    work = Path(tempfile.mkdtemp(prefix="spotchaos-bench-"))
    results: dict[str, list] = {name: [] for name in plans}
    try:
        counter = 0
        reference = None
        for _ in range(args.repeats):
            for name, plan in plans.items():  # interleaved, so drift hits every kind alike
                counter += 1
                record = run_job(job, Plan.parse(plan), work / str(counter), EngineOptions(root=ROOT))
                reference = reference or record
                verdict = judge(reference, record)
                assert verdict.passed, verdict.message()
                restart = [a.start_seconds for a in record.attempts[1:]]
                results[name].append((record.wall_seconds, restart, verdict.lost_steps))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(w for w, _, _ in results["uninterrupted"])
    print(f"job: {' '.join(command)} (median of {args.repeats}, preempted at step {middle})")
    print(f"{'plan':15} {'wall s':>8} {'ratio':>7} {'restart s':>10} {'lost steps':>11}")
    for name, rows in results.items():
        wall = statistics.median(w for w, _, _ in rows)
        restarts = [r for _, rs, _ in rows for r in rs if r is not None]
        restart = f"{statistics.median(restarts):.2f}" if restarts else "-"
        lost = statistics.median(lost for _, _, lost in rows)
        print(f"{name:15} {wall:8.2f} {wall / base:7.2f} {restart:>10} {lost:11.0f}")


if __name__ == "__main__":
    main()

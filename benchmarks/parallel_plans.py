"""Plans in parallel, measured in one run: the same search (the same seed, so the same plans) on
the bundled reference trainer one plan at a time and N at a time, its wall time and the parallel
efficiency (serial wall / (N x parallel wall)). Both searches must record the same plans with the
same verdicts, or the figures mean nothing: it says so and exits 1.

    .venv/bin/python benchmarks/parallel_plans.py [--plans 8] [--parallel 2,4] [--job reference]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spotchaos import Session  # noqa: E402
from spotchaos.config.jobs import load_settings  # noqa: E402
from spotchaos.record import ScenarioRecord  # noqa: E402
from spotchaos.search import ExploreSettings, explore  # noqa: E402
from spotchaos.strategies import preemption_plans  # noqa: E402


def search(session: Session, job, plans: int, parallel: int) -> tuple[float, list[tuple[str, bool]], dict]:
    record = ScenarioRecord(scenario="benchmark", job=job.name, seed=11)
    started = time.monotonic()
    with record:
        explore(
            session,
            job,
            lambda steps: preemption_plans(steps, max_preemptions=2),
            settings=ExploreSettings(max_examples=plans, seed=11, parallel=parallel),
        )
    runs = [(r["plan"], r["passed"]) for r in record.runs]
    return time.monotonic() - started, runs, record.figures.get("parallel", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=8)
    parser.add_argument("--parallel", default="2,4")
    parser.add_argument("--job", default="reference")
    args = parser.parse_args()
    job = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == args.job)
    rows = []
    with tempfile.TemporaryDirectory() as work, Session(ROOT, workdir=Path(work)) as session:
        session.reference(job)  # computed once, outside every timing
        serial, serial_runs, _ = search(session, job, args.plans, 1)
        print(f"{args.job}: {len(serial_runs)} plans one at a time: {serial:.1f} s ({os.cpu_count()} CPUs)")
        for n in (int(p) for p in args.parallel.split(",")):
            wall, runs, figures = search(session, job, args.plans, n)
            same = runs == serial_runs
            efficiency = serial / (n * wall)
            print(
                f"  {n} at a time: {wall:.1f} s, speed-up {serial / wall:.2f}x, parallel efficiency {efficiency:.2f}, "
                f"at most {figures.get('max_concurrent')} running at once; same plans and verdicts: {same}"
            )
            rows.append({"parallel": n, "seconds": round(wall, 2), "speedup": round(serial / wall, 2),
                         "efficiency": round(efficiency, 2), "same_plans_and_verdicts": same, **figures})  # fmt: skip
            if not same:
                print(f"    serial:   {serial_runs}\n    parallel: {runs}")
    print(json.dumps({"job": args.job, "plans": len(serial_runs), "serial_seconds": round(serial, 2), "rows": rows}))
    sys.exit(0 if all(r["same_plans_and_verdicts"] for r in rows) else 1)


if __name__ == "__main__":
    main()

"""The Ray backend against the subprocess backend, measured in one run: the same search (same seed,
so the same plans) on the reference trainer as a subprocess one plan at a time, on a local Ray
cluster of 1 worker node (one at a time) and of N (N at a time, one per node: ``--nodes 1 2 3``),
the wall time of each and the parallel efficiency of N nodes (1-node wall / (N x N-node wall)); and
the per-attempt overhead of Ray: an uninterrupted run's wall time on a Ray node against a subprocess
(median of ``--repeats``). Every search must record the same plans with the same verdicts, or the
figures mean nothing: it says so and exits 1.

    .venv/bin/python benchmarks/ray_backend.py [--plans 6] [--repeats 3] [--nodes 1 2 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.parallel_plans import search  # noqa: E402  (the same search, the same seed)
from spotchaos import Session  # noqa: E402
from spotchaos.backends.raycluster import LocalRayCluster  # noqa: E402
from spotchaos.config.jobs import load_settings  # noqa: E402
from spotchaos.faults.plan import Plan  # noqa: E402


def uninterrupted(session: Session, job, repeats: int) -> float:
    walls = [session.run_once(job, Plan(()), f"bench-{i}").wall_seconds for i in range(repeats)]
    return statistics.median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3], help="worker-node counts (1 first)")
    args = parser.parse_args()
    if args.nodes[0] != 1:
        parser.error("--nodes: start with 1, the serial search every efficiency is measured against")
    job = next(j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == "reference")
    on_ray = replace(job, name="reference-ray", backend="ray")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as work:
        with Session(ROOT, workdir=Path(work) / "subprocess") as session:
            session.reference(job)  # computed once, outside every timing
            base = uninterrupted(session, job, args.repeats)
            wall, runs, _ = search(session, job, args.plans, 1)
            rows["subprocess"] = {"seconds": round(wall, 2), "attempt_seconds": round(base, 2), "runs": runs}
        for workers in args.nodes:
            started = time.monotonic()
            with LocalRayCluster(workers=workers) as cluster, Session(ROOT, workdir=Path(work) / f"ray{workers}") as s:
                up = time.monotonic() - started
                s.use_ray_cluster(cluster)
                s.reference(on_ray)
                attempt = uninterrupted(s, on_ray, args.repeats) if workers == 1 else None
                wall, runs, _ = search(s, on_ray, args.plans, workers)
                row = {"seconds": round(wall, 2), "cluster_start_seconds": round(up, 2), "runs": runs}
                rows[f"ray-{workers}"] = {**row, "replacement_nodes": cluster.replaced}
                if attempt is not None:
                    rows[f"ray-{workers}"]["attempt_seconds"] = round(attempt, 2)
    same = all(row["runs"] == rows["subprocess"]["runs"] for row in rows.values())
    sub, one = rows["subprocess"], rows["ray-1"]
    print(f"{len(sub['runs'])} plans ({os.cpu_count()} CPUs); same plans and verdicts everywhere: {same}")
    print(f"  subprocess, one at a time:   {sub['seconds']:.1f} s")
    print(
        f"  Ray, 1 worker node:          {one['seconds']:.1f} s ({one['seconds'] / sub['seconds']:.2f}x the subprocess)"
    )
    efficiencies = {}
    for workers in args.nodes[1:]:
        row = rows[f"ray-{workers}"]
        efficiencies[f"efficiency_{workers}_nodes"] = round(one["seconds"] / (workers * row["seconds"]), 2)
        print(f"  Ray, {workers} worker nodes, {workers} at once: {row['seconds']:.1f} s (speed-up "
              f"{one['seconds'] / row['seconds']:.2f}x over 1 node, parallel efficiency "
              f"{efficiencies[f'efficiency_{workers}_nodes']:.2f})")  # fmt: skip
    overhead = one["attempt_seconds"] / sub["attempt_seconds"]
    print(f"  an uninterrupted attempt: {sub['attempt_seconds']:.2f} s as a subprocess, {one['attempt_seconds']:.2f} s "
          f"on a Ray node ({overhead:.2f}x; cluster start {one['cluster_start_seconds']:.1f} s, once)")  # fmt: skip
    for row in rows.values():
        row.pop("runs")
    print(json.dumps({"plans": args.plans, "same_plans_and_verdicts": same, **efficiencies,
                      "attempt_overhead_ratio": round(overhead, 2), **rows}))  # fmt: skip
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()

"""How often envelope mode calls a correct noisy job's own noise a failure, measured in one run.

The noisy fixture (fixtures/broken_nondeterministic.py: the reference trainer with a 1e-7 gradient
noise nothing seeds) is run ``--runs`` times uninterrupted. Every comparison envelope mode makes is
then replayed on those runs: an audit of ``n`` of them (the first the reference) gives the
tolerance, ``factor`` x the widest loss spread at any step, and every other run stands for a resumed
run, which is as good as a fresh one for the noise (the noise after a resume is a fresh draw). A
held-out run that strays beyond the tolerance at any step is a false alarm. Random draws of the
audit from the pool, for each (runs, factor) asked; the figure that matters for CI is the chance that
a search of ``--compared`` runs against one audit raises one.

    .venv/bin/python benchmarks/envelope_false_alarms.py [--runs 24] [--draws 4000] [--compared 10]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spotchaos import JobSpec, Session  # noqa: E402
from spotchaos.faults.plan import Plan  # noqa: E402
from spotchaos.training.determinism import as_number  # noqa: E402  (how the audit reads a loss)

SETTINGS = ((3, 4.0), (3, 6.0), (5, 4.0), (5, 6.0), (8, 4.0))


def losses(runs: int) -> list[list[float]]:
    job = JobSpec(
        name="noisy",
        command=(
            "python",
            str(ROOT / "fixtures/broken_nondeterministic.py"),
            "--steps",
            "16",
            "--checkpoint-every",
            "4",
        ),
    )
    with Session(ROOT) as session:
        records = [session.run_once(job, Plan(()), f"noise-{i}") for i in range(runs)]
    return [[as_number(step.loss) for step in record.steps] for record in records]


def needed_factors(pool: list[list[float]], runs: int, draws: int, compared: int, rng) -> list[list[float]]:
    """For each random audit of ``runs`` runs, the factor each of ``compared`` other runs needs to
    stay inside: its widest distance from the reference at any step over the audit's widest spread."""
    found = []
    for _ in range(draws):
        picked = rng.sample(range(len(pool)), runs + compared)
        audit = [pool[i] for i in picked[:runs]]
        spread = max(max(column) - min(column) for column in zip(*audit, strict=True))
        found.append([max(abs(a - b) for a, b in zip(audit[0], pool[i], strict=True)) / spread for i in picked[runs:]])
    return found


def rates(factors: list[list[float]], runs: int, factor: float) -> dict:
    strays = [[f > factor for f in search] for search in factors]
    flat = sorted(f for search in factors for f in search)
    return {
        "runs": runs,
        "factor": factor,
        "per_compared_run": sum(map(sum, strays)) / len(flat),
        "per_search": sum(map(any, strays)) / len(strays),
        "needed_factor_p99": flat[int(0.99 * (len(flat) - 1))],
        "needed_factor_max": flat[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24, help="uninterrupted runs of the noisy fixture")
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--compared", type=int, default=10, help="resumed runs a search compares with one audit")
    parser.add_argument("--pool", type=Path, help="a JSON file of the runs' losses: read if it exists, else written")
    args = parser.parse_args()
    if args.pool is not None and args.pool.exists():
        pool = json.loads(args.pool.read_text())
    else:
        pool = losses(args.runs)
        if args.pool is not None:
            args.pool.write_text(json.dumps(pool))
    spreads = [max(col) - min(col) for col in zip(*pool, strict=True)]
    rng = random.Random(0)
    factors = {n: needed_factors(pool, n, args.draws, args.compared, rng) for n in {n for n, _ in SETTINGS}}
    results = [rates(factors[n], n, f) for n, f in SETTINGS if n + args.compared <= len(pool)]
    print(json.dumps({"pool": len(pool), "widest_spread_of_the_pool": max(spreads), "results": results}, indent=2))


if __name__ == "__main__":
    main()

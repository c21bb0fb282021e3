"""The gate's catch rate and false-failure rate, measured in one run.

    python benchmarks/zoo.py [--seeds 20] [--examples 3]

(1) Every broken trainer of the zoo under the plan its test uses: caught, and with its expected
diagnosis? (2) The reference trainer under ``--seeds`` different hypothesis seeds, each exploring
``--examples`` plans of up to three preemptions with checkpoint damage: how many false failures?
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spotchaos.faults.plan import Plan  # noqa: E402
from spotchaos.session import ChaosFailure, ExploreSettings, Session  # noqa: E402
from spotchaos.strategies import damage_plans, preemption_plans  # noqa: E402
from tests.helpers import trainer_job  # noqa: E402
from tests.test_broken_trainers import CASES  # noqa: E402
from tests.test_checkpoint_faults import UNSAFE_WRITERS  # noqa: E402
from tests.test_log_adapter import plain_job  # noqa: E402


def caught(runner: Session, job, plan: str, pattern: str) -> tuple[bool, bool]:
    try:
        runner.check(job, Plan.parse(plan))
    except ChaosFailure as failure:
        return True, re.search(pattern, str(failure), re.S) is not None
    return False, False


def crash_caught(runner: Session, script: str, pattern: str) -> tuple[bool, bool]:
    job = trainer_job(script)
    for boundary in runner.save_boundaries(job):
        found = caught(runner, job, f"crash@{boundary['index']}", pattern)
        if found[0]:
            return found
    return False, False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--examples", type=int, default=3)
    args = parser.parse_args()
    runner = Session(ROOT, workdir=Path(tempfile.mkdtemp(prefix="spotchaos-zoo-")))
    started = time.monotonic()
    results = []
    try:
        for case in CASES:
            job, plan, pattern = case.values
            results.append((case.id, *caught(runner, job, plan, pattern)))
        for script, pattern in UNSAFE_WRITERS:
            results.append((script, *crash_caught(runner, script, pattern)))
        unverified = trainer_job("broken_unverified_load")
        results.append(
            ("broken_unverified_load", *caught(runner, unverified, "sigterm@9:flip-burst-data", "silent bad load"))
        )
        results.append(
            ("plain_train_no_rng", *caught(runner, plain_job("plain_train_no_rng"), "sigterm@8", r"the RNG state"))
        )
        for name, hit, diagnosed in results:
            verdict = "expected diagnosis" if diagnosed else "OTHER MESSAGE"
            print(f"  {name:32} {'caught' if hit else 'MISSED':7} {verdict}")
        print(
            f"zoo: {sum(h for _, h, _ in results)} of {len(results)} caught, "
            f"{sum(d for _, _, d in results)} with the expected diagnosis"
        )

        reference = trainer_job("reference_trainer")
        false_failures = []
        for seed in range(args.seeds):

            def plans(steps):
                # damage needs a durable checkpoint first: the job checkpoints after step 3
                return preemption_plans(steps, max_preemptions=3) | damage_plans(steps, min_step=4)

            try:
                runner.explore(reference, plans, settings=ExploreSettings(max_examples=args.examples, seed=seed))
            except ChaosFailure as failure:
                false_failures.append((seed, str(failure).splitlines()[0]))
        print(f"reference: {len(false_failures)} false failure(s) in {args.seeds} seeds x {args.examples} plans")
        for seed, line in false_failures:
            print(f"  seed {seed}: {line}")
    finally:
        runner.close()
    print(f"wall {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()

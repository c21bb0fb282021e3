"""The built-in gate's cost on a bundled job, measured as a user pays it: one `pytest --spotchaos`
session running the single-process built-in scenarios on the job, its report's `cost` read back
(runs, starts, steps trained, runs' worth, seconds of start-up, training and harness), per
scenario and for the job, and the session's own wall time. The figures of issue 37 are these,
before and after each mechanism that cuts them.

    .venv/bin/python benchmarks/gate_cost.py [--job reference] [--profile quick|standard] [--seed 1]
        [--warm on|off|both] [--prefix on|off|both] [--tails on|off|both] [--cache off|both]

``--warm both`` runs the session twice, every attempt cold and then warm starts on (the default),
and prints the paired ratios: the session's wall time, and start-up per start, cold and warm.
``--prefix both`` does the same for the reference's prefix (training/reference/prefix.py): every plan from
step 0, then searched plans from the reference's checkpoints (the default), and prints the paired
steps trained and runs' worth, with the steps credited instead. ``--tails both`` pairs a session that
trains every plan's last attempt with one where a plan ending on another plan's files takes its tail
(training/reference/tails.py), and prints the steps trained, runs' worth and wall. ``--cache both`` runs it twice on
one new reference cache (training/reference/cache.py): the first session trains the reference and
keeps it, the second reads it; every other figure here runs with the cache off, so a user's own
cache never changes what is measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spotchaos.report.gate_cost import runs_worth  # noqa: E402

BUILTIN = ("spotchaos.scenarios.test_preemption", "spotchaos.scenarios.test_checkpoint_damage")
BUDGETS = "spotchaos.scenarios.test_budgets"
RANKS = "spotchaos.scenarios.test_distributed"  # a multi-rank job's own: its ranks killed, hung, in a save


def builtin_modules(job: str) -> tuple[str, ...]:
    """The built-in scenario modules of ``job``'s gate: the distributed ones too for several ranks
    (the single-process crash points need one process: they are skipped on it, with the reason)."""
    from spotchaos.config.jobs import load_settings

    spec = next((j for j in load_settings(ROOT / "pyproject.toml").jobs if j.name == job), None)
    return (*BUILTIN, RANKS) if spec is not None and spec.world_size > 1 else BUILTIN


def measure(
    job: str,
    profile: str,
    seed: int,
    budgets: bool,
    warm: str = "on",
    prefix: str = "on",
    cache: str = "off",
    tails: str = "on",
) -> tuple[dict, float, int]:
    """(the report, the session's wall seconds, pytest's exit status)."""
    with tempfile.TemporaryDirectory(prefix="gate-cost-") as out:
        command = [
            sys.executable,
            "-m",
            "pytest",
            "--spotchaos",
            f"--spotchaos-job={job}",
            f"--spotchaos-profile={profile}",
            f"--spotchaos-seed={seed}",
            f"--spotchaos-output={out}",
            f"--spotchaos-warm={warm}",
            f"--spotchaos-prefix={prefix}",
            f"--spotchaos-tails={tails}",
            f"--spotchaos-reference-cache={cache}",
            "-p",
            "no:cacheprovider",
            "-q",
            "--pyargs",
            *builtin_modules(job),
            *((BUDGETS,) if budgets else ()),
        ]
        started = time.monotonic()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        report = Path(out) / "report.json"
        if not report.exists():
            sys.exit(f"no report: pytest exited {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
        if done.returncode:  # the figures of a failing gate are still figures; say what failed
            print(*(line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))), sep="\n")
        return json.loads(report.read_text()), wall, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="reference")
    parser.add_argument("--profile", default="quick", choices=("quick", "standard", "thorough"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warm", default="on", choices=("on", "off", "both"))
    parser.add_argument("--prefix", default="on", choices=("on", "off", "both"))
    parser.add_argument("--tails", default="on", choices=("on", "off", "both"))
    parser.add_argument("--cache", default="off", choices=("off", "both"))
    parser.add_argument("--no-budgets", action="store_true", help="leave the two budget scenarios out")
    args = parser.parse_args()
    if [args.warm, args.prefix, args.tails, args.cache].count("both") > 1:
        parser.error("pair one mechanism at a time: --warm both, --prefix both, --tails both or --cache both")
    if args.cache == "both":
        sys.exit(paired_cache(args))
    totals, failed = {}, False
    paired = "warm" if args.warm == "both" else "prefix" if args.prefix == "both" else "tails"
    both = ("off", "on") if "both" in (args.warm, args.prefix, args.tails) else (None,)
    for value in both:
        chosen = {"warm": args.warm, "prefix": args.prefix, "tails": args.tails}
        if value is not None:
            chosen[paired] = value
        document, wall, status = measure(
            args.job,
            args.profile,
            args.seed,
            not args.no_budgets,
            chosen["warm"],
            chosen["prefix"],
            tails=chosen["tails"],
        )
        head = f"job {args.job}, profile {args.profile}, seed {args.seed}, " + ", ".join(
            f"{k} {v}" for k, v in chosen.items()
        )
        print(f"{head}: pytest exit {status}, {wall:.0f} s")
        total = show(document, args.job)
        totals[chosen[paired]] = (total, wall)
        failed = failed or status != 0
    if args.tails == "both":
        print(paired_steps(totals, "with tails", "tail", "runs' tails"))
        sys.exit(1 if failed else 0)
    if args.prefix == "both":
        print(paired_steps(totals, "with the prefix", "prefix", "runs"))
        sys.exit(1 if failed else 0)
    if len(totals) == 2:
        (cold, cold_wall), (warm, warm_wall) = totals["off"], totals["on"]
        print(
            f"paired: wall {warm_wall:.0f} s warm / {cold_wall:.0f} s cold = {warm_wall / cold_wall:.2f}; start-up "
            f"{warm['startup_seconds']:.0f} s / {cold['startup_seconds']:.0f} s = "
            f"{warm['startup_seconds'] / max(cold['startup_seconds'], 1e-9):.2f}; a warm start "
            f"{_per_start(warm, warm=True):.2f} s, a cold one {_per_start(cold, warm=False):.2f} s"
        )
    sys.exit(1 if failed else 0)


def paired_steps(totals: dict, with_it: str, credit: str, runs: str) -> str:
    """The paired line of a mechanism that credits steps instead of training them (the prefix, the
    tails): steps trained with it and without, what it credited, runs' worth and wall."""
    (full, full_wall), (shared, shared_wall) = totals["off"], totals["on"]
    return (
        f"paired: steps trained {shared['steps']} {with_it} / {full['steps']} without = "
        f"{shared['steps'] / max(full['steps'], 1):.2f} ({shared.get(f'{credit}_steps', 0)} credited in "
        f"{shared.get(f'{credit}_runs', 0)} {runs}); runs' worth {shared['runs_worth']} / {full['runs_worth']}; "
        f"wall {shared_wall:.0f} s / {full_wall:.0f} s = {shared_wall / full_wall:.2f}"
    )


def paired_cache(args: argparse.Namespace) -> int:
    """Two sessions on one new reference cache: the first keeps the reference, the second reads it."""
    measured = []
    with tempfile.TemporaryDirectory(prefix="gate-cost-cache-") as folder:
        for session in ("first (trains and keeps the reference)", "second (reads it)"):
            document, wall, status = measure(
                args.job, args.profile, args.seed, not args.no_budgets, args.warm, args.prefix, folder
            )
            head = f"job {args.job}, profile {args.profile}, seed {args.seed}, {session}"
            print(f"{head}: pytest exit {status}, {wall:.0f} s")
            measured.append((show(document, args.job), wall, status))
    (first, first_wall, _), (second, second_wall, _) = measured
    print(
        f"paired: runs {second['runs']} / {first['runs']}, steps trained {second['steps']} / {first['steps']}, "
        f"references read from the cache {second.get('cached_references', 0)} / {first.get('cached_references', 0)}; "
        f"wall {second_wall:.0f} s / {first_wall:.0f} s = {second_wall / first_wall:.2f}"
    )
    return 1 if any(status != 0 for *_, status in measured) else 0


def _per_start(total: dict, *, warm: bool) -> float:
    """Seconds from launch to the first event, per warm (or per cold) start."""
    count = total.get("warm_starts", 0) if warm else total["starts"] - total.get("warm_starts", 0)
    seconds = total.get("warm_startup_seconds", 0.0)
    seconds = seconds if warm else total["startup_seconds"] - seconds
    return seconds / count if count else float("nan")


def credited(total: dict) -> str:
    """``; 24 credited from the reference's checkpoints in 2 runs``, and from other plans' tails, where any were."""
    said = ""
    if total.get("prefix_steps"):
        said += (
            f"; {total['prefix_steps']} credited from the reference's checkpoints in {total.get('prefix_runs', 0)} runs"
        )
    if total.get("tail_steps"):
        said += f"; {total['tail_steps']} credited from other plans' tails in {total.get('tail_runs', 0)} runs"
    return said


def show(document: dict, job: str) -> dict:
    """Print the cost per scenario and the job's total; the total."""
    columns = f"{'runs':>4} {'starts':>6} {'warm':>4} {'steps':>5} {'worth':>6} {'start-up':>8} {'train':>6}"
    print(f"{'scenario':78} {columns}")
    for scenario in document["scenarios"]:
        cost = scenario.get("cost") or {}
        worth = runs_worth(cost) if cost.get("runs") else None
        worth = "-" if worth is None else f"{worth:.1f}"
        print(
            f"{scenario['scenario'][-78:]:78} {cost.get('runs', 0):>4} {cost.get('starts', 0):>6} "
            f"{cost.get('warm_starts', 0):>4} {cost.get('steps', 0):>5} {worth:>6} "
            f"{cost.get('startup_seconds', 0):>7.0f}s {cost.get('training_seconds', 0):>5.0f}s"
        )
    total = document["cost"].get(job)
    if total is None:
        sys.exit("the report has no cost for the job")
    share = total["startup_seconds"] / max(1e-9, total["startup_seconds"] + total["training_seconds"])
    print(
        f"total: {total['runs_worth']} runs' worth ({total['steps']} steps of a {total['reference_steps']}-step job"
        f"{credited(total)}), "
        f"{total['runs']} runs, {total['starts']} starts ({total.get('warm_starts', 0)} warm), "
        f"{total['startup_seconds']:.0f} s start-up ({share:.0%} of the job's time), "
        f"{total['training_seconds']:.0f} s training, {total['harness_seconds']:.0f} s harness"
        + (f", {total['gpu_seconds']:.0f} GPU-seconds" if total.get("gpu_seconds") else "")
    )
    if total.get("cold_because"):
        print("cold because: " + "; ".join(f"{why} ({n})" for why, n in total["cold_because"].items()))
    return total


if __name__ == "__main__":
    main()

"""Where faults land on a job with ~1 ms steps, with a CPU hog beside it: held, and (for contrast)
delivered reactively. Measured in one run, never asserted in a test.

For each kind of job (the probe: the reference trainer; the log adapter: the sidecar script, an
unmodified script whose step lines the in-process hook watches), N seeded random plans of one or
two faults (sigkill, sigterm, a cloud notice) run on the correct job while one busy process per
CPU competes with it and with the harness. Reported per job: faults that landed exactly at their
planned step, steps late at most, verdicts that failed (false alarms: the jobs are correct), and
the hold's cost as a ratio of the job's wall time (the time held jobs waited, from the planned
step's report until the release, over the attempts' wall time). ``--reactive N`` runs N more plans
with the hold switched off, to show what it fixes. Last, the cost of an armed hold at every other
step (one comparison in ``Probe.step``), against a 1 ms step.

    .venv/bin/python benchmarks/fault_landing.py --plans 100 --reactive 20
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spotchaos.config.jobs import JobSpec  # noqa: E402
from spotchaos.faults.plan import Plan, Preemption  # noqa: E402
from spotchaos.session import Session  # noqa: E402
from spotchaos.training.engine import attempt as engine  # noqa: E402  (the module that arms the hold)
from tests.test_script_conventions import sidecar_job  # noqa: E402

STEPS = 30
FAULTS = ("sigkill", "sigterm", "aws-notice")


def probe_job() -> JobSpec:
    command = (
        "python", str(ROOT / "fixtures/reference_trainer.py"), "--steps", str(STEPS), "--checkpoint-every", "5",
        "--step-seconds", "0.001",
    )  # fmt: skip
    return JobSpec(name="probe-1ms", command=command, grace_seconds=10)


def log_job() -> JobSpec:
    base = sidecar_job()
    command = (*base.command[:-1], str(STEPS), "--save-every", "5", "--step-seconds", "0.001")
    return replace(base, name="log-1ms", command=command)


def plans(count: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        steps = sorted(rng.sample(range(STEPS - 1), rng.choice((1, 2))))
        out.append(Plan(tuple(Preemption(s, rng.choice(FAULTS)) for s in steps)))
    return out


def hog(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def measure(runner: Session, job: JobSpec, planned: list[Plan]) -> dict:
    exact = late = failed = 0
    worst = 0
    held_seconds = wall_seconds = 0.0
    for plan in planned:
        run, verdict = runner.run(job, plan)
        failed += not verdict.passed
        for attempt in run.attempts:
            wall_seconds += attempt.wall_seconds
            fault = attempt.fault
            if fault is None or fault.steps_late is None:
                continue
            exact += fault.steps_late == 0
            late += fault.steps_late > 0
            worst = max(worst, fault.steps_late)
            held_seconds += fault.held_seconds or 0.0
        missed = len(run.unfired)
        late += missed  # a fault that never fired landed nowhere
    return {
        "plans": len(planned),
        "faults exact": exact,
        "faults late": late,
        "most steps late": worst,
        "verdicts failed": failed,
        "held / wall": held_seconds / wall_seconds if wall_seconds else 0.0,
    }


def armed_step_cost(calls: int = 200_000) -> tuple[float, float]:
    """Seconds per Probe.step without a hold and with one armed at a step never reached."""
    from spotchaos.probe import Probe, StepHold

    with tempfile.TemporaryDirectory() as folder:
        probe = Probe(os.path.join(folder, "events.jsonl"))
        timings = []
        for hold in (None, StepHold(10**12, folder, 1.0)):
            probe._hold = hold
            started = time.perf_counter()
            for step in range(calls):
                probe.step(step, 0.5)
            timings.append((time.perf_counter() - started) / calls)
        probe.close()
    return timings[0], timings[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plans", type=int, default=100)
    parser.add_argument("--reactive", type=int, default=20, help="plans with the hold switched off, for contrast")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=hog, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
    for process in hogs:
        process.start()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as work:
            runner = Session(ROOT, workdir=Path(work))
            for job in (probe_job(), log_job()):
                started = time.monotonic()
                row = measure(runner, job, plans(args.plans, args.seed))
                rows.append((job.name, "held", row, time.monotonic() - started))
            armed = engine._arm_hold
            engine._arm_hold = lambda *a, **k: None  # the hold switched off: delivery as before it
            try:
                for job in (probe_job(), log_job()):
                    if args.reactive:
                        started = time.monotonic()
                        row = measure(runner, job, plans(args.reactive, args.seed))
                        rows.append((job.name, "reactive", row, time.monotonic() - started))
            finally:
                engine._arm_hold = armed
    finally:
        stop.set()
        for process in hogs:
            process.join(5)
    print(f"CPU hog: {len(hogs)} busy processes on {os.cpu_count()} CPUs; {STEPS} steps of ~1 ms per run")
    for name, mode, row, seconds in rows:
        figures = ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
        print(f"{name:10} {mode:8}: {figures} ({seconds:.0f} s)")
    bare, armed_cost = armed_step_cost()
    print(
        f"Probe.step: {bare * 1e6:.2f} us without a hold, {armed_cost * 1e6:.2f} us with one armed for a later "
        f"step: {(armed_cost - bare) / 1e-3:.2e} of a 1 ms step"
    )


if __name__ == "__main__":
    main()

"""False alarms under load: the built-in scenarios on the bundled correct jobs, on every
backend (a local subprocess, a Docker container, a Ray node), beside two CPU hogs per core. A
correct job must pass every scenario however loaded the machine: each failure here is a false
alarm, counted and printed with its message.

    spotchaos test-image && .venv/bin/python benchmarks/under_load.py [--seeds 1] [--first-seed 1]
        [--hogs-per-core 2] [--backends subprocess,docker,ray] [--profile quick]
        [--scenarios preemption,damage,budgets]

Each backend runs one `pytest --spotchaos` session per seed (its reference trained in the session,
no reference cache), the hogs running the whole time (`python -c 'while True: pass'`, the same
priority as the sessions). The machine's load average is sampled every 5 s. Prints, per backend and
seed: scenarios passed and failed, the session's wall time, the load it ran under; then the false
alarms in all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = {  # the built-in scenario modules, by a short name
    "preemption": "spotchaos.scenarios.test_preemption",
    "damage": "spotchaos.scenarios.test_checkpoint_damage",
    "budgets": "spotchaos.scenarios.test_budgets",
}
# the bundled correct job each backend runs (docker: the reference trainer in the test image)
JOBS = {"subprocess": ("reference", ()), "docker": ("reference", ("--spotchaos-image=spotchaos-test",)),
        "ray": ("reference-ray", ())}  # fmt: skip


@contextlib.contextmanager
def hogs(count: int) -> Iterator[list[subprocess.Popen]]:
    """``count`` busy loops, ended (and reaped) on leaving, whatever happened."""
    started = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL) for _ in range(count)
    ]
    try:
        yield started
    finally:
        for hog in started:
            hog.kill()
        for hog in started:
            hog.wait()


class LoadSampler(threading.Thread):
    """The 1-minute load average every 5 s, while a session runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(5):
            self.samples.append(os.getloadavg()[0])


def session(backend: str, seed: int, profile: str, modules: list[str]) -> tuple[dict, float, int, str]:
    """One `pytest --spotchaos` session of the built-in scenarios on the backend's job."""
    job, extra = JOBS[backend]
    with tempfile.TemporaryDirectory(prefix="under-load-") as out:
        command = [
            sys.executable, "-m", "pytest", "--spotchaos", f"--spotchaos-job={job}",
            f"--spotchaos-profile={profile}", f"--spotchaos-seed={seed}", f"--spotchaos-output={out}",
            "--spotchaos-reference-cache=off", "--spotchaos-require-docker", "-p", "no:cacheprovider", "-q",
            *extra, "--pyargs", *modules,
        ]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        report = Path(out) / "report.json"
        document = json.loads(report.read_text()) if report.exists() else {"scenarios": []}
        return document, wall, done.returncode, (done.stdout[-3000:] + done.stderr[-1500:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--hogs-per-core", type=int, default=2)
    parser.add_argument("--backends", default="subprocess,docker,ray")
    parser.add_argument("--profile", default="quick", choices=("quick", "standard"))
    parser.add_argument("--scenarios", default="preemption,damage,budgets", help=f"of {', '.join(SCENARIOS)}")
    parser.add_argument("--first-seed", type=int, default=1)
    args = parser.parse_args()
    names = [name for name in args.scenarios.split(",") if name]
    if not names or any(name not in SCENARIOS for name in names):
        parser.error(f"--scenarios: a comma-separated list of {', '.join(SCENARIOS)}, got {args.scenarios!r}")
    modules = [SCENARIOS[name] for name in names]
    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in JOBS]
    if unknown:
        parser.error(f"unknown backends {unknown}: choose from {', '.join(JOBS)}")
    count = args.hogs_per_core * (os.cpu_count() or 1)
    alarms: list[str] = []
    ran = 0
    print(f"{count} CPU hogs on {os.cpu_count()} cores; profile {args.profile}")
    with hogs(count):
        time.sleep(5)  # the load builds up before the first session
        for backend in backends:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                sampler = LoadSampler()
                sampler.start()
                document, wall, status, tail = session(backend, seed, args.profile, modules)
                sampler.done.set()
                scenarios = document["scenarios"]
                failed = [s for s in scenarios if not s.get("passed")]
                ran += len(scenarios)
                load = max(sampler.samples, default=os.getloadavg()[0])
                print(
                    f"{backend:10} seed {seed}: {len(scenarios) - len(failed)} passed, {len(failed)} failed, "
                    f"pytest exit {status}, {wall:.0f} s, load up to {load:.1f}"
                )
                for scenario in failed:
                    said = (scenario.get("verdict") or {}).get("failures") or [scenario.get("error")]
                    alarms.append(f"{backend} seed {seed} {scenario['scenario']}: {said}")
                if not scenarios:
                    alarms.append(f"{backend} seed {seed}: no report (pytest exit {status})\n{tail}")
    print(f"false alarms: {len(alarms)} of {ran} scenarios")
    for alarm in alarms:
        print(f"  {alarm}")
    return 1 if alarms else 0


if __name__ == "__main__":
    sys.exit(main())

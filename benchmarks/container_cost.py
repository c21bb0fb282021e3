"""What a container adds to a preemption: one preempt-and-resume cycle (SIGTERM half-way, then a
restart that resumes) in a Docker container divided by the same cycle as a local subprocess,
both measured in this one process, interleaved (ratios, never absolute thresholds).

    spotchaos test-image && python benchmarks/container_cost.py [--repeats 5] [--num-workers 2]

Needs a Docker daemon and the test image; prints the median wall time of each backend, the
ratio, and the median restart latency (launch to first event) of each.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from spotchaos.backends.docker import DockerBackend, DockerSession
from spotchaos.backends.testimage import IMAGE
from spotchaos.config.container import ContainerSpec
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
    parser.add_argument("--image", default=IMAGE)
    args = parser.parse_args()
    command = ("python", "fixtures/reference_trainer.py", "--steps", str(args.steps))
    command += ("--num-workers", str(args.num_workers))
    local = JobSpec(name="local", command=command, grace_seconds=30)
    boxed = replace(local, name="container", container=ContainerSpec(image=args.image))
    session = DockerSession()
    backends = {"subprocess": (local, None), "docker": (boxed, DockerBackend(session, boxed.container))}
    plan = Plan.parse(f"sigterm@{args.steps // 2}")
    work = Path(tempfile.mkdtemp(prefix="spotchaos-bench-"))
    walls: dict[str, list[float]] = {name: [] for name in backends}
    restarts: dict[str, list[float]] = {name: [] for name in backends}
    try:
        references = {}
        counter = 0
        for _ in range(args.repeats):
            for name, (job, backend) in backends.items():  # interleaved: drift hits both alike
                counter += 1
                options = EngineOptions(root=ROOT, backend=backend)
                if name not in references:
                    references[name] = run_job(job, Plan(), work / f"ref-{name}", options)
                record = run_job(job, plan, work / str(counter), options)
                verdict = judge(references[name], record)
                assert verdict.passed, verdict.message()
                walls[name].append(record.wall_seconds)
                restarts[name].append(record.attempts[1].start_seconds or 0.0)
    finally:
        session.close()
        shutil.rmtree(work, ignore_errors=True)
    sub, box = statistics.median(walls["subprocess"]), statistics.median(walls["docker"])
    print(f"{args.repeats} preempt-and-resume cycles each, {args.steps} steps, num_workers {args.num_workers}")
    for name in backends:
        print(
            f"  {name:10}  median wall {statistics.median(walls[name]):6.2f} s   "
            f"median restart latency {statistics.median(restarts[name]):5.2f} s"
        )
    print(f"container / subprocess: {box / sub:.2f}")


if __name__ == "__main__":
    main()

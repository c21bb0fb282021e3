"""The harness's own costs, as ratios measured in this one run (never asserted in tests).

    python benchmarks/harness_figures.py [--repeats 5]

(a) per-test overhead of the plugin when --spotchaos is off (goal: under 50 ms per test);
(b) one preempt-and-resume run / (one uninterrupted run + one cold start of the trainer)
    (goal: at most 1.15);
(c) the reference trainer's checkpoint write throughput / a raw sequential write of the same
    bytes with fsync, to the same directory (goal: at least 0.7);
(d) spread of the overhead measurement across repeated runs (goal: under 2 %).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spotchaos.config import JobSpec
from spotchaos.engine import EngineOptions, run_job
from spotchaos.overhead import measure_overhead
from spotchaos.plan import Plan

ROOT = Path(__file__).resolve().parent.parent
TRAINER = ("python", "fixtures/reference_trainer.py")
DEFAULT_JOB = (*TRAINER, "--steps", "24", "--checkpoint-every", "6", "--step-seconds", "0.06")


def run(job: JobSpec, plan: str, work: Path):
    return run_job(job, Plan.parse(plan), work / f"{time.monotonic_ns()}", EngineOptions(root=ROOT))


def plugin_overhead(work: Path, repeats: int, tests: int = 300) -> float:
    """(a) seconds per test added by the plugin being installed but off."""
    project = work / "plugin-overhead"
    project.mkdir()
    body = "\n".join(f"def test_{i}():\n    assert {i} == {i}\n" for i in range(tests))
    (project / "test_many.py").write_text(body)
    (project / "pytest.ini").write_text("[pytest]\n")
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark", "-p", "no:hypothesis"]
    timings: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(repeats):
        for label, extra in (("on", []), ("off", ["-p", "no:spotchaos"])):
            started = time.perf_counter()
            subprocess.run([*base, *extra], cwd=project, check=True, capture_output=True)
            timings[label].append(time.perf_counter() - started)
    return (statistics.median(timings["on"]) - statistics.median(timings["off"])) / tests


def resume_ratio(work: Path, repeats: int) -> tuple[float, float, float, float]:
    """(b) median wall of sigterm@11 / (median uninterrupted wall + median cold start)."""
    job = JobSpec(name="ref", command=DEFAULT_JOB)
    plain, preempted, cold = [], [], []
    for _ in range(repeats):
        a = run(job, "", work)
        b = run(job, "sigterm@11", work)
        plain.append(a.wall_seconds)
        preempted.append(b.wall_seconds)
        cold.append(a.attempts[0].ready_seconds or 0.0)
    p, q, c = statistics.median(plain), statistics.median(preempted), statistics.median(cold)
    return q / (p + c), p, q, c


def checkpoint_throughput(work: Path, repeats: int) -> tuple[float, float, float, int]:
    """(c) checkpoint bytes/s of the trainer over raw write+fsync bytes/s of as many bytes."""
    job = JobSpec(name="big", command=(*TRAINER, "--steps", "12", "--checkpoint-every", "2", "--hidden", "1024"))
    ckpt_rates, raw_rates, size = [], [], 0
    for _ in range(repeats):
        record = run(job, "", work)
        events = record.attempts[0].of_kind("checkpoint")[1:]  # first one is warm-up
        ckpt_rates += [e["bytes"] / e["seconds"] for e in events]
        size = events[0]["bytes"]
        target = Path(record.workdir) / "checkpoints" / "raw.bin"  # the same directory
        payload = os.urandom(size)
        for _ in events:
            started = time.perf_counter()
            with open(target, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            raw_rates.append(size / (time.perf_counter() - started))
            target.unlink()
        shutil.rmtree(record.workdir)
    ckpt, raw = statistics.median(ckpt_rates), statistics.median(raw_rates)
    return ckpt / raw, ckpt, raw, size


def checkpoint_phases(work: Path, saves: int = 12) -> tuple[dict[str, float], float, int]:
    """Where (c)'s time goes: the reference trainer's own save, in this process, phase by phase
    (median over ``saves`` after two warm-up saves), and a raw write+fsync of as many bytes."""
    sys.path.insert(0, str(ROOT / "fixtures"))
    import reference_trainer as rt  # its import also switches torch's redundant zip CRC32 off

    from spotchaos.probe import Probe

    folder = work / "phases"
    folder.mkdir()
    args = rt.parse_args(["--hidden", "1024", "--checkpoint-dir", str(folder), "--keep", "2"])
    trainer = rt.Trainer(args, Probe(None))
    for _, x, y in trainer.batches():
        trainer.train_step(x, y)  # the optimizer has its moments: a checkpoint of full size
        break
    timings: dict[str, list[float]] = {}
    size = 0
    for index in range(saves + 2):
        trainer.step = 100 + index
        clock = time.perf_counter()
        warm = index >= 2

        def lap(name: str, warm: bool = warm) -> None:
            nonlocal clock
            now = time.perf_counter()
            if warm:
                timings.setdefault(name, []).append(now - clock)
            clock = now

        final = trainer.checkpoint_root / trainer.checkpoint_name()
        tmp = trainer.checkpoint_root / f".tmp-{final.name}"
        tmp.mkdir()
        payloads = {
            "model.pt": trainer.model.state_dict(),
            "optimizer.pt": trainer.optimizer.state_dict(),
            "trainer.pt": trainer.trainer_state(),
        }
        size = 0
        for name, obj in payloads.items():
            size += trainer.write_file(tmp / name, obj)[0]
        lap("serialize + write + fsync the 3 data files")
        with open(tmp / rt.MANIFEST, "w") as f:
            f.write("{}")
            f.flush()
            os.fsync(f.fileno())
        rt.fsync_dir(tmp)
        trainer.replace_dir(tmp, final)
        rt.fsync_dir(trainer.checkpoint_root)
        lap("manifest, rename, directory fsyncs (durable here)")
        trainer.write_latest(final.name)
        lap("latest pointer")
        trainer.rotate()
        lap("rotation (unlinking the oldest checkpoint)")
    payload = os.urandom(size)
    raw = []
    for _ in range(saves):
        started = time.perf_counter()
        with open(folder / "raw.bin", "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        raw.append(time.perf_counter() - started)
        (folder / "raw.bin").unlink()
    return {name: statistics.median(values) for name, values in timings.items()}, statistics.median(raw), size


def overhead_noise(work: Path, repeats: int) -> tuple[float, float, list[float]]:
    """(d) spread of the overhead fraction across repeated uninterrupted runs."""
    job = JobSpec(name="ref", command=DEFAULT_JOB)
    fractions = [measure_overhead(run(job, "", work).attempts[0], 0.05).fraction or 0.0 for _ in range(repeats)]
    spread = max(fractions) - min(fractions)
    return spread, spread / statistics.median(fractions), fractions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spotchaos-figures-"))
    try:
        per_test = plugin_overhead(work, args.repeats)
        print(f"(a) plugin installed but off: {per_test * 1000:+.3f} ms per test (goal < 50 ms)")
        ratio, plain, preempted, cold = resume_ratio(work, args.repeats)
        print(
            f"(b) preempt-and-resume / (uninterrupted + cold start) = {preempted:.2f} / ({plain:.2f} + {cold:.2f})"
            f" = {ratio:.3f} (goal <= 1.15)"
        )
        ratio_c, ckpt, raw, size = checkpoint_throughput(work, args.repeats)
        print(
            f"(c) checkpoint write {ckpt / 1e6:.1f} MB/s vs raw write+fsync {raw / 1e6:.1f} MB/s of {size / 1e6:.1f} MB"
            f" = {ratio_c:.2f} (goal >= 0.7)"
        )
        phases, raw_seconds, size = checkpoint_phases(work)
        for name, seconds in phases.items():
            print(f"    {name}: {seconds * 1000:.2f} ms")
        durable, whole = sum(list(phases.values())[:2]), sum(phases.values())
        print(
            f"    in-process: raw write+fsync {raw_seconds * 1000:.2f} ms of {size / 1e6:.1f} MB; until durable "
            f"{durable * 1000:.2f} ms (ratio {raw_seconds / durable:.2f}); whole save {whole * 1000:.2f} ms "
            f"(ratio {raw_seconds / whole:.2f})"
        )
        spread, relative, fractions = overhead_noise(work, args.repeats)
        shown = ", ".join(f"{f:.2%}" for f in fractions)
        print(
            f"(d) overhead over {args.repeats} runs: {shown}; spread {spread * 100:.2f} percentage points, "
            f"{relative:.1%} of the median (goal < 2 %)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

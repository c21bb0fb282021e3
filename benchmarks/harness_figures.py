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

from spotchaos.budgets.overhead import measure_overhead
from spotchaos.config.jobs import JobSpec
from spotchaos.faults.plan import Plan
from spotchaos.training.engine.run import EngineOptions, run_job

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
        folder = Path(record.workdir) / "checkpoints"  # the same directory
        raw_rates += [size / raw_fsync_seconds(folder, size, 1) for _ in events]
        shutil.rmtree(record.workdir)
    ckpt, raw = statistics.median(ckpt_rates), statistics.median(raw_rates)
    return ckpt / raw, ckpt, raw, size


def checkpoint_phases(work: Path, saves: int = 12) -> tuple[dict[str, float], float, int]:
    """Where (c)'s time goes: the reference trainer's own save, in this process, phase by phase
    (median over ``saves`` after two warm-up saves), and a raw write+fsync of as many bytes after each."""
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
    raw: list[float] = []
    size = 0
    for index in range(saves + 2):
        trainer.step = 100 + index
        time.sleep(0.05)  # a few training steps between saves, as in a run
        clock = time.perf_counter()
        warm = index >= 2

        def lap(name: str, warm: bool = warm) -> None:
            nonlocal clock
            now = time.perf_counter()
            if warm:
                timings.setdefault(name, []).append(now - clock)
            clock = now

        trainer.settle()
        lap("waiting for the previous save's background unlinks")
        final = trainer.checkpoint_root / trainer.checkpoint_name()
        tmp = trainer.checkpoint_root / f".tmp-{final.name}"
        tmp.mkdir()
        files = trainer.write_files(tmp, trainer.payloads())
        size = sum(entry["bytes"] for entry in files.values())
        lap("serialize + write the 3 data files (each fsync overlaps the next file)")
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
        lap("rotation (rename the oldest away; it is unlinked in the background)")
        if warm:  # the raw write right after each save: both see the disk in the same mood
            time.sleep(0.05)
            raw.append(raw_fsync_seconds(folder, size, 1))
    trainer.settle()
    return {name: statistics.median(values) for name, values in timings.items()}, statistics.median(raw), size


def raw_fsync_seconds(folder: Path, size: int, times: int) -> float:
    """Median seconds of a raw write+fsync of ``size`` bytes in ``folder``: the disk's own pace."""
    payload, seconds = os.urandom(size), []
    for _ in range(times):
        started = time.perf_counter()
        with open(folder / "raw.bin", "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        seconds.append(time.perf_counter() - started)
        (folder / "raw.bin").unlink()
    return statistics.median(seconds)


def overhead_noise(work: Path, repeats: int) -> tuple[list[float], list[float]]:
    """(d) the overhead fraction of repeated uninterrupted runs (8 intervals each after warm-up), and
    beside each the disk's own pace just after it (a raw write+fsync of one checkpoint's bytes, as many
    times): the harness cannot be steadier than the fsyncs it times."""
    job = JobSpec(name="ref", command=(*TRAINER, "--steps", "60", "--checkpoint-every", "6", "--step-seconds", "0.06"))
    fractions, disk = [], []
    for _ in range(repeats):
        record = run(job, "", work)
        overhead = measure_overhead(record.attempts[0], 0.05)
        fractions.append(overhead.fraction or 0.0)
        disk.append(raw_fsync_seconds(Path(record.workdir), overhead.checkpoint_bytes or 1, len(overhead.intervals)))
    return fractions, disk


def spread(values: list[float]) -> tuple[float, float]:
    """Max - min, absolute and relative to the median."""
    width = max(values) - min(values)
    return width, width / statistics.median(values)


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
        durable, whole = sum(list(phases.values())[:3]), sum(phases.values())
        print(
            f"    in-process: raw write+fsync {raw_seconds * 1000:.2f} ms of {size / 1e6:.1f} MB; until durable "
            f"{durable * 1000:.2f} ms (ratio {raw_seconds / durable:.2f}); whole save {whole * 1000:.2f} ms "
            f"(ratio {raw_seconds / whole:.2f})"
        )
        fractions, disk = overhead_noise(work, args.repeats)
        width, relative = spread(fractions)
        shown = ", ".join(f"{f:.2%}" for f in fractions)
        print(
            f"(d) overhead over {args.repeats} runs: {shown}; spread {width * 100:.2f} percentage points, "
            f"{relative:.1%} of the median (goal < 2 %)"
        )
        shown = ", ".join(f"{seconds * 1000:.2f}" for seconds in disk)
        print(f"    the disk's own pace after each run (raw write+fsync, ms): {shown}; spread {spread(disk)[1]:.1%}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

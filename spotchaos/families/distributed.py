"""Multi-rank jobs on torchrun: a rank killed inside its shard write, a resume on another world
size, and how deterministic the job is at each world size.

The rank-level preemptions (``kill-rank1@5``, ``hang-rank1@5``, ``lose-node1@5``) are plans like
any other and run through :func:`spotchaos.families.preemption.check`; the session judges every
rank of a torchrun job (:mod:`spotchaos.training.multirank.rank_verdict`). What needs more than one plan lives here.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config.jobs import JobSpec
from ..core import Core
from ..errors import ConfigError, SpotchaosError
from ..faults.plan import Plan, Preemption
from ..record import note_figure_row, note_figures, note_run
from ..training.engine.attempt import read_fs_events
from ..training.engine.options import FS_EVENTS
from ..training.multirank.rank_verdict import judge_ranks, rank_view, restored_differences, sample_coverage
from ..training.multirank.torchrun import uri_path
from ..training.trajectory import RunRecord
from ..training.verdict import Verdict, find_divergence
from .preemption import ChaosFailure, check

# a rank's own part of a sharded checkpoint: torch.distributed.checkpoint's shard files, and DeepSpeed ZeRO's
# per-rank files (its optimizer partition; with ZeRO-3, its parameters' too)
SHARD_FILES = re.compile(r"(\.distcp|(?:^|/)(?:bf16_)?zero_pp_rank_\d+_mp_rank_\d+_(?:optim|model)_states\.pt)$")


def _require_torchrun(job: JobSpec, what: str) -> None:
    if not job.kind.local_ranks or job.world_size < 2:
        raise ConfigError(f"{what} needs a torchrun job with at least 2 ranks: {job.where('launcher')}")


def shard_crash_point(core: Core, job: JobSpec, rank: int) -> int:
    """The file-system event at which ``rank`` opens its shard of the second checkpoint save
    (the first may have nothing to fall back to): a crash there lands between its shard and the
    coordinator's ``.metadata``."""
    logs: list[list[dict[str, Any]]] = []

    def read_log(run: RunRecord) -> None:
        logs.append(read_fs_events(Path(run.workdir) / "attempt-0" / FS_EVENTS))

    core.run_once(job, Plan(), "trace", read_log, trace_fs=True, trace_rank=rank)
    folders: list[str] = []
    for event in logs[0]:
        if event["event"] == "open-write" and SHARD_FILES.search(event["path"]):
            folder = str(Path(event["path"]).parent)
            if folder not in folders:
                folders.append(folder)
            if len(folders) == 2:
                return event["index"]
    raise SpotchaosError(
        f"job {job.name!r}: rank {rank} wrote no shard (a .distcp file, or a DeepSpeed zero_pp_rank_* file) in two "
        "checkpoint saves of its uninterrupted run: does it save with torch.distributed.checkpoint or DeepSpeed "
        "under SPOTCHAOS_CHECKPOINT_URI?"
    )


def rank_save_points(core: Core, job: JobSpec) -> list[dict[str, Any]]:
    """The crash points of a multi-rank save: every file-system event each rank makes in the
    job's second checkpoint save (the first may have nothing to fall back to), numbered per rank
    as ``crash-rankR@N`` counts them, from the save's first event to the next save's. Each is
    ``{"rank", "index", "event", "path"}``, the path relative to the checkpoint directory. One
    traced uninterrupted run: every rank logs its own events, numbered by itself."""
    _require_torchrun(job, "per-rank crash points")
    traced: list[tuple[list[dict[str, Any]], list[Path]]] = []

    def read_log(run: RunRecord) -> None:
        log = read_fs_events(Path(run.workdir) / "attempt-0" / FS_EVENTS)
        saved = [uri_path(str(e["uri"])) for e in run.attempts[0].of_rank("checkpoint")]
        traced.append((log, saved))

    core.run_once(job, Plan(), "trace-ranks", read_log, trace_fs=True)
    log, saved = traced[0]
    if len(saved) < 2:
        raise SpotchaosError(f"job {job.name!r} reported fewer than 2 checkpoints: no second save to crash inside")
    ranks = sorted({e["rank"] for e in log if isinstance(e.get("rank"), int)})
    folders = [_written_as(log, folder) for folder in saved[1:3]]  # the second save's, the third's
    points = [p for rank in ranks for p in _save_points([e for e in log if e.get("rank") == rank], folders, rank)]
    if not points:
        raise SpotchaosError(
            f"job {job.name!r}: no rank wrote a file of its second checkpoint under SPOTCHAOS_CHECKPOINT_URI"
        )
    return points


def _written_as(log: list[dict[str, Any]], folder: Path) -> list[Path]:
    """``folder`` and every folder renamed into it by any rank (a save written to a temporary
    ``.partial-N`` and renamed into place, as accelerate jobs do): the events of its save are
    those under any of them."""
    renamed = [Path(src) for src, _, dst in (e["path"].partition(" -> ") for e in log) if dst and Path(dst) == folder]
    return [folder, *renamed]


def _save_points(log: list[dict[str, Any]], folders: list[list[Path]], rank: int) -> list[dict[str, Any]]:
    """One rank's events from its first in the second checkpoint's folders to its first in the third's."""
    paths = [Path(e["path"].split(" -> ")[0]) for e in log]

    def under(path: Path, of: list[Path]) -> bool:
        return any(path.is_relative_to(folder) for folder in of)

    inside = [i for i, path in enumerate(paths) if under(path, folders[0])]
    if not inside:
        return []  # this rank writes nothing of that checkpoint
    later = [i for i, path in enumerate(paths) if len(folders) > 1 and under(path, folders[1]) and i > inside[0]]
    root = folders[0][0].parent
    return [
        {
            "rank": rank,
            "index": event["index"],
            "event": event["event"],
            "path": str(path.relative_to(root)) if path.is_relative_to(root) else path.name,
        }
        for event, path in zip(log[inside[0] : min(later, default=len(log))], paths[inside[0] :], strict=False)
    ]


def rank_crash_plans(points: list[dict[str, Any]]) -> tuple[list[Plan], list[Plan]]:
    """(the plans to run first, every plan) of :func:`rank_save_points`. First, for each rank but
    the coordinator: a crash before its first write of the save (its DCP shard, before anything is
    published) and before its last write (a file of its own, after which a coordinator that does
    not wait publishes the checkpoint without it). Then hypothesis searches the rest."""
    every = [Plan((Preemption(p["index"], f"crash-rank{p['rank']}"),)) for p in points]
    first: list[Plan] = []
    for rank in sorted({p["rank"] for p in points} - {0}):
        writes = [p for p in points if p["rank"] == rank and p["event"] == "open-write"]
        for point in (writes[:1] + writes[-1:]) if writes else []:
            plan = Plan((Preemption(point["index"], f"crash-rank{rank}"),))
            if plan not in first:
                first.append(plan)
    return first, every


def check_shard_crash(core: Core, job: JobSpec, rank: int = 1) -> Verdict:
    """Kill ``rank`` as it starts writing its shard of a checkpoint, before the ``.metadata``
    exists: the restart must resume from the previous complete checkpoint, bit-exact."""
    _require_torchrun(job, "a shard crash")
    plan = Plan((Preemption(shard_crash_point(core, job, rank), f"crash-rank{rank}"),))
    return check(core, job, plan)


def check_reshard(core: Core, job: JobSpec, resume_nproc: int) -> dict[str, Any]:
    """Preempt ``job`` mid-epoch and resume it on ``resume_nproc`` ranks per node: the steps before
    the preemption bit-exact, the restored tensors equal to the saved ones bit for bit, every
    sample of every epoch seen exactly once across the resume, and the training finished."""
    _require_torchrun(job, "resharding")
    if not isinstance(resume_nproc, int) or isinstance(resume_nproc, bool) or not 1 <= resume_nproc <= 64:
        raise ConfigError(
            f"resharding {job.name!r}: resume_nproc: must be an integer from 1 to 64, got {resume_nproc!r}"
        )
    if resume_nproc == job.nproc_per_node:
        raise ConfigError(f"resharding {job.name!r}: resume on another number of ranks than {job.nproc_per_node}")
    reference = core.reference(job)
    checkpoints = core.checkpoint_steps(job)
    if len(checkpoints) < 2:
        raise SpotchaosError(f"job {job.name!r} reported fewer than 2 checkpoints: nothing to reshard after")
    plan = Plan((Preemption(checkpoints[1] + 2, "sigterm"),))
    workdir = core.next_dir(f"{job.name}-reshard{resume_nproc}")
    run = core.execute(job, plan, workdir, judge_restarts=True, resume_nproc=resume_nproc)
    verdict = judge_reshard(reference, run, job.world_size, resume_nproc * job.nnodes)
    note_run(plan, run, verdict, reference)
    figures = {
        "saved_world": job.world_size,
        "resumed_world": resume_nproc * job.nnodes,
        "resumed_from": next((e["from_step"] for e in run.attempts[-1].of_rank("resume")), None),
        "passed": verdict.passed,
    }
    note_figure_row("reshard", figures)
    if not verdict.passed:
        raise ChaosFailure(job.name, plan, verdict, run.workdir)
    core.discard(run)
    return figures


def judge_reshard(reference: RunRecord, run: RunRecord, saved_world: int, resumed_world: int) -> Verdict:
    """Pure: what a resume on another world size must keep (its losses have no reference)."""
    precision = f"saved on {saved_world} ranks, resumed on {resumed_world}: restored tensors and samples compared"
    failed = [a.failed_restart for a in run.attempts if a.failed_restart]
    if failed:  # the restart on the new world size never trained: what follows would only repeat it
        return _verdict(failed, [], len(reference.steps), precision)
    failures: list[str] = []
    before = replace(run, attempts=run.attempts[:1])
    for rank in range(saved_world):
        divergence = find_divergence(rank_view(reference, rank), rank_view(before, rank))
        if divergence is not None:
            failures.append(f"rank {rank} before the preemption: {divergence.describe()}")
    later = run.attempts[1:]
    worlds = {e.get("world") for a in later for e in a.of_kind("start")}
    if later and worlds != {resumed_world}:
        failures.append(f"the restart ran on world size(s) {sorted(map(str, worlds))}, not {resumed_world}")
    saved = [e["step"] for e in run.attempts[0].of_kind("checkpoint")]
    resumed = next((e["from_step"] for a in later for e in a.of_rank("resume")), None)
    if saved and resumed != max(saved):
        failures.append(
            f"the restart on {resumed_world} ranks resumed after step {resumed}, not after step {max(saved)}, "
            "the newest checkpoint the preempted run made durable"
        )
    missing = sorted({s.step for s in reference.steps} - {s.step for s in run.steps})
    if missing:
        failures.append(f"{len(missing)} step(s) never ran after resuming on {resumed_world} ranks: {missing[:10]}")
    if run.final is None:
        failures.append(f"the run resumed on {resumed_world} ranks never reported a 'final' event")
    failures += restored_differences(run)
    failures += sample_coverage(run)
    if not any(a.of_kind("samples") for a in run.attempts):
        failures.append("the job reported no 'samples' events: the data position across the resume is unchecked")
    return _verdict(failures, missing, len(reference.steps), precision)


def _verdict(failures: list[str], missing: list[int], reference_steps: int, precision: str) -> Verdict:
    return Verdict(
        passed=not failures,
        failures=failures,
        first_divergence=None,
        missing_steps=missing,
        unexpected_steps=[],
        differing_tensors=[],
        lost_steps=0,
        grace=[],
        reference_steps=reference_steps,
        precision=precision,
    )


def determinism_baseline(core: Core, job: JobSpec, worlds: tuple[int, ...] = (2,)) -> list[dict[str, Any]]:
    """Per world size: do two uninterrupted runs agree bit for bit, and does a preempted one
    resume bit-exact? Reported, so a multi-rank divergence is never blamed on the resume when the
    job is not deterministic at that size (DDP's bucket order may change from 3 ranks)."""
    _require_torchrun(job, "a determinism baseline")
    rows = []
    for world in worlds:
        if world % job.nnodes:
            raise ConfigError(f"world size {world} does not divide into {job.nnodes} node(s)")
        sized = replace(job, nproc_per_node=world // job.nnodes)
        reference = core.reference(sized)
        again = core.run_once(sized, Plan(), "repeat")
        differences = judge_ranks(reference, again)
        divergence = find_divergence(reference, again)
        if divergence is not None:
            differences.insert(0, f"rank 0: {divergence.describe()}")
        if (reference.final or {}).get("digests") != (again.final or {}).get("digests"):
            differences.append("rank 0: final weights differ between two uninterrupted runs")
        row: dict[str, Any] = {
            "world": world,
            "uninterrupted_seconds": round(reference.wall_seconds, 2),
            "repeatable": not differences,
            "repeat_differences": differences[:3],
        }
        steps = len(reference.steps)
        plan = Plan((Preemption(steps // 2, "sigterm"),))
        run, verdict = core.run(sized, plan)
        row.update(
            resume_bit_exact=verdict.passed,
            cycle_seconds=round(run.wall_seconds, 2),
            cycle_ratio=round(run.wall_seconds / reference.wall_seconds, 2),
            failures=verdict.failures[:3],
        )
        rows.append(row)
    note_figures({"determinism_by_world": rows})
    return rows

"""Every rank of a multi-rank job, not rank 0 alone. Pure functions over run records, no I/O.

The main verdict (:mod:`spotchaos.training.verdict`) judges rank 0's trajectory, checkpoints and grace.
What only the other ranks show is judged here: a rank whose losses leave the reference after a
resume while rank 0's stay (its own RNG stream or data position restored from rank 0, or not at
all), a rank whose final weights differ, a resume whose restored tensors are not the ones saved
(the resharding check: saved on 4 ranks, restored on 2), and a sample of an epoch seen twice or
never across the resume (data-loader state dropped on a world-size change).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from ..trajectory import RunRecord
from ..verdict import Divergence, Verdict, find_divergence

BUCKET_ORDER_HINT = (
    "; hint: the losses matched, or drifted in their last bits only, and the weights' last bits differ: from 3 "
    "ranks a whole-bucket all-reduce sums "
    "in an order that depends on DDP's bucket layout, which DDP rebuilds after the first step and a restart resets; "
    "all-reduce each parameter on its own (a DDP comm hook, as fixtures/ddp_trainer.py does) to resume bit-exact"
)

SHARED_RNG = "drew from the same RNG state"
PER_RANK_HINT = (
    "rank 0 matched, so what each rank keeps for itself was not restored per rank: its RNG stream (dropout) or "
    "its data position restored from rank 0, or not saved at all?"
)
BEFORE_RANK0 = "before rank 0 did"  # a rank whose state differed first: its failure goes first


def _before_rank0_hint(rank: int, rank0_step: int) -> str:
    return (
        f"; rank {rank} left the reference {BEFORE_RANK0} (step {rank0_step}), so after the resume its own state "
        "differed from the uninterrupted run's while rank 0's did not: did every rank load the checkpoint (not "
        "rank 0 alone: DDP copies rank 0's weights to the others only when it is built), and restore its own "
        "data position and RNG stream?"
    )


def add_rank_verdicts(verdict: Verdict, reference: RunRecord, chaos: RunRecord, torn: list[str]) -> None:
    """Fold into ``verdict`` (rank 0's) what only the other ranks show, and the checkpoints the job
    published without their shards (``torn``, found on disk by the caller). When every loss of every
    rank matched and only the final weights differ from 3 ranks on, the failure names the likely cause."""
    failures = [*torn, *judge_ranks(reference, chaos)]
    # a specific diagnosis (a checkpoint published too early, one rank's RNG state on every rank)
    # is the most likely cause: it goes first, before rank 0's own failure and its generic hint
    first = [*torn, *(f for f in failures if SHARED_RNG in f or BEFORE_RANK0 in f)]
    verdict.failures = [*first, *verdict.failures, *(f for f in failures if f not in first)]
    verdict.passed = verdict.passed and not failures
    for note in optimizer_untested(reference, chaos):  # a pass that proves less than it seems: said
        verdict.precision += f"; {note}"
    if len(ranks_of(chaos)) >= 3 and _only_last_bits(reference, chaos):
        verdict.failures = [
            f + BUCKET_ORDER_HINT if f.startswith("final weights differ") else f for f in verdict.failures
        ]


LAST_BITS = 1e-5  # relative difference of a loss that a few ulps in the weights can make


def _only_last_bits(reference: RunRecord, chaos: RunRecord) -> bool:
    """Every rank's first divergence, if any, a loss a few ulps off, later than the first step after
    the resume (what the resumed step draws or loads would show at once)."""
    for rank in ranks_of(chaos):
        divergence = find_divergence(rank_view(reference, rank), rank_view(chaos, rank))
        if divergence is None:
            continue
        if divergence.field != "loss" or divergence.resumed_from is None:
            return False
        try:
            a, b = float.fromhex(divergence.reference), float.fromhex(divergence.observed)
        except (TypeError, ValueError):
            return False
        if divergence.step - divergence.resumed_from < 2 or abs(a - b) > LAST_BITS * max(abs(a), abs(b), 1e-30):
            return False
    return True


def rank_view(run: RunRecord, rank: int) -> RunRecord:
    """``run`` as rank ``rank`` saw it, in the shape of a one-rank run (its events as rank 0's)."""
    attempts = [
        replace(a, events=[{**e, "rank": 0} for e in a.events if e.get("rank", 0) == rank]) for a in run.attempts
    ]
    return replace(run, attempts=attempts)


def ranks_of(run: RunRecord) -> list[int]:
    return sorted({rank for attempt in run.attempts for rank in attempt.ranks})


def judge_ranks(reference: RunRecord, chaos: RunRecord, *, trajectories: bool = True) -> list[str]:
    """Failures only the ranks other than 0 show, and the restored-state and sample checks.

    ``trajectories=False`` when the run changed its world size: losses after the change have no
    reference to be compared with, but what was restored and which samples were seen still do."""
    failures: list[str] = []
    if trajectories:
        rank0 = find_divergence(rank_view(reference, 0), rank_view(chaos, 0))
        for rank in ranks_of(reference):
            if rank == 0:
                continue
            failures += _judge_rank(reference, chaos, rank, rank0)
        failures += shared_rng(reference, chaos)
    failures += restored_differences(chaos)
    failures += sample_coverage(chaos)
    return failures


def shared_rng(reference: RunRecord, chaos: RunRecord) -> list[str]:
    """Ranks that drew from one RNG state after a resume although the uninterrupted run gave
    each its own: one rank's RNG state restored on every rank. Read from the ``rng`` fingerprint."""

    def by_step(run: RunRecord, attempts) -> dict[int, dict[int, object]]:
        states: dict[int, dict[int, object]] = defaultdict(dict)
        for attempt in attempts:
            for event in attempt.of_kind("step"):
                rng = (event.get("fp") or {}).get("rng")
                if rng is not None:
                    states[event["step"]][event.get("rank", 0)] = rng
        return states

    own = by_step(reference, reference.attempts)
    for attempt in chaos.attempts[1:]:
        for step, ranks in sorted(by_step(chaos, [attempt]).items()):
            values = list(ranks.values())
            shared = len(set(values)) < len(values)
            distinct_before = len(set(own.get(step, {}).values())) == len(own.get(step, {}))
            if shared and distinct_before:
                same = sorted(r for r in ranks if values.count(ranks[r]) > 1)
                return [
                    f"ranks {', '.join(map(str, same))} {SHARED_RNG} at step {step} (attempt "
                    f"{attempt.index}, after resuming) while the uninterrupted run gave each rank its own: one rank's "
                    "RNG state was restored on every rank; save and restore each rank's RNG under a key of its own"
                ]
    return []


def _judge_rank(reference: RunRecord, chaos: RunRecord, rank: int, rank0: Divergence | None) -> list[str]:
    """Rank ``rank``'s trajectory, steps and final weights against the reference's same rank;
    ``rank0``: where rank 0's own left the reference (None: it did not), which says what a
    divergence of this rank's points to."""
    ref, got = rank_view(reference, rank), rank_view(chaos, rank)
    failures = []
    divergence = find_divergence(ref, got)
    if divergence is not None:
        text = f"rank {rank}: {divergence.describe()}"
        if rank0 is None and divergence.attempt > 0:
            text += f"; {PER_RANK_HINT}"
        elif (
            rank0 is not None
            and divergence.attempt > 0
            and (divergence.attempt, divergence.step)
            < (
                rank0.attempt,
                rank0.step,
            )
        ):
            text += _before_rank0_hint(rank, rank0.step)
        failures.append(text)
    missing = sorted({s.step for s in ref.steps} - {s.step for s in got.steps})
    if missing:
        failures.append(f"rank {rank}: {len(missing)} step(s) never ran: {missing[:10]}")
    ref_final, got_final = ref.final, got.final
    if ref_final is not None and got_final is None and not missing:
        failures.append(f"rank {rank} never reported a 'final' event")
    elif ref_final is not None and got_final is not None:
        a, b = ref_final["digests"], got_final["digests"]
        differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        if differing:
            failures.append(
                f"rank {rank}: final weights differ in {len(differing)} of {len(a)} tensor(s): "
                + ", ".join(differing[:6])
            )
    return failures


OPTIMIZER_ONLY = (
    "; only the optimizer's state: the weights were restored, its moments were not (the first step after "
    "the resume agrees, the next does not). With torch.distributed.checkpoint, a fresh optimizer's own "
    "state_dict() holds no state for dcp.load to fill: build the template with get_state_dict(model, optimizer) "
    "and put it back with set_state_dict; with DeepSpeed, engine.load_checkpoint must load them "
    "(load_optimizer_states=True, its default; not load_module_only=True)"
)


def _of_optimizer(name: str) -> bool:
    """A digest of the optimizer's state, as the bundled trainers and torch's flat names spell it."""
    return name.startswith(("optim.", "optimizer.", "optim_state", "opt.")) or name.endswith(
        (".exp_avg", ".exp_avg_sq", ".momentum_buffer")
    )


def restored_differences(run: RunRecord) -> list[str]:
    """A resume must restore exactly what was saved: the tensors' digests a rank reported right
    after loading (``restored``) against those reported when that checkpoint was written (``saved``)."""
    saved: dict[str, dict] = {}
    failures = []
    for attempt in run.attempts:
        for event in attempt.events:
            if event["event"] == "saved" and isinstance(event.get("digests"), dict):
                saved[str(event.get("uri"))] = event["digests"]
            elif event["event"] == "restored" and isinstance(event.get("digests"), dict):
                before = saved.get(str(event.get("uri")))
                if before is None:
                    continue
                after = event["digests"]
                differing = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
                if differing:
                    name = Path(str(event.get("uri"))).name
                    failures.append(
                        f"rank {event.get('rank', 0)} (attempt {attempt.index}) restored {name} but {len(differing)} "
                        f"of {len(before)} tensor(s) differ from what was saved: {', '.join(differing[:6])}"
                        + (OPTIMIZER_ONLY if all(_of_optimizer(k) for k in differing) else "")
                    )
    return failures


def optimizer_untested(reference: RunRecord, chaos: RunRecord) -> list[str]:
    """The resumes that restored a checkpoint saved before any optimizer step: its ``saved``
    digests hold no optimizer state where the job's later checkpoints do. Such a resume restores
    no moment, so a job that never restores its optimizer passes it all the same: the plan tests
    no optimizer restore, and the verdict says so (no failure: the job did nothing wrong)."""
    saved: dict[str, dict] = {}
    with_optimizer = False
    for run in (reference, chaos):
        for attempt in run.attempts:
            for event in attempt.of_kind("saved"):
                if isinstance(event.get("digests"), dict):
                    saved.setdefault(str(event.get("uri")), event["digests"])
                    with_optimizer = with_optimizer or any(_of_optimizer(k) for k in event["digests"])
    if not with_optimizer:
        return []  # the job reports no optimizer state at all: nothing to tell
    notes = []
    for attempt in chaos.attempts:
        for event in attempt.of_kind("resume"):
            digests = saved.get(str(event.get("uri")))
            if digests is not None and not any(_of_optimizer(k) for k in digests):
                name = Path(str(event.get("uri"))).name
                note = (
                    f"attempt {attempt.index} resumed from {name}, saved before any optimizer step (it holds no "
                    "optimizer state): this resume tests no optimizer restore"
                )
                if note not in notes:
                    notes.append(note)
    return notes


def sample_coverage(run: RunRecord) -> list[str]:
    """Every sample of an epoch seen exactly once across every rank and every resume.

    Built from ``samples`` events (step, epoch, ids) in the order they happened; a step run again
    after a resume replaces its earlier run, as its update replaced it in the weights. An epoch the
    run finished must hold every sample the run ever saw; an unfinished one no sample twice."""
    latest: dict[tuple[int, int], tuple[int, list[int], int]] = {}
    for attempt in run.attempts:
        for event in attempt.of_kind("samples"):
            step, epoch, ids = event.get("step"), event.get("epoch"), event.get("ids")
            if isinstance(step, int) and isinstance(epoch, int) and isinstance(ids, list):
                latest[(event.get("rank", 0), step)] = (epoch, ids, attempt.index)
    if not latest:
        return []
    seen: dict[int, dict[int, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for (rank, step), (epoch, ids, _) in sorted(latest.items(), key=lambda kv: kv[0][1]):
        for sample in ids:
            seen[epoch][sample].append((step, rank))
    universe = {sample for per_epoch in seen.values() for sample in per_epoch}
    failures = []
    last_epoch = max(seen)
    for epoch in sorted(seen):
        twice = {s: where for s, where in seen[epoch].items() if len(where) > 1}
        if twice:
            sample, where = min(twice.items())
            shown = ", ".join(f"step {step} on rank {rank}" for step, rank in where[:3])
            failures.append(
                f"{len(twice)} sample(s) of epoch {epoch} were trained on more than once across the resume "
                f"(sample {sample}: {shown}): the data position was not restored per rank, or was dropped"
            )
        missing = universe - set(seen[epoch])
        if epoch < last_epoch and missing:
            failures.append(
                f"{len(missing)} sample(s) of epoch {epoch} were never trained on (e.g. sample {min(missing)}): "
                "the resume skipped part of the epoch"
            )
    return failures

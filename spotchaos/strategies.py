"""Hypothesis strategies for preemption plans.

Kept apart from the engine (which only executes a :class:`~spotchaos.faults.plan.Plan`) so that users
can compose their own search spaces. Shrinking works on the plan's parts: fewer preemptions,
earlier steps, and the first fault kind listed (so list the mildest first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hypothesis import strategies as st

from .faults import CHECKPOINT_FAULTS, PREEMPTIONS, traits
from .faults.plan import Plan, Preemption

ALL_PREEMPTIONS: tuple[str, ...] = ("sigterm", "sigterm-group", "sigkill")


def preemptions(
    total_steps: int, faults: Sequence[str] = ALL_PREEMPTIONS, offsets: Sequence[float] = ()
) -> st.SearchStrategy[Preemption]:
    """One preemption at a step where the job still has work left (0 .. total_steps - 2); with
    ``offsets``, some land that many seconds after their step instead, inside the next one
    (``sigterm@5+0.1s``; shrinks towards the step's end)."""
    unknown = [f for f in faults if f not in PREEMPTIONS or traits(f).armed_by_environment]
    if unknown:
        raise ValueError(f"unknown preemption kinds {unknown}; known: {sorted(PREEMPTIONS)}")
    if total_steps < 2:
        raise ValueError(f"a job needs at least 2 steps to be preempted, this one has {total_steps}")
    offset = st.sampled_from((None, *offsets)) if offsets else st.none()

    def build(at_step: int, fault: str, seconds: float | None) -> Preemption:
        timed = seconds if seconds is not None and not PREEMPTIONS[fault].reruns else None
        return Preemption(at_step, fault, offset_seconds=timed)

    return st.builds(build, st.integers(0, total_steps - 2), st.sampled_from(tuple(faults)), offset)


def preemption_plans(
    total_steps: int,
    *,
    faults: Sequence[str] = ALL_PREEMPTIONS,
    min_preemptions: int = 1,
    max_preemptions: int = 3,
    offsets: Sequence[float] = (),
) -> st.SearchStrategy[Plan]:
    """Chains of ``min_preemptions`` .. ``max_preemptions`` preemptions (restart after each);
    ``offsets``: times after a step some of them land at (see :func:`preemptions`)."""
    return st.lists(preemptions(total_steps, faults, offsets), min_size=min_preemptions, max_size=max_preemptions).map(
        lambda items: Plan(tuple(items))
    )


def phase_preemptions(
    starts: Mapping[str, Sequence[int]], faults: Sequence[str] = ("sigterm", "sigkill")
) -> st.SearchStrategy[Plan]:
    """One fault inside a phase the job reports (``sigterm@S/eval``): a phase and a step after which
    the reference began it (``starts``, from ``phase_starts``), so every drawn plan lands; it
    shrinks towards the first phase's first start and the first fault listed."""
    cells = [(name, step) for name, steps in starts.items() for step in steps]
    if not cells:
        raise ValueError("no phase began in the reference run: nothing to land a fault inside")
    return st.builds(
        lambda cell, fault: Plan((Preemption(cell[1], fault, phase=cell[0]),)),
        st.sampled_from(cells),
        st.sampled_from(tuple(faults)),
    )


ALL_DAMAGE: tuple[str, ...] = tuple(CHECKPOINT_FAULTS)


def damage_plans(
    total_steps: int,
    *,
    min_step: int = 0,
    damage: Sequence[str] = ALL_DAMAGE,
    preemption: Sequence[str] = ("sigterm", "sigkill"),
) -> st.SearchStrategy[Plan]:
    """One preemption at a step >= ``min_step``, then one checkpoint fault on the newest checkpoint
    before the restart. ``pick`` chooses the file and offset; it shrinks towards the first file."""
    unknown = [d for d in damage if d not in CHECKPOINT_FAULTS]
    if unknown:
        raise ValueError(f"unknown checkpoint faults {unknown}; known: {list(CHECKPOINT_FAULTS)}")
    if not 0 <= min_step <= total_steps - 2:
        raise ValueError(f"min_step {min_step} leaves no step to preempt in a job of {total_steps} steps")
    return st.builds(
        lambda step, fault, kind, pick: Plan((Preemption(step, fault, kind, pick),)),
        st.integers(min_step, total_steps - 2),
        st.sampled_from(tuple(preemption)),
        st.sampled_from(tuple(damage)),
        st.floats(0, 1, exclude_max=True, allow_nan=False),
    )


def resumes_from_a_checkpoint(plan: Plan, first_checkpoint: int | None) -> bool:
    """Whether the plan makes some restart resume from a checkpoint, not only start afresh: a
    notice (the job checkpoints on it), a crash point (inside a save or a load), a rerun, or a kill
    after the step of the job's first checkpoint (a job held after that step has not written it
    yet). A plan of kills before the first checkpoint tests a fresh restart only, which every job
    passes; ``first_checkpoint`` None (the job reported none) lets every plan through."""
    if first_checkpoint is None:
        return True
    for p in plan.preemptions:
        kind = PREEMPTIONS[p.fault]
        if kind.graceful or p.fs_event is not None or kind.reruns or p.at_step > first_checkpoint:
            return True
    return False


FirstPlans = Callable[[Sequence["int | None"], Sequence[int]], list[Plan]]


def resumes_across_epochs(fault: str, *, twice: bool = False, rerun: bool = False) -> FirstPlans:
    """Plans run before the search, aimed where frameworks get resumes wrong, from the reference's
    epoch of each step (the ``epoch`` fingerprint the framework integrations report) and its
    checkpoint steps: a resume from inside an epoch and one from an epoch's last step (``sigterm``
    checkpoints at the step it lands on; ``sigkill`` resumes from the checkpoint before it); with
    ``twice``, two resumes inside one epoch; with ``rerun``, a restart after the job finished. A
    job that reports no epochs gets the resume from inside its run."""

    def first(epochs: Sequence[int | None], checkpoints: Sequence[int]) -> list[Plan]:
        total = len(epochs)
        last = total - 1
        ends = [s for s in range(last) if epochs[s] is not None and epochs[s + 1] not in (None, epochs[s])]
        inside = [s for s in range(1, last) if s not in ends and s - 1 not in ends]
        if not traits(fault).graceful:  # a kill: resumes from the checkpoint it follows
            ends = [c + 1 for c in checkpoints if c in ends and c + 1 < last]
            inside = [c + 1 for c in checkpoints if c in inside and c + 1 < last]
        plans = []
        if inside:
            plans.append(Plan((Preemption(inside[len(inside) // 3], fault),)))
        if ends:
            plans.append(Plan((Preemption(ends[0], fault),)))
        if twice:
            pair = _two_in_one_epoch(epochs, ends, checkpoints)
            if pair:
                plans.append(Plan(tuple(Preemption(s, fault) for s in pair)))
        if rerun:
            plans.append(Plan((Preemption(0, "rerun"),)))
        return plans

    return first


def _two_in_one_epoch(
    epochs: Sequence[int | None], ends: Sequence[int], checkpoints: Sequence[int] = ()
) -> tuple[int, int] | None:
    """Two steps of one epoch, neither its last, at least two apart: a second resume inside the
    epoch the first one resumed into. Of the last epoch that has them, the first such pair after a
    checkpoint where there is one: a later epoch is where a resume's epoch arithmetic shows (an
    epoch 0 restored as 0 by mistake looks right), and a pair after a checkpoint starts from the
    reference's copy of it instead of training the job from step 0."""
    by_epoch: dict[object, list[int]] = {}
    for step, epoch in enumerate(epochs[:-1]):
        if step not in ends:
            by_epoch.setdefault(epoch, []).append(step)
    for steps in reversed(list(by_epoch.values())):
        if len(steps) < 4:
            continue
        roomy = (s for c in sorted(checkpoints, reverse=True) for s in steps if s > c and steps[-1] - s >= 2)
        return (next(roomy, steps[1]), steps[-1])
    return None


Cell = tuple[tuple[object, ...], ...]


def plan_cell(plan: Plan, checkpoints: Sequence[int], epochs: Sequence[int | None]) -> Cell:
    """What a plan tests, coarsely: for each fault, its kind (with the damage it does), the
    reference's newest checkpoint before it (what a kill resumes from, the age of what a damage
    rolls back to) and where in its epoch it lands (first step, inside, last step); a fault inside
    a phase is of its own kind (``sigterm/eval``). Two plans of
    one cell test much the same thing, so a search covers distinct cells before it repeats one;
    a crash point is a cell of its own (each file-system event is a different moment of a save)."""
    cells = []
    for p in plan.preemptions:
        if p.fs_event is not None:
            cells.append(("crash", p.after_step, p.fs_event))
            continue
        kind = p.fault if p.damage is None else f"{p.fault}:{p.damage}"
        if p.phase is not None:  # inside a phase is another moment than between steps
            kind += f"/{p.phase}"
        if p.offset_seconds is not None:  # so is inside a step
            kind += "+inside-step"
        before = max((c for c in checkpoints if c < p.at_step), default=None)
        cells.append((kind, before, _place_in_epoch(p.at_step, epochs)))
    return tuple(cells)


def _place_in_epoch(step: int, epochs: Sequence[int | None]) -> str | None:
    """``first``, ``inside`` or ``last`` step of its epoch; None where the job reports no epochs."""
    if not 0 <= step < len(epochs) or epochs[step] is None:
        return None
    if step == 0 or epochs[step - 1] != epochs[step]:
        return "first"
    if step == len(epochs) - 1 or epochs[step + 1] != epochs[step]:
        return "last"
    return "inside"

"""Hypothesis strategies for preemption plans.

Kept apart from the engine (which only executes a :class:`~spotchaos.plan.Plan`) so that users
can compose their own search spaces. Shrinking works on the plan's parts: fewer preemptions,
earlier steps, and the first fault kind listed (so list the mildest first).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from .faults import CHECKPOINT_FAULTS, PREEMPTIONS
from .plan import Plan, Preemption

ALL_PREEMPTIONS: tuple[str, ...] = ("sigterm", "sigterm-group", "sigkill")


def preemptions(total_steps: int, faults: Sequence[str] = ALL_PREEMPTIONS) -> st.SearchStrategy[Preemption]:
    """One preemption at a step where the job still has work left (0 .. total_steps - 2)."""
    unknown = [f for f in faults if f not in PREEMPTIONS or f == "crash"]
    if unknown:
        raise ValueError(f"unknown preemption kinds {unknown}; known: {sorted(PREEMPTIONS)}")
    if total_steps < 2:
        raise ValueError(f"a job needs at least 2 steps to be preempted, this one has {total_steps}")
    return st.builds(Preemption, at_step=st.integers(0, total_steps - 2), fault=st.sampled_from(tuple(faults)))


def preemption_plans(
    total_steps: int,
    *,
    faults: Sequence[str] = ALL_PREEMPTIONS,
    min_preemptions: int = 1,
    max_preemptions: int = 3,
) -> st.SearchStrategy[Plan]:
    """Chains of ``min_preemptions`` .. ``max_preemptions`` preemptions (restart after each)."""
    return st.lists(preemptions(total_steps, faults), min_size=min_preemptions, max_size=max_preemptions).map(
        lambda items: Plan(tuple(items))
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

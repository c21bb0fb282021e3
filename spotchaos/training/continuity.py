"""What a resume loses besides weights: the logger's run, the steps it logs, the best checkpoint.

Optional events a job reports through its probe, checked only when it does (issue 61): a resume
that opens a new logger run splits the dashboard in two; a logger whose step counter begins again
drops or overwrites the points it had; a job that forgot its best score replaces the checkpoint it
kept as best with a worse one. None of them shows in a loss or a weight.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from .trajectory import Attempt


def continuity_failures(attempts: Sequence[Attempt]) -> list[str]:
    """One failure per kind of continuity a resume broke, each naming the attempts."""
    return [f for f in (_logger_run(attempts), _logged_steps(attempts), _best_checkpoint(attempts)) if f]


def logger_runs(attempts: Sequence[Attempt]) -> set[str]:
    """The logger runs a run's attempts reported (``probe.logger``)."""
    return {str(e["run_id"]) for a in attempts for e in a.of_rank("logger", 0) if "run_id" in e}


def _resumed_from(attempt: Attempt) -> int | None:
    resumes = attempt.of_rank("resume", 0)
    return resumes[0]["from_step"] if resumes else None


def _logger_run(attempts: Sequence[Attempt]) -> str | None:
    """Every attempt writes to the run the first one opened."""
    seen = [(a.index, str(e["run_id"])) for a in attempts for e in a.of_rank("logger", 0) if "run_id" in e]
    if not seen:
        return None
    first_attempt, first = seen[0]
    other = next(((i, run) for i, run in seen if run != first), None)
    if other is None:
        return None
    return (
        f"the logger's run changed across a resume: attempt {first_attempt} wrote to run {first!r}, attempt "
        f"{other[0]} to {other[1]!r}, so the dashboard shows two runs; save the run id with the checkpoint and "
        "open the logger with it on a resume (wandb.init(id=..., resume='allow'), mlflow.start_run(run_id=...))"
    )


def _logged_steps(attempts: Sequence[Attempt]) -> str | None:
    """After a resume from step S the logger is given steps after S, and they only increase."""
    for attempt in attempts:
        steps = [int(e["step"]) for e in attempt.of_rank("logged", 0) if isinstance(e.get("step"), int)]
        resumed = _resumed_from(attempt)
        if steps and resumed is not None and steps[0] <= resumed:
            return (
                f"attempt {attempt.index} logged step {steps[0]} after resuming from step {resumed}: the logger's "
                "step counter began again, so the dashboard drops or overwrites the points it had; log with the "
                "step restored from the checkpoint"
            )
        back = next(((a, b) for a, b in itertools.pairwise(steps) if b <= a), None)
        if back is not None:
            return f"attempt {attempt.index} logged step {back[1]} after step {back[0]}: logged steps must increase"
    return None


def _best_checkpoint(attempts: Sequence[Attempt]) -> str | None:
    """A resumed attempt never takes a worse score for best than the best its checkpoint knew:
    the best reported by earlier attempts at or before the step it resumed from. A best reported
    after that step was lost with the attempt, and may come again worse on the replay."""
    earlier: list[tuple[int, int, float, str]] = []  # (attempt, step, score, mode)
    for attempt in attempts:
        bests = [e for e in attempt.of_rank("best", 0) if isinstance(e.get("score"), int | float)]
        resumed = _resumed_from(attempt)
        known = [(i, step, score, mode) for i, step, score, mode in earlier if resumed is not None and step <= resumed]
        if known:
            maximise = known[-1][3] == "max"
            best = max(known, key=lambda k: k[2]) if maximise else min(known, key=lambda k: k[2])
            for e in bests:
                worse = e["score"] < best[2] if maximise else e["score"] > best[2]
                if worse:
                    return (
                        f"attempt {attempt.index} replaced the best checkpoint with a worse one: score {e['score']:g} "
                        f"after step {e['step']}, where the checkpoint it resumed from (after step {resumed}) already "
                        f"knew {best[2]:g} (attempt {best[0]}, step {best[1]}); restore the best score with the "
                        "checkpoint (ModelCheckpoint's best_model_score, the Trainer's best_metric)"
                    )
        earlier += [(attempt.index, int(e["step"]), float(e["score"]), str(e.get("mode", "min"))) for e in bests]
    return None

"""The verdict of one run, composed in one place: the trajectory and the final weights against
the reference (``verdict.judge``), then what the kept checkpoints hold (the state diff), what only
the other ranks show, a launcher's own reading of a failure (Ray Train), and the secrets.

The session core runs a plan, hands the run here, and discards it if it passed; each part below
is one step of the composition, in the order the report reads it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..backends import SubprocessBackend
from ..config.exit_status import expectation
from ..config.jobs import JobSpec
from ..config.placeholders import working_folder
from ..faults import traits
from ..probe import ENV_RUN_ID
from .continuity import logger_runs
from .determinism import Envelope
from .engine.warmth import may_start_warm, preload_of, start_environment
from .frameworks import framework_of, state_diff_ignore
from .multirank.rank_verdict import add_rank_verdicts
from .multirank.torchrun import published_before_ranks, published_without_metadata
from .state.checkpoint_reader import ConfinedLoader, Confinement, tensor_distances
from .state.diff import DiffRules, StateDifference, restart_flags
from .state.diff import compare as compare_kept
from .state.kept import KEEP_BYTES, kept_dir, not_kept
from .trajectory import RunRecord
from .verdict import Verdict, judge


def _not_requeued(run: RunRecord) -> list[str]:
    """Slurm's requeue mode: after the partition's warning the job must ask for its own restart
    (``scontrol requeue $SLURM_JOB_ID``, as Lightning's auto-requeue does), or it ends for good."""
    return [
        f"attempt {a.index} ended after {a.fault.fault} after step {a.fault.observed_step} without asking Slurm to "
        f'requeue it: in requeue mode (platform = "slurm-requeue") a job that exits without calling '
        "`scontrol requeue $SLURM_JOB_ID` in its warning handler is not run again (the stand-in's scontrol "
        "recorded no such call)"
        for a in run.attempts
        if a.fault is not None and traits(a.fault.fault).warns and a.requeued is False
    ]


def _watchdog(job: JobSpec, run: RunRecord) -> list[str]:
    """A job that declares its own hang watchdog (``watchdog_seconds``) must end itself, non-zero,
    when a rank hangs: production has nobody to end it. The harness's hang detection is only the
    backstop, and a hang it had to end is the job's failure, named apart from the hang itself."""
    if job.watchdog_seconds is None:
        return []
    failures = []
    for attempt in run.attempts:
        fault = attempt.fault
        if fault is None or not traits(fault.fault).hangs:
            continue
        if fault.hang_detected_seconds is not None:
            failures.append(
                f"the job's own watchdog did not end it: {fault.fault} after step {fault.observed_step} (attempt "
                f"{attempt.index}) stopped a rank, and no process of the job exited for "
                f"{fault.hang_detected_seconds:.1f} s, past watchdog_seconds = {job.watchdog_seconds:g} and torchrun's "
                f"{job.teardown_seconds:g}-s teardown; the harness's hang detection (its backstop) ended it. Does "
                "every collective have a timeout (init_process_group(timeout=...), NCCL's watchdog) whose error "
                "ends the rank non-zero?"
            )
        elif attempt.exit_code == 0:
            failures.append(
                f"after {fault.fault} after step {fault.observed_step} (attempt {attempt.index}) the job exited 0: "
                "a watchdog that ends a hung job must exit non-zero, or its launcher counts it finished"
            )
    return failures


@dataclass(frozen=True)
class JudgeContext:
    """What judging a run may ask the session for, each asked only when needed. ``backend``: the
    job's backend, for a checkpoint that must be read in the job's confinement; ``root``: the
    project root the job's ``cwd`` is read against; ``leaked``: a failure naming where a secret of
    the job appeared, if one did, asked last (the state diff's helper writes into the run's folder
    too); ``envelope``: how far a nondeterministic job's weights may spread; ``noise``: how a
    second uninterrupted run's checkpoints differ from the reference's, asked only when the state
    diff found a latent difference (every loss matched): an RNG never seeded is no restore gone
    wrong, and two uninterrupted runs are what shows it."""

    backend: Callable[[], Any]
    root: Path
    leaked: Callable[[], str | None]
    envelope: Envelope | None = None
    noise: Callable[[], StateDifference | None] | None = None


def judge_run(job: JobSpec, reference: RunRecord, run: RunRecord, context: JudgeContext) -> Verdict:
    """``run`` of ``job`` judged against its ``reference``: the trajectory's verdict, then what the
    platform expects, the state diff, the other ranks and leaks (:class:`JudgeContext`)."""
    envelope, backend, root, leaked, noise = (
        context.envelope,
        context.backend,
        context.root,
        context.leaked,
        context.noise,
    )
    if envelope is not None and run.final is not None:  # how far its weights are from the reference's
        run.final["tensor_spread"] = weights_distance(job, reference, run)
    verdict = judge(reference, run, envelope, exit_after=expectation(job.exit_after_notice, job.platform, job.provider))
    platform_failures = [*(_not_requeued(run) if job.platform == "slurm-requeue" else []), *_watchdog(job, run)]
    if platform_failures:
        verdict.failures.extend(platform_failures)
        verdict.passed = False
    found = state_difference(job, reference, run, backend, root)
    skipped = not_kept(kept_dir(run.workdir))
    if skipped["too_big"]:
        count = len(skipped["too_big"])
        verdict.precision += f"; state diff: {count} checkpoint(s) over {KEEP_BYTES >> 20} MiB not compared"
    over = [*not_kept(kept_dir(reference.workdir))["over_budget"], *skipped["over_budget"]]
    if over:
        verdict.precision += (
            f"; state diff: {len(over)} checkpoint(s) not kept, so not compared: the session's kept copies "
            "reached their budget (a quarter of the free disk)"
        )
    if found is not None:  # names the cause of a divergence, or is a latent failure of its own
        # a latent difference is the diff's word alone: only then is a second uninterrupted run worth its cost
        latent = verdict.passed and noise is not None
        unrepeatable = found.unrepeatable(repeated) if latent and (repeated := noise()) else None
        caveat = _caveat_of(run, found)
        described = found.describe(latent=verdict.passed) + (f"; cause: {caveat}" if caveat else "")
        verdict.failures.append(unrepeatable or described)
        verdict.passed = False
        verdict.state_difference = asdict(found)
    if job.multi_rank:  # what only the other ranks show: their own trajectories, samples
        torn = []
        if job.kind.local_ranks:  # torch.distributed.checkpoint's publication, by its files
            torn = [
                *published_without_metadata(run.attempts, run.workdir),
                *published_before_ranks(run.attempts, run.workdir),
            ]
        add_rank_verdicts(verdict, reference, run, torn)
    if job.kind.cluster_ranks:
        from .multirank.ray_train import explain

        explained = explain(verdict.failures, run)
        verdict.passed = verdict.passed and len(explained) == len(verdict.failures)
        verdict.failures = explained
    leak = leaked()
    if leak:  # a job that prints its own secret fails every scenario, not only the storage ones
        verdict.failures.append(leak)
        verdict.passed = False
    return verdict


def _caveat_of(run: RunRecord, found: StateDifference) -> str | None:
    """What the job's integration said of the checkpoint the diff found different, as it wrote it."""
    if not found.label.startswith("s"):
        return None
    step = int(found.label[1:])
    attempt = next((a for a in run.attempts if a.index == found.attempt), None)
    said = [e.get("caveat") for e in (attempt.of_rank("checkpoint") if attempt else []) if e.get("step") == step]
    return next((c for c in reversed(said) if isinstance(c, str) and c), None)


def weights_distance(job: JobSpec, reference: RunRecord, run: RunRecord) -> dict[str, list[float]]:
    """Per final tensor, how far ``run``'s weights are from the reference's (envelope mode)."""
    a, b = reference.attempts[-1].final_tensors, run.attempts[-1].final_tensors
    if a is None or b is None:
        return {}
    return tensor_distances(Path(a), Path(b), job.log.final_key if job.log is not None else None)


def compares_state(job: JobSpec) -> bool:
    """Whether the state diff compares ``job``'s checkpoints: as the job says, else for one
    process only (a torchrun job's DCP ``.metadata`` holds each save's own id, bytes that always
    differ; a rank job whose files hold only state, DeepSpeed's, turns it on with ``state_diff``)."""
    return job.state_diff if job.state_diff is not None else job.kind.one_process


def confined_reader(job: JobSpec, backend: Any, root: Path, reference: Path, run: Path) -> ConfinedLoader:
    """What reads ``job``'s checkpoints where only its own code may (a full unpickle), for the
    state diff of ``run`` against ``reference`` (the two runs' folders): forked from the job's warm
    interpreter where its attempts are, so a comparison costs a fork, not a cold ``import torch``."""
    start_env = start_environment(backend, job)
    warm = may_start_warm(job, backend)
    confinement = Confinement(
        env={**start_env, ENV_RUN_ID: uuid.uuid4().hex[:12]},  # a process of its own, marked as a run id is
        cwd=working_folder(job.cwd, root),
        writable=(run,),
        readable=(kept_dir(reference), kept_dir(run)),
        in_container=job.container is not None,
        start_env=start_env if warm else None,
        preload=preload_of(job) if warm else (),
    )
    return ConfinedLoader(backend, confinement, run)


def state_difference(
    job: JobSpec,
    reference: RunRecord,
    run: RunRecord,
    backend: Callable[[], Any],
    root: Path,
    *,
    uninterrupted: bool = False,
) -> StateDifference | None:
    """The first checkpoint written after a resume whose state differs from the reference's;
    ``uninterrupted``: ``run`` is a second uninterrupted run, whose own checkpoints are compared."""
    if not compares_state(job) or (len(run.attempts) < 2 and not uninterrupted):
        return None
    confined = confined_reader(job, backend() or SubprocessBackend(), root, Path(reference.workdir), Path(run.workdir))
    rules = DiffRules(
        ignore=state_diff_ignore(
            framework_of(job.framework, reference.attempts[0].of_kind("start") if reference.attempts else []),
            job.state_diff_ignore,
        ),
        exact_floats=job.exactness == "bit",
        runs=(reference.trained_in or str(reference.workdir), str(run.workdir)),
        restart_flags=restart_flags(job.command, job.resume_args, job.resume_command),
        identities=frozenset(repr(r) for r in logger_runs(reference.attempts) | logger_runs(run.attempts)),
        trained_elsewhere=tuple((a.index, a.trained_in) for a in run.attempts if a.trained_in is not None),
    )
    first = 0 if uninterrupted else 1
    return compare_kept(
        kept_dir(reference.workdir), kept_dir(run.workdir), confined=confined, rules=rules, first_attempt=first
    )

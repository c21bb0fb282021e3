"""Runs a job under a plan: start, watch the events, preempt at a step, restart, repeat.

The engine knows nothing of pytest or hypothesis: it receives a job, a plan and a working
directory, and returns a :class:`RunRecord`. Whatever happens (the trainer hangs, crashes,
writes garbage, or the caller is interrupted) every attempt is cleaned up before control
leaves, so no process of the job outlives the call.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace
from pathlib import Path

from ...backends import SubprocessBackend
from ...config.exit_status import SLURM
from ...config.jobs import JobSpec
from ...config.placeholders import working_folder
from ...errors import JobError
from ...faults import slurm, traits
from ...faults.plan import Plan, Preemption
from ..multirank.group_restarts import split_group_restarts
from ..state.kept import kept_dir
from ..trajectory import Attempt, FaultRecord, RunRecord
from .attempt import AttemptRun
from .damage import damage_newest
from .environment import RunContext, attempt_folder
from .options import EngineOptions
from .warmth import as_attempt

log = logging.getLogger("spotchaos")


def run_job(job: JobSpec, plan: Plan, workdir: Path, options: EngineOptions) -> RunRecord:
    """Run ``job`` under ``plan`` in ``workdir`` (created; holds checkpoints, events and logs).

    The checkpoint location is always a fresh directory inside ``workdir``: the harness works on
    its own copies and never touches a checkpoint it did not create.
    """
    backend = options.backend or SubprocessBackend(warm=options.warm)
    workdir.mkdir(parents=True, exist_ok=False)
    workdir = workdir.resolve()  # resolved once, now, while only the harness has touched it
    checkpoints = workdir / "checkpoints"
    checkpoints.mkdir()
    if options.keep_checkpoints:
        kept_dir(workdir).mkdir()  # the harness's own, made before the job starts: never a link the job made
    run_id = uuid.uuid4().hex[:12]
    cwd = working_folder(job.cwd, options.root, checkpoints)
    if not cwd.is_dir():
        raise JobError(f"{job.where('cwd')}: directory {cwd} does not exist")
    started = time.monotonic()
    attempts: list[Attempt] = []
    if options.prefix is not None:  # steps 0..c are the reference's: the first attempt resumes from its copy
        options.prefix.restore(checkpoints)
        attempts.append(options.prefix.attempt(checkpoints))
    first = len(attempts)
    convention = options.convention  # None until a log-adapter job's uninterrupted run teaches it
    tail_of = None
    for index in range(first, len(plan.preemptions) + 1 + first):
        number = index - first  # the plan's preemption this attempt receives
        preemption = plan.preemptions[number] if number < len(plan.preemptions) else None
        if index > 0 and options.before_restart is not None:
            swapped = options.before_restart(index)  # e.g. the storage refuses the restarted job's credentials
            if swapped:
                options = replace(options, extra_env=(*options.extra_env, *swapped.items()))
        previous = attempts[-1] if attempts else None
        resharded = index > 0 and options.resume_nproc is not None
        attempt_job = replace(job, nproc_per_node=options.resume_nproc) if resharded else job
        attempt_job = as_attempt(attempt_job, restart=index > first)
        tail_key = _tail_key(options, index, preemption, previous, checkpoints)
        tail = options.tails.find(tail_key) if tail_key is not None and options.tails is not None else None
        if tail is not None:  # another plan's last attempt began on these very files: its events, not a rerun
            attempts.append(options.tails.replay(tail, workdir))
            tail_of = tail.describe()
            log.info("job %s, plan %s, attempt %d: the tail of %s, reused", job.name, plan, index, tail_of)
            break
        context = RunContext(workdir, cwd, checkpoints, run_id, backend)
        attempt, learned = AttemptRun(attempt_job, index, preemption, context, options, previous).run()
        attempts.append(attempt)
        if tail_key is not None and options.tails is not None:
            options.tails.keep(tail_key, attempt, str(plan), workdir)
        if job.platform in SLURM:  # whether it asked for its restart, as the stand-in's scontrol recorded
            slurm_id = slurm.job_id(run_id, index, requeue=job.platform == "slurm-requeue")
            attempt.requeued = slurm.requeued(attempt_folder(context, index), slurm_id)
        convention = convention or learned
        log.info("job %s, plan %s, attempt %d: %s", job.name, plan, index, _attempt_line(attempt))
        if preemption is not None and traits(preemption.fault).reruns and attempt.final is not None:
            attempt.fault = _rerun_record(attempt)  # finished: started again on the same checkpoints
            continue
        if attempt.fault is None or attempt.final is not None:
            break  # finished (or failed without a preemption: the verdict says which)
        if job.kind.cluster_ranks and attempt.exit_code == 0:
            break  # Ray Train called the run finished (its train function returned): nothing starts it again
        if preemption is not None and preemption.damage:
            attempt.damage = damage_newest(preemption.damage, preemption.pick, attempts, checkpoints)
    unfired, not_reached = _unfired(plan, attempts[first:])
    if job.multi_rank:  # torchrun's agent or Ray Train restarted the worker group inside a launch
        attempts = split_group_restarts(attempts)
    log.info("job %s, plan %s: %d attempt(s) in %.1f s", job.name, plan, len(attempts), time.monotonic() - started)
    return RunRecord(
        job=job.name,
        plan=str(plan),
        attempts=attempts,
        wall_seconds=time.monotonic() - started,
        workdir=str(workdir),
        unfired=unfired,
        not_reached=not_reached,
        convention=convention.report(job.log) if convention is not None and job.log is not None else None,
        prefix_step=options.prefix.step if options.prefix is not None else None,
        tail_of=tail_of,
    )


def _tail_key(
    options: EngineOptions, index: int, preemption: Preemption | None, previous: Attempt | None, checkpoints: Path
) -> str | None:
    """The key of a restart with no fault left in it (reference/tails.py), where the run may reuse tails."""
    if options.tails is None or preemption is not None or previous is None or previous.fault is None:
        return None
    environment = (
        options.extra_env,
        options.keep_checkpoints,
        options.trace_fs,
        options.judge_restarts,
        options.resume_nproc,
        repr(options.convention),
    )
    return options.tails.key(options.tails_key, index, checkpoints, environment)


def _rerun_record(attempt: Attempt) -> FaultRecord:
    """A ``rerun``: the attempt finished on its own; the next starts on what it left."""
    last = attempt.steps[-1].step if attempt.steps else attempt.final["step"]
    return FaultRecord(
        fault="rerun",
        planned_step=last,
        observed_step=last,
        delivered_at=attempt.wall_seconds,
        delivered_wall=time.time(),
        grace_seconds=None,
        detail="started again after it finished",
    )


def _attempt_line(attempt: Attempt) -> str:
    """What happened to one attempt, for the log: the fault and where it landed, the exit, the time."""
    fault = attempt.fault
    if fault is None:
        what = "no fault"
    elif traits(fault.fault).armed_by_environment:
        what = f"{fault.fault} {fault.detail}"
    else:
        inside = f", inside {fault.inside}" if fault.inside else ""
        what = f"{fault.fault} sent after step {fault.observed_step}{inside}"
    return f"{what}; exit {attempt.exit_code} after {attempt.wall_seconds:.1f} s"


CRASH_POINT_TRIES = 3  # runs of one plan whose crash point, counted from a step, did not fire


def missed_crash_point(plan: Plan, record: RunRecord, failures: list[str]) -> bool:
    """Whether the run's only failures are crash points counted from a step (``crash@S+N``) that
    never fired: the job made fewer file-system events after that step than its reference did (a
    checkpoint written in a thread lands before or after a step by its timing). Such a run tested
    nothing, and says nothing of the job; any other failure is evidence and stands."""
    counted = {str(p) for p in plan.preemptions if p.fs_event is not None and p.after_step is not None}
    missed = [u for u in record.unfired if u.split(" never fired", 1)[0] in counted]
    return bool(missed) and len(missed) == len(record.unfired) == len(failures)


def _unfired(plan: Plan, attempts: list[Attempt]) -> tuple[list[str], list[str]]:
    """The planned preemptions that never reached the job: (those whose attempt ran without them:
    the plan proved nothing about them; those whose attempt never started because an earlier,
    preempted one finished the training, which a search's plan may well outrun)."""
    unfired, not_reached = [], []
    for number, planned in enumerate(plan.preemptions):
        attempt = attempts[number] if number < len(attempts) else None
        index = attempt.index if attempt is not None else number + (attempts[0].index if attempts else 0)
        if attempt is None:
            last = attempts[-1].index if attempts else 0
            not_reached.append(f"{planned} (attempt {index}): training finished in attempt {last}")
        elif attempt.fault is not None or attempt.failed_restart:
            continue  # fired; or the attempt failed to restart, which the verdict says instead
        elif not attempt.steps and attempt.final is not None:  # resumed after the last step: nothing to preempt
            not_reached.append(f"{planned} (attempt {index}): no training was left when it started")
        elif planned.fs_event is not None:
            since = "" if planned.after_step is None else f" after step {planned.after_step}"
            unfired.append(
                f"{planned} never fired: attempt {index} made fewer than {planned.fs_event} file-system events{since} "
                "under its checkpoint directory (crash@N counts those events, not steps)"
            )
        elif planned.phase is not None and (attempt.steps and attempt.steps[-1].step >= planned.at_step):
            unfired.append(
                f"{planned} never fired: attempt {index} began no {planned.phase!r} phase after step "
                f"{planned.at_step} (its probe's phase({planned.phase!r}) marks one) before it ended after step "
                f"{attempt.steps[-1].step}"
            )
        else:
            last = attempt.steps[-1].step if attempt.steps else None
            reached = last is not None and last >= planned.at_step
            unfired.append(
                f"{planned} never fired: attempt {index} ran to its end (step {last}) before the harness could "
                "deliver it"
                if reached
                else f"{planned} never fired: attempt {index} ended after step {last}, before step {planned.at_step}"
            )
    return unfired, not_reached

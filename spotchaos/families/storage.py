"""Storage faults on S3 checkpoints: a SlowDown storm, resets mid-upload, a kill inside a slow
upload, and refused credentials (a key moto never issued, a read-only key, a token that expires).

Each scenario runs the job on the session's S3 (moto behind the fault proxy, on 127.0.0.1) and
fails when a checkpoint is lost or torn, a checkpoint holds training up past its budget, the job
fails unclearly, or a secret the harness handed out shows up in anything it captured.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..budgets.overhead import checkpoint_blocking
from ..config.jobs import JobSpec
from ..core import Core, StorageChaos
from ..errors import JobError, ScenarioFailure, SpotchaosError
from ..faults.plan import Plan, Preemption
from ..probe import ENV_CHECKPOINT_URI
from ..record import note_plans, note_run, note_storage
from ..safety.redact import find_leaks, leaking_files, redact
from ..training.trajectory import RunRecord
from ..training.verdict import Verdict, judge

if TYPE_CHECKING:
    from ..storage import CredentialSwap, Fault


class StorageFailure(ScenarioFailure):
    """Under a storage fault the job lost a checkpoint, blocked too long, failed unclearly or leaked
    its secret."""


TORN_HINT = (
    "An interrupted upload must never become the checkpoint a restart loads: upload the data objects "
    "first, then the manifest, then the latest pointer, and resume from the newest checkpoint whose "
    "manifest verifies."
)
RNG_HINT = (
    "The loss changed before any preemption: the storage retries drew from the training's random numbers "
    "(botocore's retry jitter calls Python's global random.random). Keep I/O away from the training RNG: "
    "save and restore random.getstate() around storage calls, or give the augmentation a random.Random of its own."
)
UPLOAD_SECONDS = 1.0  # how long the slowed upload of one checkpoint takes when a kill is aimed inside it
TORN_AFTER_BYTES = 1024  # the kill waits for an upload this far along: a pointer or a manifest is smaller
STORAGE_HINT = (
    "A storage error during a checkpoint must be retried (boto3's standard retry mode) or the checkpoint "
    "given up within the budget and reported (probe.checkpoint_failed) while training goes on; it must "
    "never end the job nor become the checkpoint a restart loads."
)


def _require_s3(job: JobSpec) -> None:
    if job.storage != "s3":
        raise SpotchaosError(f'job {job.name!r} does not checkpoint to S3: add storage = "s3" to it')


def check_storage(core: Core, job: JobSpec, plan: Plan | str, faults: Sequence[Fault]) -> dict[str, Any]:
    """Run ``plan`` with storage ``faults`` on for the whole run (a SlowDown storm, resets
    mid-upload): every verdict must hold, and no checkpoint may hold training up longer than
    ``job.checkpoint_budget_seconds``; a checkpoint the job gives up and reports
    (``probe.checkpoint_failed``) is allowed. A fault that never acted fails the scenario as
    meaningless rather than letting it pass."""
    _require_s3(job)
    plan = Plan.parse(plan) if isinstance(plan, str) else plan
    reference = core.reference(job)
    proxy = core.s3.proxy
    before = dict(proxy.injected)
    workdir = core.next_dir(f"{job.name}-storage")
    names = ", ".join(f.name for f in faults)
    try:
        run = core.execute(job, plan, workdir, storage=StorageChaos(faults))
    except JobError as exc:
        figures = {"scenario": "storage faults", "faults": names, "plan": str(plan)}
        problems = [str(exc), STORAGE_HINT, *_leak_problems(workdir, core.secrets_of(job))]
        _storage_verdict(figures, problems, f"job {job.name!r} under {names} ({plan}): ")
        raise  # not reached: the problems above are never empty
    acted = {f.name: proxy.injected.get(f.name, 0) - before.get(f.name, 0) for f in faults}
    idle = [name for name, count in acted.items() if not count]
    if idle:
        raise SpotchaosError(
            f"job {job.name!r}: {', '.join(idle)} never acted: the job made no S3 request it applies to "
            "(does it checkpoint through AWS_ENDPOINT_URL?)"
        )
    verdict = judge(reference, run, faulted_from_start=True)
    budget = job.checkpoint_budget_seconds
    blocking = checkpoint_blocking(run, unexplained_over=budget)
    problems = [] if verdict.passed else [verdict.message()]
    divergence = verdict.first_divergence
    if divergence is not None and divergence.resumed_from is None:
        problems.append(RNG_HINT)
    for item in blocking:
        if item["seconds"] > budget:
            what = {"durable": "the checkpoint", "given up": "the abandoned checkpoint"}.get(item["outcome"])
            what = what or "an unreported pause (no checkpoint event)"
            problems.append(
                f"{what} after step {item['step']} held training up for {item['seconds']:.1f} s, over the "
                f"checkpoint budget of {budget:g} s (checkpoint_budget_seconds)"
            )
    if problems:
        problems.append(STORAGE_HINT)
    figures = {
        "scenario": "storage faults",
        "faults": names,
        "plan": str(plan),
        "acted": acted,
        "checkpoints": blocking,
        "budget_seconds": budget,
    }
    return _storage_outcome(core, job, _Judged(plan, run, verdict, reference), figures, problems, names)


def check_upload_preemption(core: Core, job: JobSpec) -> dict[str, Any]:
    """Kill the job while a checkpoint is uploading (its uploads slowed to take about
    ``UPLOAD_SECONDS``; the kill waits for the step that starts the second checkpoint and for an
    object upload part-way through): the previous checkpoint must stay the newest valid one,
    and the restart must resume from it bit-exact."""
    _require_s3(job)
    reference = core.reference(job)
    saves = reference.attempts[0].of_kind("checkpoint")
    if len(saves) < 2:
        raise SpotchaosError(f"job {job.name!r} made fewer than 2 checkpoints: none would be left to resume from")
    torn, size = saves[1]["step"], saves[1]["bytes"]
    rate = max(size / UPLOAD_SECONDS, 1024.0)
    plan = Plan((Preemption(torn, "sigkill"),))
    from ..storage import Bandwidth

    workdir = core.next_dir(f"{job.name}-torn-upload")
    try:
        run = core.execute(
            job,
            plan,
            workdir,
            storage=StorageChaos([Bandwidth(rate, downloads=False)]),
            preempt_when=lambda: core.s3.proxy.uploading(at_least=TORN_AFTER_BYTES),  # inside a data upload
        )
    except JobError as exc:
        figures = {"scenario": "preempted during a slow upload", "plan": str(plan), "torn_step": torn}
        problems = [f"killed while the checkpoint after step {torn} was uploading: {exc}", TORN_HINT]
        problems += _leak_problems(workdir, core.secrets_of(job))
        _storage_verdict(figures, problems, f"job {job.name!r}: ")
        raise  # not reached: the problems above are never empty
    if torn in [e["step"] for e in run.attempts[0].of_kind("checkpoint")]:
        raise SpotchaosError(
            f"job {job.name!r}: the checkpoint after step {torn} finished uploading before the kill "
            f"({size} bytes at {rate:.0f} B/s): nothing was torn, the scenario proves nothing"
        )
    verdict = judge(reference, run, faulted_from_start=True)
    problems = []
    if not verdict.passed:
        problems = [
            f"killed while the checkpoint after step {torn} was uploading: {verdict.message()}",
            TORN_HINT,
        ]
    resumed = [e["from_step"] for a in run.attempts[1:] for e in a.of_kind("resume")]
    figures = {
        "scenario": "preempted during a slow upload",
        "faults": f"bandwidth {rate:.0f} B/s + sigkill@{torn}",
        "plan": str(plan),
        "torn_step": torn,
        "resumed_from": resumed,
    }
    judged = _Judged(plan, run, verdict, reference)
    return _storage_outcome(core, job, judged, figures, problems, "a slow upload")


@dataclass(frozen=True)
class _Judged:
    """One run of a plan and its verdict against the reference, as the report notes it."""

    plan: Plan
    run: RunRecord
    verdict: Verdict
    reference: RunRecord


def _storage_outcome(
    core: Core, job: JobSpec, judged: _Judged, figures: dict[str, Any], problems: list[str], names: str
) -> dict[str, Any]:
    """Leaks added to the problems, the run noted and judged, its folder discarded: the figures."""
    run = judged.run
    problems = [*problems, *_leak_problems(run.workdir, core.secrets_of(job))]
    note_run(judged.plan, run, judged.verdict, judged.reference)
    _storage_verdict(figures, problems, f"job {job.name!r} under {names}: ")
    core.discard(run)
    return figures


def check_storage_refusal(core: Core, job: JobSpec, fault: Fault | CredentialSwap) -> dict[str, Any]:
    """S3 refuses the restarted job (a key it never issued, a read-only key, a token that
    expires): it must end with a non-zero exit and a message naming the problem, change no
    checkpoint object that existed when the refusals began, and show no secret anywhere the
    harness captured.

    The run: hard kill after the first checkpoint; then ``fault`` on (a proxy fault) or the
    restart handed other credentials (a :class:`CredentialSwap`, refused by moto's own IAM);
    the restart must fail. Returns the figures for the report.
    """
    from ..storage import CredentialSwap

    _require_s3(job)
    steps = core.checkpoint_steps(job)
    if not steps:
        raise SpotchaosError(f"job {job.name!r} reported no checkpoint: nothing to refuse")
    service = core.s3
    buckets: list[str] = []
    before: dict[str, str] = {}  # object key -> sha256 when the refusals began
    secrets: list[str] = []

    def evidence() -> None:
        before.clear()
        before.update(service.object_digests(buckets[0]))

    def refuse(index: int, storage_env: Mapping[str, str]) -> Mapping[str, str] | None:
        buckets.append(storage_env[ENV_CHECKPOINT_URI].removeprefix("s3://").split("/")[0])
        secrets.append(storage_env["AWS_SECRET_ACCESS_KEY"])
        evidence()
        if isinstance(fault, CredentialSwap):  # the swapped key cannot write: the state now is the evidence
            swapped = fault.credentials(service)
            secrets.append(swapped.secret_key)
            core.secrets.append(swapped.secret_key)
            return {"AWS_ACCESS_KEY_ID": swapped.access_key, "AWS_SECRET_ACCESS_KEY": swapped.secret_key}
        # a token expiring mid-run: what the restart wrote before it expired is legitimate
        service.proxy.on_first_action(fault, evidence)
        fault.enabled = True
        service.add(fault)
        return None

    if not isinstance(fault, CredentialSwap):
        fault.enabled = False
    workdir = core.next_dir(f"{job.name}-refused")
    problems: list[str] = []
    message = ""
    try:
        kill = Plan((Preemption(steps[0] + 1, "sigkill"),))
        core.execute(job, kill, workdir, storage=StorageChaos(before_restart=refuse))
        problems.append(f"the restarted job finished although S3 refused it ({fault.name}): did it checkpoint?")
    except JobError as exc:
        message = str(exc)
    finally:
        if not isinstance(fault, CredentialSwap):
            fault.enabled = False
            service.remove(fault)
    after = service.object_digests(buckets[0]) if buckets else {}
    changed = sorted(k for k in before if after.get(k) != before[k])
    if changed:
        problems.append(f"checkpoint objects that existed before changed or vanished: {', '.join(changed[:5])}")
    leaks = sorted(leaking_files(Path(workdir), secrets) + find_leaks({"the harness's message": message}, secrets))
    problems += _leak_problem(leaks)
    if message and " with status " not in message:
        problems.append(f"the job did not end with a non-zero exit: {message.splitlines()[0]}")
    figures = {
        "scenario": "credentials refused",
        "fault": fault.name,
        "job_message": redact(message, secrets),
        "objects_before": len(before),
        "objects_changed": changed,
        "leaks": leaks,
    }
    note_plans(1, add=True)
    _storage_verdict(figures, problems, f"job {job.name!r} under {fault.name}: ", joiner="; ")
    if not core.keep_passing:
        shutil.rmtree(workdir, ignore_errors=True)
    return figures


def _leak_problems(workdir: Path | str, secrets: Sequence[str]) -> list[str]:
    """A problem naming every file of a run (whatever its name) holding a secret, if any does."""
    return _leak_problem(leaking_files(Path(workdir), secrets))


def _leak_problem(leaks: list[str]) -> list[str]:
    return (
        [f"the run's secret (or 8 characters of it, or its encoding) appears in: {', '.join(leaks)}"] if leaks else []
    )


def _storage_verdict(figures: dict[str, Any], problems: list[str], prefix: str, joiner: str = " ") -> None:
    """Record a storage scenario's figures (with its problems, for the report) and fail on any."""
    figures["passed"] = not problems
    if problems:
        figures["problems"] = problems
    note_storage(figures)
    if problems:
        raise StorageFailure(prefix + joiner.join(problems))

"""The reference's prefix, shared: a plan whose first fault comes after checkpoint c starts from a
copy of the reference's checkpoint folder as checkpoint c left it, instead of training steps 0..c
again, which the reference has already trained bit for bit.

Why it is still a real test: the run's first attempt is the job's own resume command on real
files, judged like any resume (every step after c bit for bit, the final weights, the state diff
of its checkpoints); steps 0..c are credited to the reference, as a synthetic attempt 0 whose
events are the reference's own (``start_kind = "prefix"``: no process, no start, nothing trained).

How the copies stay true to the moment: the reference run holds after each checkpoint it reports
(``probe.CheckpointHold``) while the harness copies the folder (``Snapshots.take``); a copy is
kept only if the job announced that hold, nothing in the folder changed while it was copied, and
no file in it is newer than the checkpoint's event. Everything is read and written through
``safefs`` (no link followed; ``copy_file_range`` shares blocks where the file system can).

What never takes a prefix (``why_not``): a job whose steps come from its printed lines (only the
probe holds a job at its checkpoints), several ranks, a container, Ray, S3 checkpoints, ``prefix =
false``; a plan whose point is the job's early life (a fault before the first checkpoint, a crash
point counted from the first attempt's start); and a job whose checkpoint names the reference's own
folder (``Snapshots.refused``): a run started from the copy would read another run's files.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ...config.jobs import JobSpec
from ...faults import traits
from ...faults.plan import Plan
from ...safety.safefs import Folder, UnsafeFile, copy_contents, listing, read_bounded, regular_files
from ..engine.hold import CheckpointHold
from ..engine.options import FS_OUTSIDE
from ..frameworks import framework_of, paths_never_followed
from ..state.confined.state_diff import flatten
from ..state.formats import AsBytes, NeedsConfinement, load_state
from ..state.kept import MTIME_SLACK_NS
from ..trajectory import Attempt, RunRecord

SNAPSHOTS_SUFFIX = ".snapshots"
HELD_WITHIN_SECONDS = 2.0  # the job announces its hold right after the event the harness read
SCAN_BYTES = 64 << 20  # of each snapshot file, what is searched for the reference's own folder
BUDGET_SHARE_OF_FREE_DISK = 4  # the default snapshot budget: a quarter of the free disk


def snapshots_dir(workdir: Path | str) -> Path:
    """Where the reference's snapshots go: beside its folder, not in it (the job may write in its
    folder; it never reaches this one)."""
    workdir = Path(workdir)
    return workdir.parent / f"{workdir.name}{SNAPSHOTS_SUFFIX}"


def why_not(job: JobSpec) -> str | None:
    """Why ``job`` never starts a plan from the reference's prefix; None when it may."""
    if not job.prefix:
        return "prefix = false"
    if job.log is not None:
        return "its steps are read from its printed lines (only the probe holds a job at its checkpoints)"
    if not job.kind.one_process:
        return f"a {job.launcher} job"
    if job.container is not None:
        return "it runs in a container"
    if job.backend != "subprocess":
        return f"it runs on {job.backend}"
    if job.storage == "s3":
        return "its checkpoints are in S3"
    return None


def default_budget(folder: Path) -> int:
    """A quarter of the free disk where the snapshots go."""
    return shutil.disk_usage(folder).free // BUDGET_SHARE_OF_FREE_DISK


@dataclass
class Snapshots:
    """The reference run's copies of its checkpoint folder, one per checkpoint step."""

    folder: Path  # made by the harness beside the reference's folder
    budget: int  # bytes all copies may take together
    taken: dict[int, Path] = field(default_factory=dict)
    used: int = 0
    refused: str | None = None  # why this job takes no prefix after all, in one line
    skipped: dict[int, str] = field(default_factory=dict)  # a checkpoint not copied, and why
    # each copy's names and sizes as made: a copy that no longer matches explains a run from it
    # failing where the slow path passed (a harness defect, never the job's: training/shortcuts.py)
    manifests: dict[int, tuple[tuple[str, int], ...]] = field(default_factory=dict)

    def manifest(self, step: int) -> tuple[tuple[str, int], ...]:
        """The copy after ``step`` as it was made (a copy read from the cache: as first used)."""
        if step not in self.manifests:
            self.manifests[step] = manifest_of(self.taken[step])
        return self.manifests[step]

    def take(self, event: dict[str, Any], checkpoints: Path, hold: CheckpointHold) -> None:
        """Copy ``checkpoints`` as the checkpoint ``event`` reports left it, while the job holds."""
        step = event.get("step")
        try:
            if isinstance(step, int) and self.refused is None:
                if hold.held_at(step, HELD_WITHIN_SECONDS):
                    self._copy(step, event, checkpoints)
                else:  # its events come without the probe (or an older one): no later checkpoint is waited for
                    self.refused = (
                        f"the job did not hold after its checkpoint after step {step} (its events are not written by "
                        "this version's spotchaos.probe): no copy of its checkpoints is consistent"
                    )
        finally:
            hold.release()  # one byte a checkpoint: the job goes on whether or not it was copied

    def _copy(self, step: int, event: dict[str, Any], checkpoints: Path) -> None:
        target = self.folder / f"s{step}"
        if self.taken.pop(step, None) is not None:  # the step reported again (Lightning's last.ckpt after
            self.used -= _bytes(target)  # its named one): the copy is the folder as the last report left it,
            shutil.rmtree(target)  # or none (a plan's first attempt holds the events through that report)
        before = listing(checkpoints)
        t = event.get("t")
        if isinstance(t, int | float) and any(mtime > int(t * 1e9) + MTIME_SLACK_NS for _, _, mtime, _ in before):
            self.skipped[step] = "the folder changed after the checkpoint was reported"
            return
        size = sum(entry[1] for entry in before)
        if self.used + size > self.budget:
            self.refused = (
                f"the snapshot after step {step} would take the copies to {self.used + size} bytes, over "
                f"snapshot_budget ({self.budget} bytes): no prefix from it or a later checkpoint"
            )
            return
        target.mkdir()
        try:
            copy_contents(checkpoints, target)
        except (OSError, UnsafeFile) as exc:
            shutil.rmtree(target, ignore_errors=True)
            self.skipped[step] = f"not copied: {exc}"
            return
        if listing(checkpoints) != before:
            shutil.rmtree(target, ignore_errors=True)
            self.skipped[step] = "the folder changed while it was copied"
            return
        self.taken[step] = target
        self.manifests[step] = manifest_of(target)
        self.skipped.pop(step, None)  # an earlier report of the step was not copied; its last one was
        self.used += size

    def check_names(self, reference_folder: Path, never_followed: tuple[str, ...] = ()) -> None:
        """Refuse every prefix of a job whose checkpoint names a path inside the reference's own
        folder (an absolute ``latest`` pointer, say): a run started from the copy would read the
        reference's files, not its own. The folder's own name alone is no such path (transformers'
        ``training_args.bin`` keeps its ``output_dir``; no resume reads another run's files by it),
        nor is a path only in entries the job's framework never follows from another folder
        (``never_followed``: Lightning's ModelCheckpoint bookkeeping, ``frameworks.PATHS_NEVER_FOLLOWED``)."""
        needle = os.path.join(reference_folder, "")
        for step, snapshot in sorted(self.taken.items()):
            for file in regular_files(snapshot):
                if os.fsencode(needle) not in read_bounded(file, SCAN_BYTES):
                    continue
                if never_followed and _named_only_in(file, needle, never_followed):
                    continue
                self.refused = (
                    f"its checkpoint after step {step} ({file.relative_to(snapshot)}) names a path inside the "
                    f"reference run's own folder {reference_folder}: a run started from a copy would read another "
                    "run's files"
                )
                self.drop()
                return

    def check_outside(self, log: Path) -> None:
        """Refuse every prefix of a job whose reference wrote outside its checkpoint folder (a side
        file in its run folder, a file it created in its working folder): a copy holds the
        checkpoint folder alone, so a resume from it would not be the job's real one. Written by the
        crash-point hook (``SPOTCHAOS_OUTSIDE_LOG``); what every run sees alike is not in it."""
        if self.refused is not None or not log.is_file():
            return
        for line in read_bounded(log, SCAN_BYTES).decode("utf-8", "replace").splitlines():
            try:
                written = json.loads(line)
            except ValueError:
                continue
            if isinstance(written, dict) and isinstance(written.get("path"), str):
                step = written.get("step")
                when = f"after step {step}" if isinstance(step, int) else "before its first step"
                self.refused = (
                    f"its uninterrupted run wrote {written['path']} outside its checkpoint folder "
                    f"({written.get('event')} {when}): a run started from a copy of the checkpoint folder alone "
                    "would not see it, so every plan starts from step 0"
                )
                self.drop()
                return

    def drop(self) -> None:
        for snapshot in self.taken.values():
            shutil.rmtree(snapshot, ignore_errors=True)
        self.taken.clear()
        self.used = 0

    def describe(self) -> dict[str, Any]:
        """For the report: the steps a plan may start after, their bytes, what was skipped or refused."""
        return {
            "steps": sorted(self.taken),
            "bytes": self.used,
            "budget": self.budget,
            "skipped": {str(k): v for k, v in sorted(self.skipped.items())},
            "refused": self.refused,
        }


def _named_only_in(file: Path, needle: str, entries: tuple[str, ...]) -> bool:
    """Whether every entry of ``file`` whose name or value holds ``needle`` is one of ``entries``
    (patterns). Read as the state diff reads it (``torch.load(weights_only=True)``, JSON, ...): a
    file it cannot read is taken to name the path anywhere."""
    try:
        _, state = load_state(file)
    except (AsBytes, NeedsConfinement, OSError, UnsafeFile):
        return False
    for entry, value in flatten(state).items():
        values = value if isinstance(value, list) else [value]
        texts = [entry, *(v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values)]
        texts = [text for text in texts if isinstance(text, str)]  # a path kept as bytes counts as well
        if any(needle in text for text in texts) and not any(fnmatch.fnmatchcase(entry, p) for p in entries):
            return False
    return True


def manifest_of(folder: Path) -> tuple[tuple[str, int], ...]:
    """The names and sizes below ``folder``, no link followed."""
    return tuple((name, size) for name, size, _, _ in listing(folder))


def _bytes(folder: Path) -> int:
    return sum(os.lstat(f).st_size for f in regular_files(folder))


@dataclass(frozen=True)
class Prefix:
    """A plan's start from the reference's checkpoint after ``step``."""

    step: int
    snapshot: Path
    reference: RunRecord
    reference_checkpoints: Path
    manifest: tuple[tuple[str, int], ...] = ()

    def changed(self) -> str | None:
        """How the copy differs from what it was when made (None: it does not): a run from it then
        did not start from the reference's folder, and what it failed says nothing of the job."""
        now = dict(manifest_of(self.snapshot))
        was = dict(self.manifest)
        gone = sorted(set(was) - set(now))
        if gone:
            return f"{gone[0]} was gone from the copy after step {self.step}"
        resized = sorted(name for name in was if now[name] != was[name])
        if resized:
            return f"{resized[0]} in the copy after step {self.step} was {was[resized[0]]} bytes, now {now[resized[0]]}"
        added = sorted(set(now) - set(was))
        return f"{added[0]} was added to the copy after step {self.step}" if added else None

    def restore(self, checkpoints: Path) -> None:
        """The run's (empty, new) checkpoint folder made a copy of the snapshot."""
        copy_contents(self.snapshot, checkpoints)

    def attempt(self, checkpoints: Path) -> Attempt:
        """Attempt 0 of the run: the reference's events through its last report of the checkpoint
        after ``step`` (Lightning reports ``last.ckpt`` after the named file of the same step; a
        checkpoint written in a thread is reported steps later), its checkpoints' addresses moved
        into this run's folder, without the steps trained meanwhile: the copy is the folder as that
        report left it, and the run trains every step after ``step``. Nothing ran: no start, no
        seconds."""
        source = self.reference.attempts[0]
        events: list[dict[str, Any]] = []
        through = 0  # the events up to the step's last checkpoint report
        for event in source.events:
            if event["event"] == "final":
                break
            if event["event"] == "step" and event["step"] > self.step:
                continue
            if event["event"] == "checkpoint":
                event = {**event, "uri": moved_uri(event["uri"], self.reference_checkpoints, checkpoints)}
                through = len(events) + 1 if event["step"] == self.step else through
            events.append(event)
        return Attempt(
            index=0,
            exit_code=None,
            wall_seconds=0.0,
            start_seconds=None,
            started_wall=source.started_wall,
            events=events[:through],
            start_kind="prefix",
        )


def moved_uri(uri: str, source: Path, target: Path) -> str:
    """A checkpoint's address under the folder ``source`` as the same file under ``target`` (a copy
    of it); an address outside it is left as it is: the run's checks say so, as they would of the
    run that wrote it."""
    parsed = urlparse(uri)
    path = Path(os.path.normpath(unquote(parsed.path) or "."))
    if parsed.scheme not in ("", "file") or not path.is_relative_to(source):
        return uri
    return (target / path.relative_to(source)).as_uri()


def ready_steps(reference: RunRecord) -> dict[int, int]:
    """For each checkpoint step of the reference, the last step it had reported when it last
    reported that checkpoint: the step itself where it saves in its loop, a later one where it
    writes in a thread (``AsyncCheckpointIO``, ``dcp.async_save``) and reports once the write is
    done. A fault at a step no later than that finds the checkpoint not yet durable in the
    reference, and its file-system events may be that save's: its plan cannot start from the copy."""
    ready: dict[int, int] = {}
    last = -1
    for event in reference.attempts[0].events if reference.attempts else []:
        if event["event"] == "final":
            break
        if event["event"] == "step" and isinstance(event.get("step"), int):
            last = max(last, event["step"])
        elif event["event"] == "checkpoint" and isinstance(event.get("step"), int):
            ready[event["step"]] = max(last, event["step"])
    return ready


def choose(
    plan: Plan, snapshots: Snapshots | None, last_step: int | None = None, ready: dict[int, int] | None = None
) -> int | None:
    """The newest snapshot before the plan's first fault; None for a plan that starts from step 0.
    A plan that first reruns the job once it finished (``rerun``) starts from the newest snapshot
    before the reference's ``last_step``: its first attempt still trains, and ends, as a run does."""
    if snapshots is None or snapshots.refused is not None or not snapshots.taken or not plan.preemptions:
        return None
    head = plan.preemptions[0]

    def done(step: int) -> int:  # the step after which the reference had reported the checkpoint of ``step``
        return (ready or {}).get(step, step)

    if traits(head.fault).reruns:
        before_end = [step for step in snapshots.taken if last_step is not None and done(step) < last_step]
        return max(before_end) if before_end else None
    if head.fs_event is not None and head.after_step is None:
        return None  # crash@N counts the first attempt's file-system events from its start (crash@S+N: from step S)
    # (a crash point of a later fault counts its own attempt's events: the same from either start)
    first = head.after_step if head.after_step is not None else head.at_step
    before = [step for step in snapshots.taken if done(step) < first]
    return max(before) if before else None


def open_snapshots(workdir: Path, budget: int | None) -> Snapshots:
    """The reference's snapshot folder, made new beside its folder (never one that was there)."""
    folder = snapshots_dir(workdir)
    folder.mkdir(mode=0o700)
    with Folder.open(folder):  # a real folder, not a link
        pass
    return Snapshots(folder, budget if budget is not None else default_budget(folder))


def held_key(job: JobSpec) -> str:
    """What a session keeps a job's reference, passed plans, snapshots and claims by: the job's key
    (what shapes its trajectory) and how its runs are made. A twin of the same command on another
    backend, or with prefixes off, has its reference taken without the snapshots and file-system
    events the other starts its plans from, and its faults delivered another way (a Ray node
    drained, not a process signalled): sharing one reference, the twin run first left the other
    without prefixes; sharing the claim of a fresh start, it left the other with none."""
    return f"{job.key()}:{job.backend}:{'prefix' if why_not(job) is None else 'whole'}"


class Prefixes:
    """One session's snapshots, per job (``held_key``): opened with each reference, consulted for each plan,
    given up for a job once one of its plans fails (its search then shrinks from step 0)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled  # --spotchaos-prefix=off: every plan from step 0
        self._snapshots: dict[str, Snapshots] = {}
        self._claimed: dict[tuple[str, str], str] = {}  # (what, held_key) -> the plan that claimed it
        self._lock = threading.Lock()

    def claim_fresh_start(self, job: JobSpec, plan: Plan) -> bool:
        """Whether ``plan`` is (or already was) the session's first searched plan of ``job``: it runs
        from step 0.

        One plan from step 0 a job and session is what keeps its fresh start tested and compares a
        cached reference's prefix with the job's; every other plan may start from the reference's
        checkpoints. A plan of the job's early life (a fault before its first checkpoint, a crash
        point counted from the start) runs from step 0 whatever it is."""
        return self._claim("fresh start", job, plan)

    def claim_early_life(self, job: JobSpec, plan: Plan, reference: RunRecord) -> bool:
        """Whether ``plan`` may run as the session's plan of ``job``'s early life: False only where the
        job takes prefixes, ``plan`` could not (a fault before the first checkpoint, a crash point
        counted from the start) and another such plan of the job already ran. Each of them
        trains the whole job again for what the first already tested; a search sets it aside for
        another draw (``search._Cells``), as it does a plan of a cell it has covered."""
        snapshots = self._snapshots.get(held_key(job))
        if snapshots is None or snapshots.refused is not None or not snapshots.taken:
            return True  # every plan of the job starts from step 0: none costs more than another
        return self.start(job, plan, reference) is not None or self._claim("early life", job, plan)

    def _claim(self, what: str, job: JobSpec, plan: Plan) -> bool:
        with self._lock:
            claimed = self._claimed.setdefault((what, held_key(job)), str(plan))
            return claimed == str(plan)

    def open(self, job: JobSpec, workdir: Path) -> Snapshots | None:
        """The snapshot store for ``job``'s reference run, or None where it takes no prefix."""
        return open_snapshots(workdir, job.snapshot_budget) if self.enabled and why_not(job) is None else None

    def taken(self, job: JobSpec, reference: RunRecord, snapshots: Snapshots | None) -> None:
        """After the reference: refuse a checkpoint naming its folder; say on it what plans may start from."""
        if snapshots is not None:
            starts = reference.attempts[0].of_kind("start") if reference.attempts else []
            never_followed = paths_never_followed(framework_of(job.framework, starts))
            snapshots.check_names(Path(reference.workdir) / "checkpoints", never_followed)
            snapshots.check_outside(Path(reference.workdir) / "attempt-0" / FS_OUTSIDE)
            self._snapshots[held_key(job)] = snapshots
            reference.snapshots = snapshots.describe()
        elif self.enabled:
            reference.snapshots = {"steps": [], "refused": why_not(job)}

    def cached(self, job: JobSpec, reference: RunRecord, snapshots: Snapshots | None) -> None:
        """A reference read from the cache, with the snapshots it was kept with (already checked)."""
        if snapshots is not None:
            self._snapshots[held_key(job)] = snapshots
            reference.snapshots = snapshots.describe()

    def live(self, job: JobSpec) -> bool:
        """Whether ``job``'s runs may start from copies now: its reference's were taken, none refused
        (a checkpoint naming the reference's folder, a write outside its folder), no plan failed."""
        snapshots = self._snapshots.get(held_key(job))
        return snapshots is not None and snapshots.refused is None

    def start(self, job: JobSpec, plan: Plan, reference: RunRecord) -> Prefix | None:
        """Where ``plan`` may start: the reference's newest snapshot before its first fault."""
        snapshots = self._snapshots.get(held_key(job))  # a twin with prefixes off is another key, with none
        step = choose(plan, snapshots, reference.steps[-1].step if reference.steps else None, ready_steps(reference))
        if step is None or snapshots is None:
            return None
        checkpoints = Path(reference.workdir) / "checkpoints"
        return Prefix(step, snapshots.taken[step], reference, checkpoints, snapshots.manifest(step))

    def failed(
        self, job: JobSpec, reference: RunRecord, plan: Plan, tried: Prefix | None, verdict: Any, from_copy: Any = None
    ) -> None:
        """A plan of ``job`` failed (``verdict``, from step 0): no more prefixes for the job, and why,
        on its reference; a run from ``tried`` that failed (``from_copy``, the verdict of that run)
        where step 0 passed says so, with the first line of what failed there: a harness's false
        alarm on copies would show there, never as the job's failure. The copies stay until the
        reference goes: a plan running beside this one may be using one."""
        snapshots = self._snapshots.pop(held_key(job), None)
        if snapshots is None:
            return
        why = f"plan {plan} failed: every later plan of this job starts from step 0"
        if tried is not None and verdict.passed:
            said = from_copy.message().strip().splitlines()[0].lstrip("- ")[:300] if from_copy is not None else ""
            why = (
                f"plan {plan} failed from the reference's checkpoint after step {tried.step}"
                + (f" ({said})" if said else "")
                + " and passed from step 0: every later plan of this job starts from step 0"
            )
        reference.snapshots = {**snapshots.describe(), "refused": why}

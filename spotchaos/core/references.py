"""The uninterrupted runs every plan of a job is judged against, and what they taught.

One reference per job configuration and session: trained cold from step 0 (its checkpoints kept
for the state diff and copied for plans that start from them), or read from the reference cache
and then *proven*, never trusted: the first run that fails against a cached reference trains it
again and compares (``stale``). With it come the log adapter's step convention the reference
taught, the job's noise (``determinism_runs``, or a second uninterrupted run taken on a failure's
path only), and the references a fresh one replaced, removed at close.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..config.jobs import JobSpec
from ..errors import NotDeterministic, SpotchaosError
from ..faults.plan import Plan
from ..record import note_cached_reference
from ..training.determinism import HINT, Audit, Envelope
from ..training.determinism import audit as audit_runs
from ..training.judgement import state_difference, weights_distance
from ..training.logadapter import StepConvention, convention_from_dict
from ..training.reference.cache import Cached, ReferenceCache, reference_difference
from ..training.reference.prefix import Prefixes, held_key
from ..training.reference.prefix import why_not as why_no_prefix
from ..training.state.diff import StateDifference
from ..training.trajectory import RunRecord

log = logging.getLogger("spotchaos")


class Runs(Protocol):
    """What the references ask of the session that runs jobs (:class:`spotchaos.core.Core`)."""

    root: Path

    def execute(self, job: JobSpec, plan: Plan, workdir: Path, **options: Any) -> RunRecord: ...
    def next_dir(self, label: str) -> Path: ...
    def discard(self, run: RunRecord) -> None: ...
    def secrets_of(self, job: JobSpec) -> list[str]: ...
    def local_backend(self, job: JobSpec) -> Any: ...


def _audit_key(job: JobSpec) -> str:
    return f"{held_key(job)}x{job.uninterrupted_runs}"  # the same reference serves any number of runs


class References:
    """Each job's reference, its audit and its second run, for one session (see the module)."""

    def __init__(self, runs: Runs, prefixes: Prefixes, cache: ReferenceCache | None = None):
        self._runs = runs
        self.prefixes = prefixes  # the copies of each reference's checkpoints a plan may start from
        self.cache = cache  # references kept across sessions (--spotchaos-reference-cache)
        self._trained: dict[str, RunRecord] = {}
        self._conventions: dict[str, StepConvention] = {}  # job key -> how its log-adapter script counts
        self._audits: dict[str, Audit] = {}  # job key -> what its repeated uninterrupted runs showed
        self._second: dict[str, tuple[Audit, StateDifference | None]] = {}  # job key -> its second run
        self._from_cache: set[str] = set()  # jobs whose reference came from the cache, not questioned yet
        self._retired: list[RunRecord] = []  # references a fresh one replaced: removed at close
        self._lock = threading.Lock()  # one recomputation of a stale reference at a time
        self._second_lock = threading.Lock()  # plans judged in parallel wait for the one second run

    def of(self, job: JobSpec) -> RunRecord:
        """The uninterrupted run of ``job``, once per session and job configuration; raises
        :class:`NotDeterministic` when the job's own repeated runs (``determinism_runs``) differ."""
        key = held_key(job)
        if key not in self._trained:
            self._trained[key] = self._cached_or_trained(job)
        if job.uninterrupted_runs > 1 and _audit_key(job) not in self._audits:
            self._audits[_audit_key(job)] = self._audit(job, self._trained[key])
        audit = self._audits.get(_audit_key(job))
        if audit is not None and not audit.reproducible and job.exactness == "bit":
            raise NotDeterministic(
                f"job {job.name!r} is not deterministic without any preemption: {audit.text()}; no resume can be "
                f"judged bit for bit. Hint: {HINT}"
            )
        return self._trained[key]

    def known(self, job: JobSpec) -> RunRecord | None:
        """The reference if it was made already (a run's cost is counted against its length)."""
        return self._trained.get(held_key(job))

    def convention(self, job: JobSpec) -> StepConvention:
        """How a log-adapter job counts its steps, as its reference taught (trained first if need be)."""
        if held_key(job) not in self._trained:
            self.of(job)
        return self._conventions[held_key(job)]

    def from_cache(self, job: JobSpec) -> bool:
        """Whether ``job``'s reference came from the cache and no failed run has questioned it yet."""
        return held_key(job) in self._from_cache

    def audit(self, job: JobSpec) -> Audit | None:
        """What the job's repeated uninterrupted runs showed (None with determinism_runs = 1)."""
        with contextlib.suppress(NotDeterministic):  # the audit says it; the scenario that asks decides
            self.of(job)
        return self._audits.get(_audit_key(job))

    def envelope(self, job: JobSpec) -> Envelope | None:
        """The tolerance of envelope mode (None in bit mode)."""
        if job.exactness != "envelope":
            return None
        self.of(job)
        return Envelope(self._audits[_audit_key(job)], job.envelope_factor)

    def _cached_or_trained(self, job: JobSpec, *, fresh: bool = False) -> RunRecord:
        """The reference from the cache, else trained (and then kept in the cache); ``fresh``: trained."""
        runs = self._runs
        workdir = runs.next_dir(f"{job.name}-reference")
        said = ""
        if self.cache is not None and not fresh:
            found = self.cache.load(job, runs.root, workdir, with_snapshots=self.prefixes.enabled)
            if isinstance(found, Cached):
                self.prefixes.cached(job, found.record, found.snapshots)
                found.record.cache = {"read": True, "said": found.said}
                self._from_cache.add(held_key(job))
                note_cached_reference()
                return found.record
            said = found
        snapshots = self.prefixes.open(job, workdir)
        # a job that may start from the reference's checkpoints logs its file-system events in it too: the
        # crash points of a save are read from them, not from one more uninterrupted run (families/crashpoints.py)
        traced = why_no_prefix(job) is None
        record = runs.execute(
            job, Plan(), workdir, learn=True, keep_checkpoints="all", snapshots=snapshots, trace_fs=traced
        )
        if not record.steps:
            raise SpotchaosError(f"job {job.name!r} reported no step in its uninterrupted run")
        self.prefixes.taken(job, record, snapshots)
        if record.convention is not None:
            self._conventions[held_key(job)] = convention_from_dict(record.convention)
        if self.cache is not None:
            stored = self.cache.store(job, runs.root, record, snapshots, runs.secrets_of(job))
            record.cache = {"read": False, "said": f"{said}; {stored}" if said else stored}
        return record

    def stale(self, job: JobSpec, forget: Callable[[JobSpec], None]) -> bool:
        """A run of ``job`` failed while its reference came from the cache: train the reference again
        and compare. True when they differ (the cache was stale: the new one replaces it, ``forget``
        drops what was judged against the old one, and the run must be judged again); False when
        they agree or the reference was trained this session."""
        key = held_key(job)
        with self._lock:
            if key not in self._from_cache:
                return False
            self._from_cache.discard(key)
            cached = self._trained[key]
            fresh = self._cached_or_trained(job, fresh=True)
            difference = reference_difference(cached, fresh)
            self._trained[key] = fresh  # equal when no difference: the fresh one is confirmed
            self._retired.append(cached)  # a plan running beside this one may still read its copies
            if difference is None:
                fresh.cache = {**(fresh.cache or {}), "confirmed": "a run failed: the reference trained again matched"}
                return False
            said = f"the cached reference of {job.name!r} no longer matches the job ({difference}): recomputed"
            log.warning("spotchaos: %s", said)
            fresh.cache = {**(fresh.cache or {}), "recomputed": said}
            forget(job)  # passes judged against the stale one
            self._second.pop(job.key(), None)  # measured against it too
            return True

    def _audit(self, job: JobSpec, reference: RunRecord) -> Audit:
        """The job's other uninterrupted runs, compared with the reference: its own noise."""
        runs = [reference]
        spread: dict[str, list[float]] = {}
        for index in range(2, job.uninterrupted_runs + 1):
            record = self._runs.execute(job, Plan(), self._runs.next_dir(f"{job.name}-uninterrupted-{index}"))
            runs.append(record)
            for name, distance in weights_distance(job, reference, record).items():
                spread[name] = [max(a, b) for a, b in zip(spread.get(name, [0.0, 0.0]), distance, strict=True)]
            self._runs.discard(record)
        result = audit_runs(runs, spread)
        log.info("job %s: %s", job.name, result.text())
        # for the report: whether the job is bit-reproducible, the mode it is judged in, its envelope
        reference.audit = {**result.to_dict(), "exactness": job.exactness, "envelope_factor": job.envelope_factor}
        return result

    def second_run(self, job: JobSpec) -> tuple[Audit, StateDifference | None]:
        """A second uninterrupted run of the job, once per session, on a failure's path only: whether
        it repeats the reference (trajectory and final weights) and how its checkpoints differ."""
        runs = self._runs
        with self._second_lock:
            if job.key() not in self._second:
                record = runs.execute(job, Plan(), runs.next_dir(f"{job.name}-uninterrupted2"), keep_checkpoints="all")
                reference = self.of(job)
                state = state_difference(
                    job, reference, record, lambda: runs.local_backend(job), runs.root, uninterrupted=True
                )
                self._second[job.key()] = (audit_runs([reference, record]), state)
                runs.discard(record)
            return self._second[job.key()]

    def all(self) -> list[RunRecord]:
        """Every reference this session made or read, the replaced ones too: what close removes."""
        return [*self._trained.values(), *self._retired]

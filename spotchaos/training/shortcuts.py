"""The shortcuts a gate takes, and the rule that keeps them honest: a shortcut may save work, never decide.

The shortcuts: attempts forked from the job's warm interpreter (``host/warm``), plans started from
a copy of the reference's checkpoint (``reference/prefix.py``), a last attempt taken from another
plan whose last attempt began on the same bytes (``reference/tails.py``), a reference read from the
cache of an earlier session (``reference/cache.py``), and a plan's pass reused by another scenario
of the session. Each can hide a defect that only the slow path shows (a resume that differs in a fresh
process, a side file a copy does not hold, a job changed since its reference was cached, a job
that differs where the reuse key did not look), so:

- **a failure seen through a shortcut is judged again on the slow path**: cold processes, from
  step 0, against a reference trained this session. A slow failure is the verdict. A slow pass is a
  *disagreement*: the verdict fails all the same, saying which shortcut disagreed, what it saw and
  that the cause is unknown, and the job takes no shortcut for the rest of the session;
- **a reused pass is keyed by the whole job** (every field of its dataclass, not a hand-kept
  list), the plan, and where the plan started (a pass from a copy never answers a plan that must
  start from step 0);
- **an audit** (``--spotchaos-audit=N``) runs the first N plans per job that passed through a
  shortcut again on the slow path; a failure there fails the plan, naming the shortcut.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field, replace

from ..config.jobs import JobSpec
from ..faults.plan import Plan
from .reference.prefix import Prefix, held_key
from .trajectory import RunRecord
from .verdict import Verdict

log = logging.getLogger("spotchaos")

WARM, PREFIX, CACHE = "warm start", "start from the reference's copy", "cached reference"
TAIL = "tail reused from another plan"
SLOW_PATH = "cold processes, from step 0, against a reference trained this session"


def verdict_key(job: JobSpec) -> str:
    """Everything about ``job`` that can change a verdict: every field of the dataclass (its
    name, grace window, provider, timeouts, ignore lists, ...), so a field added later is in it
    without anyone remembering to list it."""
    described = json.dumps(dataclasses.asdict(job), sort_keys=True, default=repr)
    return hashlib.sha256(described.encode()).hexdigest()[:20]


@dataclass
class Judged:
    """One judged run: its record, its verdict and the shortcuts it took."""

    record: RunRecord
    verdict: Verdict
    used: tuple[str, ...] = ()


@dataclass
class Shortcuts:
    """One session's shortcut bookkeeping: reused passes, disagreements, jobs judged slow only."""

    audit: int = 0  # passing plans per job run again on the slow path
    _passed: dict[tuple[str, str, str, str], tuple[RunRecord, Verdict]] = field(default_factory=dict)
    _disagreed: dict[tuple[str, str], tuple[RunRecord, Verdict]] = field(default_factory=dict)
    _off: dict[str, str] = field(default_factory=dict)  # held_key -> why the job takes no shortcut
    _audited: dict[str, int] = field(default_factory=dict)
    _deferred: dict[tuple[str, str], tuple[Judged, Prefix | None]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def off(self, job: JobSpec) -> str | None:
        """Why ``job`` takes no shortcut this session (None: it may)."""
        return self._off.get(held_key(job))

    def reused(self, job: JobSpec, plan: Plan, *, from_copy_ok: bool) -> tuple[RunRecord, Verdict] | None:
        """A pass (or a disagreement) of the same job and plan already judged this session."""
        with self._lock:
            disagreed = self._disagreed.get((verdict_key(job), str(plan)))
            if disagreed is not None:  # the same failure again: a search's replay must see it too
                return disagreed
            starts = ("step 0", "copy") if from_copy_ok else ("step 0",)
            for start in starts:
                ran = self._passed.get((held_key(job), verdict_key(job), str(plan), start))
                if ran is not None:
                    return replace(ran[0], reused=True), ran[1]
        return None

    def passed(self, job: JobSpec, plan: Plan, judged: Judged, start: Prefix | None) -> None:
        with self._lock:
            where = "copy" if start is not None else "step 0"
            self._passed[(held_key(job), verdict_key(job), str(plan), where)] = (judged.record, judged.verdict)

    def forget_job(self, job: JobSpec) -> None:
        """Passes judged against a reference found stale: judged again when asked."""
        with self._lock:
            self._passed = {k: v for k, v in self._passed.items() if k[0] != held_key(job)}

    def take_audit(self, job: JobSpec) -> bool:
        """Whether this pass through a shortcut is one of the job's ``audit`` to run again slow."""
        with self._lock:
            done = self._audited.get(held_key(job), 0)
            if done >= self.audit:
                return False
            self._audited[held_key(job)] = done + 1
            return True

    def defer(self, job: JobSpec, plan: Plan, fast: Judged, start: Prefix | None) -> None:
        """A search's failure through a shortcut: it steers the shrinking as it is; the plan the
        search reports is judged again on the slow path when it is settled (``take_deferred``)."""
        with self._lock:
            self._deferred[(verdict_key(job), str(plan))] = (fast, start)

    def take_deferred(self, job: JobSpec, plan: Plan) -> tuple[Judged, Prefix | None] | None:
        with self._lock:
            return self._deferred.pop((verdict_key(job), str(plan)), None)

    def confirmed(self, job: JobSpec, plan: Plan) -> None:
        """A failure through a shortcut that the slow path confirmed: the job's other plans (a
        search shrinking it) run on the slow path at once, instead of twice each."""
        with self._lock:
            self._off.setdefault(held_key(job), f"plan {plan} failed on the slow path too: its other plans run there")

    def explained(self, job: JobSpec, plan: Plan, fast: Judged, slow: Judged, why: str) -> Judged:
        """A plan that failed from a copy the harness can prove was not the reference's folder
        (``Prefix.changed``) and passed on the slow path: a harness defect, not the job's. The slow
        pass stands; the report says which shortcut disagreed and why; the job takes no more copies."""
        text = (
            f"the {' and '.join(fast.used)} disagreed with the slow path and the harness is to blame: {why}; "
            f"the plan failed from it ({_first_line(fast.verdict)}) and passed on the slow path ({SLOW_PATH}), "
            "whose pass is the verdict; the job starts no more plans from copies this session"
        )
        log.warning("spotchaos: job %r, plan %s: %s", job.name, plan, text)
        return Judged(replace(slow.record, shortcuts={"used": list(fast.used), "explained": text}), slow.verdict)

    def disagreed(self, job: JobSpec, plan: Plan, fast: Judged, slow: Judged, *, audit: bool) -> Judged:
        """The failing verdict of a plan whose fast and slow paths disagree; the job takes no
        shortcut for the rest of the session."""
        failing = slow if audit else fast  # the passing run's folder went with its pass
        shortcuts = " and ".join(fast.used)
        seen = _first_line(failing.verdict)
        if audit:
            text = (
                f"a shortcut passed a failing plan: through the {shortcuts} it passed; on the slow path "
                f"({SLOW_PATH}) it failed: {seen}"
            )
        else:
            text = (
                f"the {shortcuts} changed the verdict: through it the plan failed ({seen}); on the slow path "
                f"({SLOW_PATH}) it passed. The cause is unknown: the job's resume depends on something the "
                f"shortcut changes (the process it starts in, files outside its checkpoint folder) or the job "
                f"is not deterministic run to run; either way the pass cannot be trusted"
            )
        why = f"plan {plan}: {text}"
        with self._lock:
            self._off.setdefault(held_key(job), why)
        log.warning("spotchaos: job %r takes no shortcut for the rest of the session: %s", job.name, why)
        verdict = replace(failing.verdict, passed=False, failures=[text, *failing.verdict.failures])
        record = replace(failing.record, shortcuts={"used": list(fast.used), "disagreed": text})
        with self._lock:
            self._disagreed[(verdict_key(job), str(plan))] = (record, verdict)
        return Judged(record, verdict, fast.used)


def _first_line(verdict: Verdict) -> str:
    """What the verdict saw first, without the cause it guessed (its hint): quoted where another
    path's verdict decides, a guess there would name a cause nothing proved."""
    if not verdict.failures:
        return ""
    seen = verdict.message().strip().splitlines()[0].lstrip("- ").split("; hint:")[0]
    return seen if len(seen) <= 300 else seen[:297] + "..."


def used_by(record: RunRecord, start: Prefix | None, cached: bool) -> tuple[str, ...]:
    """The shortcuts one run took."""
    used = []
    if cached:
        used.append(CACHE)
    if start is not None:
        used.append(PREFIX)
    if any(a.start_kind == "warm" for a in record.attempts):
        used.append(WARM)
    if record.tail_of is not None:
        used.append(TAIL)
    return tuple(used)


def slow(job: JobSpec) -> JobSpec:
    """``job`` as the slow path runs it: every attempt a fresh process (plans run from step 0 by
    the caller, and the reference is one trained this session)."""
    return replace(job, warm=False)

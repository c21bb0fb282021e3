"""Services on spot: the reclaim notice under load, a drain that drops nothing, the kill at the deadline.

The harness plays the platform: it starts the service on a free port of 127.0.0.1, waits until it
is ready, keeps ``concurrency`` requests in flight for the steady state, delivers the notice on the
service's channel (SIGTERM, or the cloud's instance metadata served here), SIGKILLs it at the
deadline if it is still up, and judges every request (:mod:`spotchaos.serving.verdict`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config.services import InstanceType, ServiceSpec
from ..core import Core
from ..errors import JobError, ScenarioFailure
from ..faults.notices import MetadataNotice, SigtermNotice, channel
from ..host.ports import free_port
from ..record import note_figure_row
from ..serving.balancer import Balancer
from ..serving.load import Load, RequestRecord
from ..serving.model_store import ModelStore
from ..serving.platform import Instance, ServiceSite
from ..serving.readiness import ReadinessWatch
from ..serving.verdict import DrainBounds, DrainTimeline, DrainVerdict, judge_drain, judge_replacement, longest_gap

log = logging.getLogger("spotchaos")
AFTER_EXIT_SECONDS = 0.5  # the load keeps knocking this long after the service is gone
AFTER_REPLACEMENT_SECONDS = 1.0  # and this long once the replacement answered
TIMELINE_BIN_SECONDS = 0.25


class DrainFailure(ScenarioFailure):
    """The service did not drain through its notice: a request dropped, the kill came first."""

    def __init__(self, service: str, verdict: DrainVerdict, workdir: str) -> None:
        self.verdict = verdict
        super().__init__(
            f"service {service!r} through a {verdict.figures.get('notice_seconds')} s notice:\n{verdict.message()}\n"
            f"  (logs kept in {workdir})"
        )


def _timeline(records: list[RequestRecord], origin: float, width: float = TIMELINE_BIN_SECONDS) -> dict[str, Any]:
    """Requests by outcome per time bin (by when each ended, seconds from the notice): the plot's data."""
    if not records:
        return {"width": width, "start": 0.0, "counts": {}}
    first = min(r.ended for r in records) - origin
    start = width * int(first // width) if first >= 0 else -width * int(-first // width + 1)
    bins = int((max(r.ended for r in records) - origin - start) // width) + 1
    counts: dict[str, list[int]] = {}
    for r in records:
        row = counts.setdefault(r.outcome, [0] * bins)
        row[min(bins - 1, int((r.ended - origin - start) // width))] += 1
    return {"width": width, "start": round(start, 4), "counts": counts}


def run_drain(core: Core, service: ServiceSpec) -> tuple[DrainVerdict, Path]:
    """One run: start, steady state, notice, drain or kill, then the replacement on the first
    available type of the fallback order (if any); the verdict and the run's directory."""
    return _DrainRun(core, service).run()


class _DrainRun:
    """One drain run, a method a phase, in the order the platform lives it. Everything it starts
    (the notice's channel, instances, the balancer, the load, the readiness watch) is entered into
    one ExitStack and gone when ``run`` returns, whatever happened."""

    def __init__(self, core: Core, service: ServiceSpec) -> None:
        self.core = core
        # a "module:function" factory, imported
        self.service = replace(service, request=service.request.resolve(core.root))
        self.workdir = core.next_dir(f"{service.name}-drain")
        self.port = service.port or free_port()
        self.docker = core.docker_backend if service.container is not None else None
        self.notice_seconds = float(service.notice_seconds or 30.0)
        self.env: dict[str, str] = dict(service.env)
        self.store: ModelStore | None = None
        self.lb: Balancer | None = None
        self.replacement_at: float | None = None
        self.downloaded_before = 0  # what the bucket had served when the replacement started
        self.second: Instance | None = None
        self.second_answer: Future | None = None

    def run(self) -> tuple[DrainVerdict, Path]:
        self.workdir.mkdir(parents=True)
        with contextlib.ExitStack() as stack:
            self.stack = stack
            notice = self._prepare()
            first, answered, cold_bytes = self._start_first(notice)
            load = self._load(first)
            time.sleep(self.service.steady_seconds)
            notice_at = time.monotonic()
            notice.deliver(first.handle, time.time() + self.notice_seconds)
            delivered_at = time.monotonic()  # a signal sent, a container's API answered, the notice posted
            killed, exited_at, readiness = self._drain_or_kill(first, notice_at)
            records, replacement, later_failures = self._replacement(load, answered, notice_at)
        channel_note = notice.how_it_was_read(notice_at)  # how the service took a metadata notice, if at all
        timeline = DrainTimeline(
            notice_at,
            exited_at,
            killed,
            delivered_at=delivered_at,
            replacement_at=self.replacement_at,
            unready_at=readiness.unready_at if readiness.unready_at is not None else exited_at,
            channel_note=channel_note,
        )
        bounds = DrainBounds(self.notice_seconds, self.service.drain_margin_seconds, self.service.unready_bound)
        verdict = judge_drain(records, timeline, bounds)
        verdict.failures.extend(later_failures)
        verdict.passed = not verdict.failures
        self._figures(verdict, records, timeline, (answered, cold_bytes), replacement)
        lines = "".join(json.dumps(r.to_dict(notice_at)) + "\n" for r in records)
        (self.workdir / "requests.jsonl").write_text(lines)
        return verdict, self.workdir

    def _prepare(self) -> MetadataNotice | SigtermNotice:
        """The notice's channel, the service's scratch folder, the model in the harness's S3, the
        platform's balancer and the replacement's thread."""
        service, stack = self.service, self.stack
        notice = channel(service.channel)
        stack.callback(notice.close)
        if service.container is None:  # a container's own /tmp goes with it
            scratch = Path(tempfile.mkdtemp(prefix="spotchaos-tmp-"))
            stack.callback(shutil.rmtree, scratch, ignore_errors=True)
            self.env["TMPDIR"] = str(scratch)
        if service.model is not None:
            store = ModelStore(self.core.s3, service.model, self.core.root, self.workdir / "model-cache")
            self.store = stack.enter_context(store)
            self.core.secrets.append(self.core.s3.credentials.secret_key)
            self.env.update(self.store.environment)
        if service.balancer:
            self.lb = stack.enter_context(Balancer(service.ready_path, service.request_timeout_seconds))
        self.pool = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotchaos-replacement"))
        return notice

    def _instance(self, label: str, itype: InstanceType | None, metadata: dict[str, str]) -> Instance:
        site = ServiceSite(self.service, self.workdir, self.core.root, sys.executable, self.docker)
        started = Instance(
            site,
            label=label,
            port=free_port() if self.lb is not None else self.port,  # behind a balancer each instance has its own
            env={**self.env, **metadata},
            itype=itype,
        )
        self.stack.enter_context(started)
        if self.lb is not None:
            self.lb.register(label, started.base_url)
        return started

    def _downloaded(self) -> int:
        return self.core.s3.proxy.downloaded if self.store is not None else 0

    def _start_first(self, notice: MetadataNotice | SigtermNotice) -> tuple[Instance, Any, int | None]:
        """The instance to be reclaimed, on the first type of the order, until it answers: (it, its
        first answer, the model's bytes it read from the bucket)."""
        types = self.service.instance_types
        read_before = self._downloaded()  # the session's S3 serves others too
        first = self._instance("first", types[0] if types else None, notice.environment())
        answered = first.first_answer(self.service.start_timeout_seconds)
        cold_bytes = self._downloaded() - read_before if self.store is not None else None  # the model, from the bucket
        if self.lb is not None:
            self.lb.wait_ready("first", self.service.start_timeout_seconds)
        return first, answered, cold_bytes

    def _load(self, first: Instance) -> Load:
        """``concurrency`` requests kept in flight, through the balancer if there is one."""
        service = self.service
        target = self.lb.url if self.lb is not None else first.base_url
        load = Load(target, service.request, service.concurrency, service.request_timeout_seconds)
        self.stack.callback(load.stop_quietly)
        load.start()
        return load

    def _drain_or_kill(self, first: Instance, notice_at: float) -> tuple[bool, float, ReadinessWatch]:
        """From the notice to the instance's end: it exits, or the deadline kills it. (killed, when it
        was gone, and how long it still said it was ready, not through the balancer.)"""
        service = self.service
        deadline = notice_at + self.notice_seconds
        readiness = ReadinessWatch(first.base_url + service.ready_path, lambda: first.handle.poll() is not None)
        self.stack.callback(readiness.stop)
        readiness.start()
        if service.instance_types and self.lb is not None:  # PAI-EAS: the replacement starts at the notice
            self._launch_replacement()
        killed = first.handle.wait(deadline - time.monotonic()) is None
        if killed:
            first.handle.kill()  # the reclaim: the instance is gone
            first.handle.wait(5)
        exited_at = time.monotonic()
        readiness.stop()
        if service.instance_types and self.lb is None:  # on the same address: once the reclaimed instance is gone
            self._launch_replacement()
        return killed, exited_at, readiness

    def _launch_replacement(self) -> None:
        """The platform's replacement, on the first type of the order with capacity."""
        service = self.service
        itype = service.replacement_type()
        assert itype is not None  # the spec refuses an order with nothing available
        if self.store is not None and service.model is not None and service.model.updated_file:
            self.store.publish_update()
        fresh = channel(service.channel)  # a new instance's metadata: no notice posted on it
        self.stack.callback(fresh.close)
        self.replacement_at = time.monotonic()
        self.downloaded_before = self._downloaded()
        self.second = self._instance("replacement", itype, fresh.environment())
        self.second_answer = self.pool.submit(self.second.first_answer, service.replacement_timeout_seconds)

    def _replacement(
        self, load: Load, answered: Any, notice_at: float
    ) -> tuple[list[RequestRecord], dict[str, Any], list[str]]:
        """The load stopped once the replacement answered (or soon after the instance went): (every
        request, the replacement's figures, what failed of it)."""
        second, store = self.second, self.store
        if second is None or self.second_answer is None or self.replacement_at is None:
            time.sleep(AFTER_EXIT_SECONDS)
            return load.stop(), {}, []
        failure = got = None
        try:
            got = self.second_answer.result()
        except JobError as exc:
            failure = str(exc)
        if got is not None:
            time.sleep(AFTER_REPLACEMENT_SECONDS)
        records = load.stop()
        later_failures = judge_replacement(
            failure=failure,
            where=second.where(),
            model_updated=store is not None and store.updated,
            answer_before=answered.body if store is not None else None,
            answer_after=got.body if got is not None and store is not None else None,
        )
        replacement = {
            "instance_type": second.itype.name if second.itype else None,
            "order_followed": self.service.order_followed(),
            "ttfr_seconds": round(got.seconds, 3) if got else None,
            "first_answer_after_notice": round(self.replacement_at - notice_at + got.seconds, 3) if got else None,
            "cache": "stale-check" if store is not None and store.updated else "warm" if store else None,
            # read from the bucket until it answered: nothing for a warm cache (a HEAD), the model for a stale one
            "model_bytes_downloaded": self._downloaded() - self.downloaded_before if store is not None else None,
            "peak_memory_bytes": second.watch.peak if second.watch else None,
        }
        return records, replacement, later_failures

    def _figures(
        self,
        verdict: DrainVerdict,
        records: list[RequestRecord],
        timeline: DrainTimeline,
        first: tuple[Any, int | None],
        replacement: dict[str, Any],
    ) -> None:
        """What the report shows of the run: times, the channel, who served what, the timeline
        (``first``: the first instance's first answer and the model's bytes it read)."""
        service = self.service
        answered, cold_bytes = first
        notice_at, exited_at, channel_note = timeline.notice_at, timeline.exited_at, timeline.channel_note
        marks = {"notice": 0.0, "deadline": self.notice_seconds, "gone": round(exited_at - notice_at, 3)}
        if self.replacement_at:
            marks["replacement_launched"] = round(self.replacement_at - notice_at, 3)
        if replacement.get("first_answer_after_notice") is not None:
            marks["replacement_answered"] = replacement["first_answer_after_notice"]
        verdict.figures.update(
            ready_seconds=round(answered.ready_seconds, 3),
            ttfr_seconds=round(answered.seconds, 3),
            cache="cold" if self.store is not None else None,
            model_bytes_downloaded=cold_bytes,
            channel=service.channel,
            channel_note=channel_note,
            service=service.name,
            backend="docker" if service.container is not None else "subprocess",
            balancer=service.balancer,
            served_by=dict(Counter(r.instance for r in records if r.instance)),
            longest_gap_seconds=longest_gap(records, notice_at),
            timeline=_timeline(records, notice_at),
            marks=marks,
        )
        if replacement:
            verdict.figures["replacement"] = replacement
            warm = replacement.get("ttfr_seconds")
            if warm and replacement["cache"] == "warm":
                verdict.figures["warm_cold_ttfr_ratio"] = round(warm / answered.seconds, 3)


def check_drain(core: Core, service: ServiceSpec) -> dict[str, Any]:
    """The reclaim notice under load: raise :class:`DrainFailure` unless the service drained."""
    verdict, workdir = run_drain(core, service)
    log.info("service %s: %s; %s", service.name, verdict.message().replace("\n", " "), verdict.figures)
    note_figure_row("serving", {**verdict.figures, "passed": verdict.passed})
    if not verdict.passed:
        raise DrainFailure(service.name, verdict, str(workdir))
    core.discard_dir(workdir)
    return verdict.figures

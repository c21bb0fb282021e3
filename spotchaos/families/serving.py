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
from ..errors import JobError, ScenarioFailure
from ..faults.notices import channel
from ..host.ports import free_port
from ..record import note_figure_row
from ..serving.balancer import Balancer
from ..serving.load import Load, RequestRecord
from ..serving.model_store import ModelStore
from ..serving.platform import Instance
from ..serving.readiness import ReadinessWatch
from ..serving.verdict import DrainVerdict, judge_drain, judge_replacement, longest_gap
from ..session import SessionCore

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


def run_drain(core: SessionCore, service: ServiceSpec) -> tuple[DrainVerdict, Path]:
    """One run: start, steady state, notice, drain or kill, then the replacement on the first
    available type of the fallback order (if any); the verdict and the run's directory."""
    service = replace(service, request=service.request.resolve(core.root))  # a "module:function" factory, imported
    workdir = core.next_dir(f"{service.name}-drain")
    workdir.mkdir(parents=True)
    port = service.port or free_port()
    docker = core.docker_backend if service.container is not None else None
    with contextlib.ExitStack() as stack:
        notice = channel(service.channel)
        stack.callback(notice.close)
        env = dict(service.env)
        if service.container is None:  # a container's own /tmp goes with it
            scratch = Path(tempfile.mkdtemp(prefix="spotchaos-tmp-"))
            stack.callback(shutil.rmtree, scratch, ignore_errors=True)
            env["TMPDIR"] = str(scratch)
        store = None
        if service.model is not None:
            store = stack.enter_context(ModelStore(core.s3, service.model, core.root, workdir / "model-cache"))
            core.secrets.append(core.s3.credentials.secret_key)
            env.update(store.environment)

        lb = (
            stack.enter_context(Balancer(service.ready_path, service.request_timeout_seconds))
            if service.balancer
            else None
        )
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotchaos-replacement"))

        def instance(label: str, itype: InstanceType | None, metadata: dict[str, str]) -> Instance:
            started = Instance(
                service,
                port=free_port() if lb is not None else port,  # behind a balancer each instance has its own
                env={**env, **metadata},
                workdir=workdir,
                label=label,
                itype=itype,
                cwd=core.root,
                python=sys.executable,
                docker_backend=docker,
            )
            stack.enter_context(started)
            if lb is not None:
                lb.register(label, started.base_url)
            return started

        types = service.instance_types
        replacement_at: float | None = None
        downloaded_before = 0  # what the bucket had served when the replacement started
        second: Instance | None = None
        second_answer: Future | None = None

        def launch_replacement() -> None:
            """The platform's replacement, on the first type of the order with capacity."""
            nonlocal replacement_at, second, second_answer, downloaded_before
            itype = service.replacement_type()
            assert itype is not None  # the spec refuses an order with nothing available
            if store is not None and service.model is not None and service.model.updated_file:
                store.publish_update()
            fresh = channel(service.channel)  # a new instance's metadata: no notice posted on it
            stack.callback(fresh.close)
            replacement_at = time.monotonic()
            downloaded_before = core.s3.proxy.downloaded if store is not None else 0
            second = instance("replacement", itype, fresh.environment())
            second_answer = pool.submit(second.first_answer, service.replacement_timeout_seconds)

        read_before = core.s3.proxy.downloaded if store is not None else 0  # the session's S3 serves others too
        first = instance("first", types[0] if types else None, notice.environment())
        answered = first.first_answer(service.start_timeout_seconds)
        cold_bytes = core.s3.proxy.downloaded - read_before if store is not None else None  # the model, from the bucket
        if lb is not None:
            lb.wait_ready("first", service.start_timeout_seconds)
        target = lb.url if lb is not None else first.base_url
        load = Load(target, service.request, service.concurrency, service.request_timeout_seconds)
        stack.callback(load.stop_quietly)
        load.start()
        time.sleep(service.steady_seconds)
        notice_at = time.monotonic()
        deadline = notice_at + float(service.notice_seconds or 30.0)
        notice.deliver(first.handle, time.time() + float(service.notice_seconds or 30.0))
        # from the notice on: how long the instance itself still says it is ready (not through the balancer)
        readiness = ReadinessWatch(first.base_url + service.ready_path, lambda: first.handle.poll() is not None)
        stack.callback(readiness.stop)
        readiness.start()
        if types and lb is not None:  # PAI-EAS: the replacement starts at the notice, beside the draining one
            launch_replacement()
        killed = first.handle.wait(deadline - time.monotonic()) is None
        if killed:
            first.handle.kill()  # the reclaim: the instance is gone
            first.handle.wait(5)
        exited_at = time.monotonic()
        readiness.stop()
        if types and lb is None:  # on the same address: once the reclaimed instance is gone
            launch_replacement()
        replacement: dict[str, Any] = {}
        later_failures: list[str] = []
        if second is not None and second_answer is not None and replacement_at is not None:
            failure = got = None
            try:
                got = second_answer.result()
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
                "order_followed": service.order_followed(),
                "ttfr_seconds": round(got.seconds, 3) if got else None,
                "first_answer_after_notice": round(replacement_at - notice_at + got.seconds, 3) if got else None,
                "cache": "stale-check" if store is not None and store.updated else "warm" if store else None,
                # read from the bucket until it answered: nothing for a warm cache (a HEAD), the model for a stale one
                "model_bytes_downloaded": core.s3.proxy.downloaded - downloaded_before if store is not None else None,
                "peak_memory_bytes": second.watch.peak if second.watch else None,
            }
        else:
            time.sleep(AFTER_EXIT_SECONDS)
            records = load.stop()
    channel_note = notice.how_it_was_read(notice_at)  # how the service took a metadata notice, if at all
    verdict = judge_drain(
        records,
        notice_at=notice_at,
        exited_at=exited_at,
        killed=killed,
        notice_seconds=float(service.notice_seconds or 30.0),
        margin=service.drain_margin_seconds,
        channel_note=channel_note,
        replacement_at=replacement_at,
        unready_at=readiness.unready_at if readiness.unready_at is not None else exited_at,
        unready_bound=service.unready_bound,
    )
    verdict.failures.extend(later_failures)
    verdict.passed = not verdict.failures
    verdict.figures.update(
        ready_seconds=round(answered.ready_seconds, 3),
        ttfr_seconds=round(answered.seconds, 3),
        cache="cold" if store is not None else None,
        model_bytes_downloaded=cold_bytes,
        channel=service.channel,
        channel_note=channel_note,
        service=service.name,
        backend="docker" if service.container is not None else "subprocess",
        balancer=service.balancer,
        served_by=dict(Counter(r.instance for r in records if r.instance)),
        longest_gap_seconds=longest_gap(records, notice_at),
        timeline=_timeline(records, notice_at),
        marks={
            "notice": 0.0,
            "deadline": float(service.notice_seconds or 30.0),
            "gone": round(exited_at - notice_at, 3),
            **({"replacement_launched": round(replacement_at - notice_at, 3)} if replacement_at else {}),
            **(
                {"replacement_answered": replacement["first_answer_after_notice"]}
                if replacement.get("first_answer_after_notice") is not None
                else {}
            ),
        },
    )
    if replacement:
        verdict.figures["replacement"] = replacement
        warm = replacement.get("ttfr_seconds")
        if warm and replacement["cache"] == "warm":
            verdict.figures["warm_cold_ttfr_ratio"] = round(warm / answered.seconds, 3)
    (workdir / "requests.jsonl").write_text("".join(json.dumps(r.to_dict(notice_at)) + "\n" for r in records))
    return verdict, workdir


def check_drain(core: SessionCore, service: ServiceSpec) -> dict[str, Any]:
    """The reclaim notice under load: raise :class:`DrainFailure` unless the service drained."""
    verdict, workdir = run_drain(core, service)
    log.info("service %s: %s; %s", service.name, verdict.message().replace("\n", " "), verdict.figures)
    note_figure_row("serving", {**verdict.figures, "passed": verdict.passed})
    if not verdict.passed:
        raise DrainFailure(service.name, verdict, str(workdir))
    core.discard_dir(workdir)
    return verdict.figures

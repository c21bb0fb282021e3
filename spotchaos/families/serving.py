"""Services on spot: the reclaim notice under load, a drain that drops nothing, the kill at the deadline.

The harness plays the platform: it starts the service on a free port of 127.0.0.1, waits until it
is ready, keeps ``concurrency`` requests in flight for the steady state, delivers the notice on the
service's channel (SIGTERM, or the cloud's instance metadata served here), SIGKILLs it at the
deadline if it is still up, and judges every request (:mod:`spotchaos.serving.verdict`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ..backends import LaunchSpec, SubprocessBackend
from ..errors import JobError, ScenarioFailure
from ..extras import require
from ..leftovers import LiveJobs
from ..ports import free_port
from ..probe import ENV_RUN_ID
from ..processes import end_marked
from ..record import ScenarioRecord
from ..safefs import UnsafeFile, read_text_bounded
from ..serving.load import Load
from ..serving.notices import channel
from ..serving.spec import ServiceSpec
from ..serving.verdict import DrainVerdict, judge_drain
from ..session import SessionCore

log = logging.getLogger("spotchaos")
AFTER_EXIT_SECONDS = 0.5  # the load keeps knocking this long after the service is gone
READY_POLL_SECONDS = 0.1


class DrainFailure(ScenarioFailure):
    """The service did not drain through its notice: a request dropped, the kill came first."""

    def __init__(self, service: str, verdict: DrainVerdict, workdir: str) -> None:
        self.verdict = verdict
        super().__init__(
            f"service {service!r} through a {verdict.figures.get('notice_seconds')} s notice:\n{verdict.message()}\n"
            f"  (logs kept in {workdir})"
        )


def _tail(path: Path) -> str:
    try:
        lines = read_text_bounded(path, 3000, tail=True).splitlines()[-6:]
    except (UnsafeFile, FileNotFoundError):
        return "    (none)"
    return "\n".join("    " + line for line in lines) or "    (empty)"


def _wait_ready(service: ServiceSpec, handle: Any, base_url: str, stderr: Path) -> float:
    """Seconds until the readiness path answered 200; a clear error if it never does."""
    httpx = require("httpx", "serve", "a service scenario")
    started = time.monotonic()
    while True:
        code = handle.poll()
        if code is not None:
            raise JobError(
                f"service {service.name!r} exited with status {code} before it was ready "
                f"(GET {service.ready_path}); its stderr:\n{_tail(stderr)}"
            )
        try:
            if httpx.get(base_url + service.ready_path, timeout=1.0).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        if time.monotonic() - started > service.start_timeout_seconds:
            raise JobError(
                f"service {service.name!r} was not ready within {service.start_timeout_seconds:g} s "
                f"(start_timeout_seconds): GET {service.ready_path} never answered 200; its stderr:\n{_tail(stderr)}"
            )
        time.sleep(READY_POLL_SECONDS)


def run_drain(core: SessionCore, service: ServiceSpec) -> tuple[DrainVerdict, Path]:
    """One run: start, steady state, notice, drain or kill; the verdict and the run's directory."""
    workdir = core.next_dir(f"{service.name}-drain")
    workdir.mkdir(parents=True)
    port = service.port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    run_id = uuid.uuid4().hex[:12]
    notice = channel(service.channel)
    scratch = Path(tempfile.mkdtemp(prefix="spotchaos-tmp-"))
    env = {
        **os.environ,
        **dict(service.env),
        **notice.environment(),
        ENV_RUN_ID: run_id,
        "TMPDIR": str(scratch),
        "PYTHONUNBUFFERED": "1",
    }
    spec = LaunchSpec(
        argv=tuple(service.argv(port, sys.executable)),
        env=env,
        cwd=core.root / service.cwd if service.cwd else core.root,
        stdout_path=workdir / "stdout.log",
        stderr_path=workdir / "stderr.log",
        grace_seconds=float(service.notice_seconds or 30.0),
        writable=(workdir,),
    )
    live = LiveJobs()
    handle = SubprocessBackend().start(spec)
    entry = live.add(run_id, {**handle.identity, "scratch": str(scratch)})
    load = None
    try:
        ready = _wait_ready(service, handle, base_url, spec.stderr_path)
        load = Load(base_url, service.request, service.concurrency, service.request_timeout_seconds).start()
        time.sleep(service.steady_seconds)
        notice_at = time.monotonic()
        deadline = notice_at + float(service.notice_seconds or 30.0)
        notice.deliver(handle, time.time() + float(service.notice_seconds or 30.0))
        killed = handle.wait(deadline - time.monotonic()) is None
        if killed:
            handle.kill()  # the reclaim: the instance is gone
            handle.wait(5)
        exited_at = time.monotonic()
        time.sleep(AFTER_EXIT_SECONDS)
        records = load.stop()
        load = None
    finally:
        if load is not None:
            load.stop()
        try:
            handle.cleanup()
        finally:
            end_marked(f"{ENV_RUN_ID}={run_id}")
            live.discard(entry)
            notice.close()
            shutil.rmtree(scratch, ignore_errors=True)
    note = notice.how_it_was_read(notice_at)
    verdict = judge_drain(
        records,
        notice_at=notice_at,
        exited_at=exited_at,
        killed=killed,
        notice_seconds=float(service.notice_seconds or 30.0),
        margin=service.drain_margin_seconds,
        channel_note=note,
    )
    verdict.figures.update(ready_seconds=round(ready, 3), channel=service.channel, service=service.name)
    (workdir / "requests.jsonl").write_text("".join(json.dumps(r.to_dict(notice_at)) + "\n" for r in records))
    return verdict, workdir


def check_drain(core: SessionCore, service: ServiceSpec, record: ScenarioRecord | None = None) -> dict[str, Any]:
    """The reclaim notice under load: raise :class:`DrainFailure` unless the service drained."""
    verdict, workdir = run_drain(core, service)
    log.info("service %s: %s; %s", service.name, verdict.message().replace("\n", " "), verdict.figures)
    if record is not None:
        record.figures.setdefault("serving", []).append({**verdict.figures, "passed": verdict.passed})
    if not verdict.passed:
        raise DrainFailure(service.name, verdict, str(workdir))
    core.discard_dir(workdir)
    return verdict.figures

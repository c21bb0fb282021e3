"""The load: N requests kept in flight against a service, each one's fate written down.

asyncio with httpx, on a thread of its own, so the scenario can deliver the notice and the kill
while the load runs. Every request is classified the way a client behind a load balancer sees it:
an answer (``ok``), a retryable refusal (``refused``: the connection was refused, nothing was
sent; ``unavailable``: 503, with or without Retry-After), or a failure (``dropped``: the server
closed or reset the connection with the request sent; ``cut``: a stream ended early; ``error``:
another status; ``timeout``).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..config.services import RequestRecipe
from ..extras import require
from .answers import bounded_request

RETRY_PAUSE_SECONDS = 0.05  # a refused client tries again this much later (or after Retry-After, capped)
FAILED = ("dropped", "cut", "error", "timeout")


@dataclass
class RequestRecord:
    worker: int
    started: float  # time.monotonic()
    ended: float
    outcome: str  # ok, refused, unavailable, dropped, cut, error, timeout
    status: int | None = None
    retry_after: str | None = None
    detail: str = ""
    instance: str | None = None  # which instance answered, when a balancer says (X-Spotchaos-Instance)

    def to_dict(self, origin: float) -> dict[str, Any]:
        data = asdict(self)
        data["started"], data["ended"] = round(self.started - origin, 4), round(self.ended - origin, 4)
        return data


class Load:
    """``concurrency`` workers repeating ``recipe`` against ``base_url`` until :meth:`stop`."""

    def __init__(self, base_url: str, recipe: RequestRecipe, concurrency: int, timeout: float) -> None:
        self.httpx = require("httpx", "serve", "the load on a service")
        self.base_url = base_url
        self.recipe = recipe
        self.concurrency = concurrency
        self.timeout = timeout
        self.records: list[RequestRecord] = []
        self._numbers = itertools.count(1)  # request 0 is the first-answer probe's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotchaos-load", daemon=True)
        self._error: BaseException | None = None

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> list[RequestRecord]:
        self._stop.set()
        self._thread.join(timeout=self.timeout + 10)
        if self._error is not None:
            raise self._error
        return sorted(self.records, key=lambda r: r.started)

    def stop_quietly(self) -> None:
        """Stop on the way out of a failed scenario: its own error, if any, is not the one to report."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=self.timeout + 10)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by stop(), in the scenario's thread
            self._error = exc

    async def _main(self) -> None:
        limits = self.httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with self.httpx.AsyncClient(base_url=self.base_url, limits=limits, timeout=self.timeout) as client:
            await asyncio.gather(*(self._worker(client, n) for n in range(self.concurrency)))

    async def _worker(self, client: Any, worker: int) -> None:
        while not self._stop.is_set():
            record = await self._one(client, worker)
            self.records.append(record)
            if record.outcome in ("refused", "unavailable"):
                await asyncio.sleep(_pause(record.retry_after))

    async def _one(self, client: Any, worker: int) -> RequestRecord:
        httpx, recipe = self.httpx, self.recipe
        request = recipe.make(next(self._numbers))
        started = time.monotonic()
        try:  # a total deadline, and the body counted, not kept: an endless stream costs neither time nor memory
            answer = await bounded_request(
                client,
                request.method,
                request.path,
                self.timeout,
                content=request.content,
                headers=dict(request.headers),
            )
        except httpx.ConnectError as exc:
            return RequestRecord(worker, started, time.monotonic(), "refused", detail=_short(exc))
        except (httpx.TimeoutException, TimeoutError) as exc:
            detail = _short(exc) if str(exc) else f"no whole answer within {self.timeout:g} s"
            return RequestRecord(worker, started, time.monotonic(), "timeout", detail=detail)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:  # sent, then broken off
            outcome = "cut" if recipe.stream else "dropped"
            return RequestRecord(worker, started, time.monotonic(), outcome, detail=_short(exc))
        ended = time.monotonic()
        status, body, tail = answer.status, answer.head, answer.tail
        retry_after = answer.headers.get("retry-after")
        instance = answer.headers.get("x-spotchaos-instance")
        if status == 503:
            return RequestRecord(worker, started, ended, "unavailable", status, retry_after, instance=instance)
        if not 200 <= status < 300:
            detail = body[:120].decode("utf-8", "replace")
            return RequestRecord(worker, started, ended, "error", status, detail=detail, instance=instance)
        if recipe.stream and recipe.stream_end and not tail.rstrip().endswith(recipe.stream_end.encode()):
            detail = f"no {recipe.stream_end!r} at the end"
            return RequestRecord(worker, started, ended, "cut", status, detail=detail, instance=instance)
        return RequestRecord(worker, started, ended, "ok", status, instance=instance)


def _pause(retry_after: str | None) -> float:
    try:
        return min(max(float(retry_after), RETRY_PAUSE_SECONDS), 1.0) if retry_after else RETRY_PAUSE_SECONDS
    except ValueError:
        return RETRY_PAUSE_SECONDS


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:160]

"""One request to a service under test, bounded in time and in memory whatever the service does.

The service is untrusted code. httpx's timeouts are per read: an answer trickled one byte every
half second never trips them, so a readiness check could keep a service "starting" forever. And
a stream that never ends, kept whole, grows the harness without bound. So every request here has
a total deadline (``asyncio.timeout`` around all of it: connecting, the head, the body), and an
answer's body is counted as it streams, only its first and last bytes kept (for a message and
for the end-of-stream marker a recipe may name).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

HEAD_BYTES = 1 << 20  # kept of an answer's start: enough to compare one model's answers
TAIL_BYTES = 4096  # kept of its end: where a stream's end marker is


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    head: bytes  # the first HEAD_BYTES of the body
    tail: bytes  # its last TAIL_BYTES
    size: int  # every byte of the body, counted


async def bounded_request(
    client: Any,
    method: str,
    url: str,
    seconds: float,
    *,
    read_body: bool = True,
    **request: Any,
) -> Answer:
    """The answer to one request, within ``seconds`` in all; ``TimeoutError`` past it. Without
    ``read_body`` only the status and headers are waited for (a readiness check); ``request``:
    httpx's own options for it (``content``, ``headers``), passed as they are."""
    async with asyncio.timeout(seconds):
        async with client.stream(method, url, **request) as response:
            head, tail, size = bytearray(), b"", 0
            if read_body:
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if len(head) < HEAD_BYTES:
                        head += chunk[: HEAD_BYTES - len(head)]
                    tail = (tail + chunk)[-TAIL_BYTES:]
            return Answer(response.status_code, dict(response.headers), bytes(head), tail, size)


def request_once(method: str, url: str, seconds: float, **options: Any) -> Answer:
    """:func:`bounded_request` from synchronous code, on a client of its own."""
    from ..extras import require

    httpx = require("httpx", "serve", "a service scenario")

    async def once() -> Answer:
        async with httpx.AsyncClient(timeout=seconds) as client:
            return await bounded_request(client, method, url, seconds, **options)

    return asyncio.run(once())

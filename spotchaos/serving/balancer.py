"""The platform's load balancer, on 127.0.0.1, in front of a service's instances.

With it the harness plays a platform such as PAI-EAS or an AWS target group: the load goes to one
address; an instance gets requests while its readiness path answers 200 (checked every
``CHECK_SECONDS``) and none once it fails (deregistration); the replacement can start at the
notice and take traffic as soon as it is ready, while the reclaimed instance drains. With no
instance ready the balancer answers 503 with ``Retry-After``, as a platform's gateway does.

HTTP/1.1 with one request per connection (the balancer closes each): enough for any client, and
simple to keep honest. An upstream that fails before answering is retried on another ready
instance once, else 503; one that fails after it started answering has the client connection
closed under it, as a real proxy must (the client sees the request dropped, the stream cut).
Every answer carries ``X-Spotchaos-Instance`` so each request is attributed to the instance that
served it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

from ..extras import require
from .answers import bounded_request

CHECK_SECONDS = 0.1
INSTANCE_HEADER = "x-spotchaos-instance"
MAX_HEADER_BYTES = 64 * 1024
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "upgrade"}


class Balancer:
    """``with Balancer(ready_path) as lb:`` ``lb.register(label, base_url)``; the load uses ``lb.url``."""

    def __init__(self, ready_path: str, request_timeout: float = 30.0) -> None:
        self.httpx = require("httpx", "serve", "the load balancer")
        self.ready_path = ready_path
        self.request_timeout = request_timeout
        self.instances: dict[str, str] = {}  # label -> base url
        self.ready: dict[str, bool] = {}
        self._turn = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="spotchaos-balancer", daemon=True)
        self.port = 0

    # --- life ------------------------------------------------------------------------------------
    def __enter__(self) -> Balancer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _start(self) -> None:
        self._client = self.httpx.AsyncClient(timeout=self.request_timeout)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._checker = asyncio.ensure_future(self._check_forever())

    async def _stop(self) -> None:
        self._checker.cancel()
        if self._server is not None:
            self._server.close()
        await self._client.aclose()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def register(self, label: str, base_url: str) -> None:
        """A new instance: it gets traffic once its readiness path answers 200."""
        self._loop.call_soon_threadsafe(self._add, label, base_url)

    def _add(self, label: str, base_url: str) -> None:
        self.instances[label] = base_url
        self.ready.setdefault(label, False)

    def wait_ready(self, label: str, timeout: float) -> None:
        """Until the balancer itself has seen ``label`` ready (its next health check)."""
        deadline = time.monotonic() + timeout
        while not self.ready.get(label) and time.monotonic() < deadline:
            time.sleep(CHECK_SECONDS / 2)

    # --- health ----------------------------------------------------------------------------------
    async def _check_forever(self) -> None:
        while True:
            await asyncio.gather(*(self._check(label, url) for label, url in list(self.instances.items())))
            await asyncio.sleep(CHECK_SECONDS)

    async def _check(self, label: str, base_url: str) -> None:
        try:  # the status only, within 1 s in all: a trickled or endless answer cannot hold the checks up
            answer = await bounded_request(self._client, "GET", base_url + self.ready_path, 1.0, read_body=False)
            self.ready[label] = answer.status == 200
        except (self.httpx.HTTPError, TimeoutError):
            self.ready[label] = False

    def _pick(self, avoid: str | None = None) -> str | None:
        ready = [label for label in self.instances if self.ready.get(label) and label != avoid]
        if not ready:
            return None
        self._turn += 1
        return ready[self._turn % len(ready)]

    # --- one connection, one request ---------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        try:
            await self._forward(head, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _forward(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = [*lines[0].split(" ", 2), "", ""][:3]
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                key, value = line.split(":", 1)
                headers[key.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length") or 0))
        forwarded = {k: v for k, v in headers.items() if k not in HOP_BY_HOP and k != "host"}
        tried: str | None = None
        for _ in range(2):  # an instance that refuses the connection: once more on another
            label = self._pick(avoid=tried)
            if label is None:
                break
            tried = label
            request = self._client.build_request(
                method, self.instances[label] + target, headers=forwarded, content=body
            )
            try:
                response = await self._client.send(request, stream=True)
            except (self.httpx.ConnectError, self.httpx.ConnectTimeout):
                self.ready[label] = False
                continue
            except self.httpx.HTTPError:
                return  # it took the request and failed it: the client's connection goes down too
            try:
                await self._relay(label, response, writer)
            except self.httpx.HTTPError:
                writer.transport.abort()  # the instance broke off its answer: so does the balancer
            finally:
                await response.aclose()
            return
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 21\r\n")
        writer.write(b"Connection: close\r\n\r\nno instance is ready\n")
        await writer.drain()

    async def _relay(self, label: str, response: Any, writer: asyncio.StreamWriter) -> None:
        status = f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n"
        kept = [(k, v) for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP]
        head = status + "".join(f"{k}: {v}\r\n" for k, v in kept)
        head += f"{INSTANCE_HEADER}: {label}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        writer.write(head.encode("latin-1"))
        async for chunk in response.aiter_raw():  # an upstream that dies mid-answer raises: no final chunk
            if chunk:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

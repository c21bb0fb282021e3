"""An HTTP proxy in front of the S3 server that applies storage faults, on 127.0.0.1 only.

Jobs get the proxy's address as ``AWS_ENDPOINT_URL``; the proxy forwards each request to moto
unless an enabled fault answers, delays, throttles, resets or holds it. Faults can be added and
switched on and off while a job runs (credentials that expire mid-run). A context manager owns
the server thread: leaving it stops the proxy and wakes every held request.
"""

from __future__ import annotations

import http.client
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from ..errors import BackendError
from .faults import Fault, Request, S3Error
from .loopback import LOOPBACK, LoopbackServer, is_moto_admin

CHUNK = 64 * 1024
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class _Throttle:
    """Paces a byte stream to ``rate`` bytes per second (None: no cap)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.sent = 0

    def piece(self) -> int:
        """Bytes to move at a time: about 1/20 s of the cap, so a capped body trickles, not lurches."""
        return CHUNK if not self.rate else int(min(CHUNK, max(1024, self.rate / 20)))

    def account(self, count: int) -> None:
        self.sent += count
        if self.rate:
            ahead = self.sent / self.rate - (time.monotonic() - self.started)
            if ahead > 0:
                time.sleep(ahead)


class FaultProxy(LoopbackServer):
    """``with FaultProxy(moto.endpoint) as proxy: proxy.add(SlowDown(0.3))``."""

    label = "S3 fault proxy"

    def __init__(self, upstream: str, faults: list[Fault] | None = None, port: int = 0) -> None:
        super().__init__(port)
        parts = urlsplit(upstream)
        if parts.hostname not in (LOOPBACK, "localhost"):
            raise BackendError(f"the fault proxy forwards to loopback only, not {upstream}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.faults: list[Fault] = list(faults or [])
        self.requests = 0  # forwarded or answered, for the report
        self.injected: dict[str, int] = {}  # fault name -> requests it acted on (answered, delayed, paced, reset, held)
        self.uploads: list[tuple[int, float]] = []  # (body bytes, seconds from first to last byte)
        self.downloaded = 0  # body bytes of the answers passed back (GETs): what clients read from the bucket
        self._in_flight: dict[int, int] = {}  # upload -> body bytes passed on so far
        self._watchers: list[tuple[Fault, Callable[[], None]]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def add(self, fault: Fault) -> Fault:
        fault.armed()
        with self._lock:
            self.faults.append(fault)
        return fault

    def remove(self, fault: Fault) -> None:
        with self._lock:  # by identity: two faults of equal settings are still two faults
            self.faults = [f for f in self.faults if f is not fault]

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def active(self) -> list[Fault]:
        with self._lock:
            return [f for f in self.faults if f.enabled]

    def uploading(self, at_least: int = 1) -> bool:
        """Whether an upload is part-way through: ``at_least`` bytes of its body passed on, not all."""
        with self._lock:
            return any(sent >= at_least for sent in self._in_flight.values())

    def on_first_action(self, fault: Fault, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, synchronously, when ``fault`` first acts on a request, before the
        request is answered: the moment to take evidence of the state the fault found."""
        with self._lock:
            self._watchers.append((fault, callback))

    def _count(self, fault: Fault) -> None:
        with self._lock:
            self.injected[fault.name] = self.injected.get(fault.name, 0) + 1
            due = [w for w in self._watchers if w[0] is fault]
            self._watchers = [w for w in self._watchers if w[0] is not fault]
        for _, callback in due:
            callback()

    def _bind(self) -> ThreadingHTTPServer:
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        server = _QuietServer((LOOPBACK, self.port), Handler)
        server.daemon_threads = True
        return server

    def stop(self) -> None:
        self._stopping.set()  # wakes held requests
        super().stop()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that hangs up mid-answer (killed by a preemption, done reading) is normal here."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # botocore keeps connections alive
    owner: FaultProxy

    def log_message(self, format: str, *args) -> None:
        pass  # a job's storage traffic is not the test session's output

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _handle(self) -> None:
        owner = self.owner
        if is_moto_admin(self.path):  # only the harness talks to moto's admin API, and never through here
            self.close_connection = True  # the request body stays unread
            self._send_error(
                S3Error(403, "AccessDenied", "the spotchaos fault proxy does not forward moto's admin API (/moto-api/)")
            )
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        length = int(headers.get("content-length", "0") or 0)
        request = Request(self.command, self.path, headers, length)
        faults = owner.active()
        with owner._lock:
            owner.requests += 1
        delays = [(f, d) for f in faults if (d := f.delay(request))]
        for fault, _ in delays:
            owner._count(fault)
        if delays:
            time.sleep(sum(d for _, d in delays))
        answer = next(((f, e) for f in faults if (e := f.answer(request)) is not None), None)
        held = next(((f, h) for f in faults if (h := f.hang(request))), None)
        upstream = None
        if answer is None and held is None:
            upstream = http.client.HTTPConnection(*owner.upstream, timeout=120)
            try:
                upstream.connect()
            except OSError as exc:  # moto is gone: say so in S3's terms, not with a dropped connection
                host, port = owner.upstream
                detail = f"the spotchaos fault proxy cannot reach S3 at {host}:{port}: {exc.strerror or exc}"
                self.close_connection = True  # the request body stays unread
                self._send_error(S3Error(503, "ServiceUnavailable", detail))
                return
        try:
            if not self._stream_body(request, faults, upstream):
                return  # the connection was reset on purpose
            if held is not None:  # the body arrived; the answer never does
                owner._count(held[0])
                owner._stopping.wait(held[1])
                self.close_connection = True
                return
            if answer is not None:
                owner._count(answer[0])
                self._send_error(answer[1])
                return
            self._relay(upstream.getresponse(), faults, request)
        finally:
            if upstream is not None:
                upstream.close()

    def _stream_body(self, request: Request, faults: list[Fault], upstream: http.client.HTTPConnection | None) -> bool:
        """Pass the request body on as it arrives (so S3's own processing overlaps the transfer),
        paced by the upload cap; False if a fault reset the connection part-way."""
        rates = self._rates(faults, request, request.body_length, "upload_rate")
        resets = [(n, f) for f in faults if (n := f.reset_after(request)) is not None]
        reset_at = min(resets, key=lambda item: item[0]) if resets else None
        throttle = _Throttle(min(rates) if rates else None)
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        body = self._read_chunked(throttle) if chunked else None
        if upstream is not None:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for key, value in self.headers.items():
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    upstream.putheader(key, value)
            upstream.putheader("Content-Length", str(len(body) if chunked else request.body_length))
            upstream.endheaders()
            if chunked:
                upstream.send(body)
        if chunked:
            return True
        remaining = request.body_length
        token = id(throttle)
        try:
            piece = throttle.piece()
            while remaining:
                chunk = self.rfile.read(min(piece, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
                throttle.account(len(chunk))  # paced before S3 sees it: a slow link, not a slow S3
                if upstream is not None:
                    upstream.send(chunk)
                if remaining:
                    with self.owner._lock:
                        self.owner._in_flight[token] = throttle.sent
                if reset_at is not None and throttle.sent >= reset_at[0]:
                    self.owner._count(reset_at[1])
                    self._reset()
                    return False
        finally:
            with self.owner._lock:
                self.owner._in_flight.pop(token, None)
        if throttle.sent:
            with self.owner._lock:
                self.owner.uploads.append((throttle.sent, time.monotonic() - throttle.started))
        return True

    def _rates(self, faults: list[Fault], request: Request, size: int, direction: str) -> list[float]:
        """The caps on a body moving in ``direction``; each cap that paces a body counts as acting."""
        paced = [(f, r) for f in faults if (r := getattr(f, direction)(request))]
        if size:
            for fault, _ in paced:
                self.owner._count(fault)
        return [r for _, r in paced]

    def _read_chunked(self, throttle: _Throttle) -> bytes:
        parts = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()
            throttle.account(size)

    def _reset(self) -> None:
        """Close with RST, not FIN: the client sees 'connection reset by peer' mid-upload."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _send_error(self, error: S3Error) -> None:
        request_id = uuid.uuid4().hex[:16].upper()
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{error.code}</Code><Message>{error.message}</Message>"
            f"<RequestId>{request_id}</RequestId><HostId>spotchaos-fault-proxy</HostId></Error>"
        ).encode()
        self.send_response(error.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-amz-request-id", request_id)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _relay(self, response: http.client.HTTPResponse, faults: list[Fault], request: Request) -> None:
        payload = response.read()
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP and key.lower() not in ("content-length", "server", "date"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command == "HEAD":
            return
        with self.owner._lock:
            self.owner.downloaded += len(payload)
        rates = self._rates(faults, request, len(payload), "download_rate")
        throttle = _Throttle(min(rates) if rates else None)
        step = throttle.piece()
        for start in range(0, len(payload), step):
            piece = payload[start : start + step]
            throttle.account(len(piece))
            self.wfile.write(piece)

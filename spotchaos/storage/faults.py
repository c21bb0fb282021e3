"""Storage faults with S3 semantics, each a small named object that can be switched on and off.

Like Toxiproxy's toxics: the proxy consults every enabled fault for each request. A fault may
answer in S3's place (an S3 error document with S3's status code), delay the request, cap the
bandwidth of the body in either direction, reset the connection part-way through an upload, or
hold the request past the client's timeout. moto alone serves S3 perfectly; these are what it
does not do.
"""

from __future__ import annotations

import random
import re
import threading
import time
from dataclasses import dataclass, field

WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})
CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


@dataclass(frozen=True)
class Request:
    """What a fault may look at: the S3 request as it arrived at the proxy."""

    method: str
    path: str
    headers: dict[str, str]
    body_length: int

    @property
    def access_key(self) -> str | None:
        found = CREDENTIAL.search(self.headers.get("authorization", ""))
        return found.group(1) if found else None

    @property
    def is_upload(self) -> bool:
        return self.method in ("PUT", "POST") and self.body_length > 0


@dataclass(frozen=True)
class S3Error:
    """An answer in S3's place."""

    status: int
    code: str
    message: str


@dataclass
class Fault:
    """Base: does nothing. ``enabled`` is the on/off switch; ``name`` appears in reports."""

    name: str = field(default="fault", init=False)
    enabled: bool = field(default=True, kw_only=True)

    def armed(self) -> None:
        """Called when a proxy takes the fault on: a fault with a clock resets it here (so one object can be
        added again for another run)."""

    def answer(self, request: Request) -> S3Error | None:
        return None

    def delay(self, request: Request) -> float:
        return 0.0

    def upload_rate(self, request: Request) -> float | None:
        return None

    def download_rate(self, request: Request) -> float | None:
        return None

    def reset_after(self, request: Request) -> int | None:
        return None

    def hang(self, request: Request) -> float | None:
        return None


@dataclass
class Latency(Fault):
    """Every request waits ``seconds`` before S3 sees it (a distant region, a congested link)."""

    seconds: float = 0.05
    name: str = field(default="latency", init=False)

    def delay(self, request: Request) -> float:
        return self.seconds


@dataclass
class Bandwidth(Fault):
    """Bodies move at most ``bytes_per_second`` (uploads, downloads or both)."""

    bytes_per_second: float = 10 * 2**20
    uploads: bool = True
    downloads: bool = True
    name: str = field(default="bandwidth", init=False)

    def __post_init__(self) -> None:
        if not self.bytes_per_second > 0:
            raise ValueError(f"bandwidth must be positive bytes per second, got {self.bytes_per_second!r}")

    def upload_rate(self, request: Request) -> float | None:
        return self.bytes_per_second if self.uploads else None

    def download_rate(self, request: Request) -> float | None:
        return self.bytes_per_second if self.downloads else None


@dataclass
class _Random(Fault):
    probability: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.probability <= 1:
            raise ValueError(f"probability must be in [0, 1], got {self.probability!r}")
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()

    def _hit(self) -> bool:
        with self._lock:  # the proxy serves requests from several threads
            return self._random.random() < self.probability


@dataclass
class SlowDown(_Random):
    """``503 SlowDown`` with a probability: S3 throttling a prefix under load."""

    name: str = field(default="slow-down", init=False)

    def answer(self, request: Request) -> S3Error | None:
        return S3Error(503, "SlowDown", "Please reduce your request rate.") if self._hit() else None


@dataclass
class InternalError(_Random):
    """``500 InternalError`` with a probability."""

    name: str = field(default="internal-error", init=False)

    def answer(self, request: Request) -> S3Error | None:
        if self._hit():
            return S3Error(500, "InternalError", "We encountered an internal error. Please try again.")
        return None


@dataclass
class ResetMidUpload(_Random):
    """The connection is reset after ``after_bytes`` of an upload's body (a dying NAT, a reclaimed
    host), for a share ``probability`` of the uploads that long (all of them by default)."""

    after_bytes: int = 1 << 20
    probability: float = 1.0
    name: str = field(default="reset-mid-upload", init=False)

    def reset_after(self, request: Request) -> int | None:
        if request.is_upload and request.body_length > self.after_bytes and self._hit():
            return self.after_bytes
        return None


@dataclass
class Hang(Fault):
    """Requests (all, or only these methods) get no answer for ``seconds``: past the client's timeout."""

    seconds: float = 120.0
    methods: frozenset[str] = frozenset()
    name: str = field(default="hang", init=False)

    def hang(self, request: Request) -> float | None:
        return self.seconds if not self.methods or request.method in self.methods else None


@dataclass
class ExpiredToken(Fault):
    """From ``after_seconds`` after the first request it sees, every request is ``400 ExpiredToken``:
    credentials that expire mid-run.

    The clock starts at the job's first S3 request, not when the fault is added: a job's start-up
    (interpreter, torch import, CUDA init) takes seconds that vary from machine to machine, and a clock
    started before it would land the expiry at a different point of the job's work on each of them."""

    after_seconds: float = 0.0
    name: str = field(default="expired-token", init=False)

    def __post_init__(self) -> None:
        self.armed()

    def armed(self) -> None:
        self._since: float | None = None

    def answer(self, request: Request) -> S3Error | None:
        now = time.monotonic()
        if self._since is None:
            self._since = now  # two first requests racing start it within microseconds of each other
        if now - self._since >= self.after_seconds:
            return S3Error(400, "ExpiredToken", "The provided token has expired.")
        return None


@dataclass
class ReadOnly(Fault):
    """Credentials that may read but not write: PUT, POST and DELETE are ``403 AccessDenied``
    (for one access key, or for everyone)."""

    access_key: str | None = None
    name: str = field(default="read-only", init=False)

    def answer(self, request: Request) -> S3Error | None:
        if request.method in WRITE_METHODS and self.access_key in (None, request.access_key):
            return S3Error(403, "AccessDenied", "Access Denied")
        return None


@dataclass
class InvalidCredentials(Fault):
    """Every request is ``403 InvalidAccessKeyId``: a wrong or deleted access key from the start."""

    name: str = field(default="invalid-credentials", init=False)

    def answer(self, request: Request) -> S3Error | None:
        return S3Error(403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")

"""How a reclaim notice reaches a service (or a trainer): SIGTERM, or the cloud's instance metadata.

Each channel is a small named object with one job, delivering the notice (like the faults). A
metadata channel serves the provider's endpoint itself, on 127.0.0.1, and hands its address to the
job through the variable the provider's SDKs read (``AWS_EC2_METADATA_SERVICE_ENDPOINT`` for
botocore, ``GCE_METADATA_HOST`` for google-auth and the GCP client libraries) and through the
contract's ``SPOTCHAOS_METADATA_URL`` and ``SPOTCHAOS_METADATA_PROVIDER`` for every cloud (Azure's
and Alibaba's SDKs read no such variable). The real link-local address (169.254.169.254) is never on
this machine's loopback and is never contacted.

What each provider serves, as its documentation describes it:

- AWS (IMDSv2: ``PUT /latest/api/token`` first, the token on every read): ``spot/instance-action``
  and ``events/recommendations/rebalance`` answer 404 until the notice, then JSON.
- GCP (``Metadata-Flavor: Google`` required): ``instance/preempted`` answers ``FALSE`` then ``TRUE``;
  ``?wait_for_change=true`` holds the answer until it changes (or ``timeout_sec``).
- Azure Scheduled Events (``Metadata: true`` required): ``/metadata/scheduledevents`` lists a
  ``Preempt`` event with its ``NotBefore``.
- Alibaba ECS: ``instance/spot/termination-time`` answers 404, then the UTC time; the hardened mode's
  token (``X-aliyun-ecs-metadata-token``) is honoured when sent.
"""

from __future__ import annotations

import abc
import json
import secrets
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..backends.base import Handle

ENV_METADATA_URL = "SPOTCHAOS_METADATA_URL"
ENV_METADATA_PROVIDER = "SPOTCHAOS_METADATA_PROVIDER"
AWS_ENDPOINT_VARIABLE = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
GCE_HOST_VARIABLE = "GCE_METADATA_HOST"
AWS_TOKEN = "/latest/api/token"
AWS_INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
AWS_REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
GCP_PREEMPTED = "/computeMetadata/v1/instance/preempted"
AZURE_EVENTS = "/metadata/scheduledevents"
ALIBABA_TOKEN = "/latest/api/token"
ALIBABA_TERMINATION = "/latest/meta-data/instance/spot/termination-time"
LONGEST_HOLD_SECONDS = 30.0  # a wait_for_change read is answered at least this often


@dataclass
class SigtermNotice:
    """SIGTERM to the service's main process: docker stop, a Kubernetes pod deletion."""

    name: str = field(default="sigterm", init=False)

    def environment(self) -> dict[str, str]:
        return {}

    def deliver(self, handle: Handle | None, deadline_wall: float) -> None:
        if handle is not None:
            handle.notify(signal.SIGTERM, whole_group=False)

    def how_it_was_read(self, notice_at: float) -> str:
        return ""

    def close(self) -> None:
        pass


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MetadataNotice(abc.ABC):
    """A provider's instance metadata, served on 127.0.0.1 until :meth:`close`. Subclasses answer
    their provider's paths (:meth:`answer`); the notice is posted by :meth:`deliver`."""

    name = "metadata"
    watched: tuple[str, ...] = ()  # the paths that carry the notice: their reads are counted

    def __init__(self) -> None:
        self.deadline_wall: float | None = None  # set by deliver(): the notice is up
        self.posted_wall: float | None = None
        self.noticed_at: float | None = None
        self.reads: dict[str, int] = {}
        self.first_read_after_notice: float | None = None
        self.tokens: set[str] = set()
        self.changed = threading.Condition()
        notice = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # the test output is not the place
                pass

            def do_GET(self) -> None:
                self._serve("GET")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(min(length, 65536))
                self._serve("POST")

            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                status, body, headers = notice.answer(method, parts.path, parse_qs(parts.query), self.headers)
                if parts.path in notice.watched and status != 401 and status != 400:
                    notice.reads[parts.path] = notice.reads.get(parts.path, 0) + 1
                    if status == 200 and notice.deadline_wall is not None and notice.first_read_after_notice is None:
                        notice.first_read_after_notice = time.monotonic()
                data = body.encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the job was killed (or gave up) while asking: no traceback on the test output

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name=f"spotchaos-{self.name}", daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.host}/"

    def environment(self) -> dict[str, str]:
        return {ENV_METADATA_URL: self.url, ENV_METADATA_PROVIDER: self.name}

    @abc.abstractmethod
    def answer(self, method: str, path: str, query: dict[str, list[str]], headers: Any) -> tuple[int, str, dict]:
        """The provider's answer to one request: status, body, headers."""

    def issue_token(self, asked: Any) -> tuple[int, str, dict]:
        """A session token (IMDSv2, Alibaba's hardened mode) for a well-formed ``PUT``; 400 otherwise."""
        if not asked:
            return 400, "", {}
        token = secrets.token_urlsafe(24)
        self.tokens.add(token)
        return 200, token, {}

    def deliver(self, handle: Handle | None, deadline_wall: float) -> None:
        with self.changed:
            self.deadline_wall = deadline_wall
            self.posted_wall = time.time()
            self.noticed_at = time.monotonic()
            self.changed.notify_all()

    def how_it_was_read(self, notice_at: float) -> str:
        """For the verdict: did the job read the notice, and how soon."""
        paths = " and ".join(f"{path.rsplit('/', 1)[-1]} {self.reads.get(path, 0)} time(s)" for path in self.watched)
        read = self.first_read_after_notice
        return f"it read {paths}, " + (
            f"the notice {read - notice_at:.2f} s after it was posted" if read else "never after the notice"
        )

    def close(self) -> None:
        with self.changed:
            self.changed.notify_all()
        self.server.shutdown()
        self.server.server_close()


class AwsMetadataNotice(MetadataNotice):
    """EC2 instance metadata, IMDSv2: the rebalance recommendation and ``spot/instance-action``."""

    name = "aws"
    watched = (AWS_INSTANCE_ACTION, AWS_REBALANCE)

    def environment(self) -> dict[str, str]:
        return {**super().environment(), AWS_ENDPOINT_VARIABLE: self.url}

    def answer(self, method: str, path: str, query: dict, headers: Any) -> tuple[int, str, dict]:
        if method == "PUT":
            return self.issue_token(path == AWS_TOKEN and headers.get("X-aws-ec2-metadata-token-ttl-seconds"))
        if headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return 401, "", {}
        if path not in self.watched or self.deadline_wall is None:
            return 404, "", {}
        if path == AWS_REBALANCE:
            return 200, json.dumps({"noticeTime": _iso(self.posted_wall or time.time())}), {}
        return 200, json.dumps({"action": "terminate", "time": _iso(self.deadline_wall)}), {}


class GcpMetadataNotice(MetadataNotice):
    """Compute Engine metadata: ``instance/preempted`` turns ``TRUE``; wait_for_change is honoured."""

    name = "gcp"
    watched = (GCP_PREEMPTED,)

    def environment(self) -> dict[str, str]:
        return {**super().environment(), GCE_HOST_VARIABLE: self.host}

    def answer(self, method: str, path: str, query: dict, headers: Any) -> tuple[int, str, dict]:
        if headers.get("Metadata-Flavor") != "Google":
            return 403, "Missing required header: Metadata-Flavor: Google\n", {}
        if method != "GET" or path != GCP_PREEMPTED:
            return 404, "", {}
        if query.get("wait_for_change", [""])[0].lower() == "true":
            try:
                hold = min(float(query.get("timeout_sec", [LONGEST_HOLD_SECONDS])[0]), LONGEST_HOLD_SECONDS)
            except ValueError:
                return 400, "timeout_sec must be a number\n", {}
            with self.changed:
                self.changed.wait_for(lambda: self.deadline_wall is not None, timeout=hold)
        value = "TRUE" if self.deadline_wall is not None else "FALSE"
        return 200, value, {"Metadata-Flavor": "Google", "Content-Type": "application/text"}


class AzureScheduledEvents(MetadataNotice):
    """Azure Scheduled Events: a ``Preempt`` event whose ``NotBefore`` is the deadline."""

    name = "azure"
    watched = (AZURE_EVENTS,)

    def __init__(self) -> None:
        self.event_id = str(uuid.uuid4()).upper()
        self.acknowledged = False
        super().__init__()

    def answer(self, method: str, path: str, query: dict, headers: Any) -> tuple[int, str, dict]:
        if headers.get("Metadata") != "true":
            return 400, json.dumps({"error": "Bad request. Required metadata header not specified"}), {}
        if path != AZURE_EVENTS:
            return 404, "", {}
        if method == "POST":  # StartRequests: the VM says it is ready; the platform may go sooner
            self.acknowledged = True
            return 200, "", {}
        events = []
        if self.deadline_wall is not None:
            events.append(
                {
                    "EventId": self.event_id,
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": ["spotchaos-vm"],
                    "EventStatus": "Scheduled",
                    "NotBefore": formatdate(self.deadline_wall, usegmt=True),
                    "Description": "Spot eviction",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            )
        body = {"DocumentIncarnation": len(events), "Events": events}
        return 200, json.dumps(body), {"Content-Type": "application/json"}


class AlibabaMetadataNotice(MetadataNotice):
    """Alibaba Cloud ECS metadata: ``instance/spot/termination-time``, hardened-mode tokens honoured."""

    name = "alibaba"
    watched = (ALIBABA_TERMINATION,)

    def answer(self, method: str, path: str, query: dict, headers: Any) -> tuple[int, str, dict]:
        if method == "PUT":
            return self.issue_token(path == ALIBABA_TOKEN and headers.get("X-aliyun-ecs-metadata-token-ttl-seconds"))
        sent = headers.get("X-aliyun-ecs-metadata-token")
        if sent is not None and sent not in self.tokens:
            return 401, "", {}
        if path != ALIBABA_TERMINATION or self.deadline_wall is None:
            return 404, "", {}
        return 200, _iso(self.deadline_wall), {}


CHANNELS: dict[str, type] = {
    "sigterm": SigtermNotice,
    "aws": AwsMetadataNotice,
    "gcp": GcpMetadataNotice,
    "azure": AzureScheduledEvents,
    "alibaba": AlibabaMetadataNotice,
}


def channel(name: str) -> SigtermNotice | MetadataNotice:
    """A fresh channel by name (a metadata server starts listening at once)."""
    return CHANNELS[name]()

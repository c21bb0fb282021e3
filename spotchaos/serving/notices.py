"""How a reclaim notice reaches a service: SIGTERM, or the cloud's instance metadata.

Each channel is a small named object with one job, delivering the notice (like the faults). The
metadata channel serves the provider's endpoint itself, on 127.0.0.1, and hands its address to the
service through the variable the provider's SDK reads (``AWS_EC2_METADATA_SERVICE_ENDPOINT``, which
botocore honours) and the contract's ``SPOTCHAOS_METADATA_URL``: the real link-local address is
never on this machine's loopback and is never contacted.
"""

from __future__ import annotations

import json
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..backends.base import Handle

ENV_METADATA_URL = "SPOTCHAOS_METADATA_URL"
AWS_ENDPOINT_VARIABLE = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
AWS_INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
AWS_TOKEN = "/latest/api/token"


@dataclass
class SigtermNotice:
    """SIGTERM to the service's main process: docker stop, a Kubernetes pod deletion."""

    name: str = field(default="sigterm", init=False)

    def environment(self) -> dict[str, str]:
        return {}

    def deliver(self, handle: Handle, deadline_wall: float) -> None:
        handle.notify(signal.SIGTERM, whole_group=False)

    def close(self) -> None:
        pass


class AwsMetadataNotice:
    """EC2 instance metadata (IMDSv2): ``spot/instance-action`` answers 404 until the notice, then
    ``{"action": "terminate", "time": ...}``; every read needs a token from ``PUT /latest/api/token``."""

    name = "aws"

    def __init__(self) -> None:
        self.action: dict[str, str] | None = None
        self.tokens: set[str] = set()
        self.reads = 0  # instance-action reads, with a valid token
        self.first_read_after_notice: float | None = None
        self.noticed_at: float | None = None
        notice = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # the test output is not the place
                pass

            def do_PUT(self) -> None:
                if self.path != AWS_TOKEN or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._answer(400, "")
                    return
                token = secrets.token_urlsafe(24)
                notice.tokens.add(token)
                self._answer(200, token)

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") not in notice.tokens:
                    self._answer(401, "")
                    return
                if self.path != AWS_INSTANCE_ACTION:
                    self._answer(404, "")
                    return
                notice.reads += 1
                if notice.action is None:
                    self._answer(404, "")
                    return
                if notice.first_read_after_notice is None:
                    notice.first_read_after_notice = time.monotonic()
                self._answer(200, json.dumps(notice.action))

            def _answer(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="spotchaos-aws-metadata", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def environment(self) -> dict[str, str]:
        return {AWS_ENDPOINT_VARIABLE: self.url, ENV_METADATA_URL: self.url}

    def deliver(self, handle: Handle, deadline_wall: float) -> None:
        when = datetime.fromtimestamp(deadline_wall, UTC).replace(microsecond=0) + timedelta(seconds=0)
        self.action = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        self.noticed_at = time.monotonic()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def channel(name: str) -> SigtermNotice | AwsMetadataNotice:
    return AwsMetadataNotice() if name == "aws" else SigtermNotice()

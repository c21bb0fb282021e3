"""A real S3 endpoint on loopback: moto's server app, owned by a context manager.

moto's own ``ThreadedMotoServer`` binds inside its thread, so a port already in use leaves
``start()`` waiting forever; here the socket is bound in the caller's thread (a clear error at
once) and served from a daemon thread. Port 0 picks a free port. Only 127.0.0.1 is ever bound.
"""

from __future__ import annotations

import socket
import urllib.request

from ..errors import BackendError
from .loopback import LOOPBACK, LoopbackServer


class MotoS3(LoopbackServer):
    """``with MotoS3() as s3: s3.endpoint`` — moto's S3 (and IAM/STS) over HTTP on 127.0.0.1."""

    label = "moto S3 server"

    def _bind(self):
        try:
            from moto.moto_server.werkzeug_app import (
                DomainDispatcherApplication,
                MotoRequestHandler,
                create_backend_app,
            )
            from werkzeug.serving import make_server
        except ImportError as exc:
            raise BackendError(f"moto's server is not installed ({exc}): pip install 'moto[server]'") from None

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args, **kwargs) -> None:
                pass  # the jobs' storage traffic is not the test session's output

        if self.port:  # werkzeug prints and exits on a taken port: ask the socket first
            with socket.socket() as probe:
                probe.bind((LOOPBACK, self.port))
        app = DomainDispatcherApplication(create_backend_app)
        return make_server(LOOPBACK, self.port, app, threaded=True, request_handler=QuietHandler)

    def reset(self) -> None:
        """Forget every bucket, object and IAM user (between scenarios), through moto's own reset API."""
        self._post("reset", b"")

    def enforce_auth(self, on: bool) -> None:
        """Check every request's signature and IAM policy (real ``InvalidAccessKeyId``,
        ``SignatureDoesNotMatch``, ``AccessDenied``), or accept any credentials (moto's default).

        moto keeps this switch in a module global: it holds for every moto in this process.
        """
        self._post("reset-auth", b"0" if on else b"inf")

    def _post(self, action: str, body: bytes) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/{action}", data=body, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

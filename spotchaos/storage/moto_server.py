"""A real S3 endpoint on loopback: moto's server app, owned by a context manager.

moto's own ``ThreadedMotoServer`` binds inside its thread, so a port already in use leaves
``start()`` waiting forever; here the socket is bound in the caller's thread (a clear error at
once) and served from a daemon thread. Port 0 picks a free port. Only 127.0.0.1 is ever bound.

moto's admin API (``/moto-api/``: reset every bucket, switch IAM checks off) has no
authentication of its own, and a job could find moto's port on loopback: here it answers only
requests that carry the harness's own token, so a job cannot make a refusal scenario meaningless.
"""

from __future__ import annotations

import secrets
import socket
import urllib.request

from ..extras import MissingExtra
from .loopback import LOOPBACK, LoopbackServer, is_moto_admin

ADMIN_HEADER = "X-Spotchaos-Admin"


class _AdminGuard:
    """WSGI middleware: ``/moto-api/`` only with the harness's token (403 otherwise)."""

    def __init__(self, app, token: str) -> None:
        self.app = app
        self.token = token
        self.environ_key = "HTTP_" + ADMIN_HEADER.upper().replace("-", "_")

    def __call__(self, environ, start_response):
        if is_moto_admin(environ.get("PATH_INFO", "")) and environ.get(self.environ_key) != self.token:
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [b"moto's admin API is reserved to the spotchaos harness\n"]
        return self.app(environ, start_response)


class MotoS3(LoopbackServer):
    """``with MotoS3() as s3: s3.endpoint`` — moto's S3 (and IAM/STS) over HTTP on 127.0.0.1."""

    label = "moto S3 server"

    def __init__(self, port: int = 0) -> None:
        super().__init__(port)
        self._token = secrets.token_hex(16)  # the admin API's key: never handed to a job

    def _bind(self):
        try:
            from moto.moto_server.werkzeug_app import (
                DomainDispatcherApplication,
                MotoRequestHandler,
                create_backend_app,
            )
            from werkzeug.serving import make_server
        except ImportError as exc:
            raise MissingExtra(
                f"the S3 server needs moto's server, which is not installed ({exc}): pip install 'spotchaos[s3]'"
            ) from None

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args, **kwargs) -> None:
                pass  # the jobs' storage traffic is not the test session's output

        if self.port:  # werkzeug prints and exits on a taken port: ask the socket first
            with socket.socket() as probe:
                probe.bind((LOOPBACK, self.port))
        app = _AdminGuard(DomainDispatcherApplication(create_backend_app), self._token)
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
            f"{self.endpoint}/moto-api/{action}",
            data=body,
            method="POST",
            headers={"Content-Type": "text/plain", ADMIN_HEADER: self._token},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

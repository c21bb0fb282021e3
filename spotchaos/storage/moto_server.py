"""A real S3 endpoint on loopback: moto's server app, owned by a context manager.

moto's own ``ThreadedMotoServer`` binds inside its thread, so a port already in use leaves
``start()`` waiting forever; here the socket is bound in the caller's thread (a clear error at
once) and served from a daemon thread. Port 0 picks a free port. Only 127.0.0.1 is ever bound.
"""

from __future__ import annotations

import socket
import threading
import urllib.request
from types import TracebackType

from ..errors import BackendError

LOOPBACK = "127.0.0.1"


class MotoS3:
    """``with MotoS3() as s3: s3.endpoint`` — moto's S3 (and IAM/STS) over HTTP on 127.0.0.1."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise BackendError("the moto server is not running")
        return f"http://{LOOPBACK}:{self._server.server_port}"

    def start(self) -> MotoS3:
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

        app = DomainDispatcherApplication(create_backend_app)
        failure = f"cannot start the moto S3 server on {LOOPBACK}:{self.port}"
        try:
            if self.port:  # werkzeug prints and exits on a taken port: ask the socket first
                with socket.socket() as probe:
                    probe.bind((LOOPBACK, self.port))
            self._server = make_server(LOOPBACK, self.port, app, threaded=True, request_handler=QuietHandler)
        except OSError as exc:
            raise BackendError(f"{failure}: {exc.strerror or exc}") from None
        except SystemExit:
            raise BackendError(f"{failure}: the port is in use") from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="spotchaos-moto", daemon=True)
        self._thread.start()
        return self

    def reset(self) -> None:
        """Forget every bucket and object (between scenarios), through moto's own reset API."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

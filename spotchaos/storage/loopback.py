"""The life of a threaded server on 127.0.0.1 that a context manager owns (the S3 server and the
fault proxy share it): bind in the caller's thread so a taken port fails at once, serve from a
daemon thread, and on exit shut down, close the socket and join the thread."""

from __future__ import annotations

import abc
import posixpath
import threading
from types import TracebackType
from typing import Any, Self
from urllib.parse import unquote, urlsplit

from ..errors import BackendError

LOOPBACK = "127.0.0.1"
MOTO_ADMIN_PREFIX = "/moto-api"


def is_moto_admin(target: str) -> bool:
    """Whether a request target reaches moto's unauthenticated admin API (``/moto-api/reset``
    wipes every bucket, ``/moto-api/reset-auth`` turns IAM checks off), however it is spelled:
    an absolute URI, percent-encoding, doubled slashes, dot segments, any case."""
    path = unquote(urlsplit(target).path or target).lower()
    normal = posixpath.normpath("/" + path.lstrip("/"))
    return normal == MOTO_ADMIN_PREFIX or normal.startswith(MOTO_ADMIN_PREFIX + "/")


class LoopbackServer(abc.ABC):
    label = "server"  # for messages: "cannot start the <label> on 127.0.0.1:PORT"

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @abc.abstractmethod
    def _bind(self) -> Any:
        """Create and bind the server object (``serve_forever``, ``server_port``, ``shutdown``)."""

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise BackendError(f"the {self.label} is not running")
        return f"http://{LOOPBACK}:{self._server.server_port}"

    def start(self) -> Self:
        try:
            self._server = self._bind()
        except OSError as exc:
            raise BackendError(
                f"cannot start the {self.label} on {LOOPBACK}:{self.port}: {exc.strerror or exc}"
            ) from None
        except SystemExit:  # werkzeug prints and exits on a port it cannot bind
            raise BackendError(f"cannot start the {self.label} on {LOOPBACK}:{self.port}: the port is in use") from None
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"spotchaos-{self.label}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

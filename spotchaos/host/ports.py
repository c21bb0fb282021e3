"""Ports on 127.0.0.1: a free one for a server the harness starts (a rendezvous, a service)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1 now (the server that is handed it binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

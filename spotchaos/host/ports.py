"""Ports on 127.0.0.1: a free one for a server the harness starts (a rendezvous, a service)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
BELOW_EPHEMERAL = 12768  # ports tried below the kernel's ephemeral range: 20000-32767 with Linux's default
TRIES = 64


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1 now (the server that is handed it binds it next),
    chosen below the kernel's ephemeral range.

    Why not ``bind(("127.0.0.1", 0))``: that port comes from the ephemeral range, which the kernel
    also hands out as the source port of every outgoing connection on the machine. Between this
    check and the server's own bind, any connect may take it: a torchrun restart's rendezvous store
    failed so in the main job (``EADDRINUSE`` on port 41983, reported as a changed verdict). A
    port below the range is taken only by a bind, and a random one of some 12,000 rarely by two
    pickers at once; where no range is known, or none of its ports is free, the kernel picks."""
    low = _ephemeral_low()
    if low is not None and low - BELOW_EPHEMERAL >= 1024:
        for _ in range(TRIES):
            port = random.randrange(low - BELOW_EPHEMERAL, low)
            if bind_error(port) is None:
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int | None:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def bind_error(port: int) -> OSError | None:
    """Why ``port`` on 127.0.0.1 cannot be bound now (None: it can): a free pick and a configured
    port are checked the one way."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc
        return None

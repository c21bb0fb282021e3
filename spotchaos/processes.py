"""Finding a job's processes by identity, never by name.

A pid alone is not an identity: once a process dies its pid can be reused by an unrelated one.
A process here is named by its pid *and* its start time (``/proc/PID/stat`` field 22, clock
ticks since boot), or by the run's marker variable (``SPOTCHAOS_RUN_ID=<id>``) that every
process of a job inherits, including one that left its process group with ``setsid()``.
Linux ``/proc`` only; elsewhere these find nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields after ``(comm)`` of ``/proc/PID/stat`` (comm may hold spaces and parentheses)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), None if it is gone or a zombie."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])


def is_running(pid: int, started: int | None) -> bool:
    """Whether the process that had ``pid`` and started at ``started`` still runs."""
    return started is not None and start_time(pid) == started


def _live_where(test: Callable[[list[str]], bool]) -> list[int]:
    """Live (non-zombie) processes whose stat fields pass ``test`` (state, ppid, pgrp, ...)."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and len(fields) > 2 and fields[0] != "Z" and test(fields):
                found.append(int(entry.name))
    return found


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    if not PROC.is_dir():  # not Linux: fall back to asking whether the group exists at all
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    return _live_where(lambda fields: int(fields[2]) == pgid)


def children(parent: int) -> list[int]:
    """Live processes whose parent is ``parent``."""
    return _live_where(lambda fields: int(fields[1]) == parent) if PROC.is_dir() else []


def carrying(marker: str) -> list[int]:
    """Live processes (not this one) whose environment holds ``marker`` (``NAME=value``)."""
    if not PROC.is_dir():
        return []
    needle = marker.encode()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and start_time(int(entry.name)) is not None:
            found.append(int(entry.name))
    return found


def describe(pid: int) -> str:
    """``pid 123 (python train.py ...)``, for messages."""
    try:
        command = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        command = ""
    return f"pid {pid} ({command[:80]})" if command else f"pid {pid}"


def end(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` (already gone is fine)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def end_marked(marker: str) -> list[str]:
    """End every process carrying ``marker`` (a job's processes that escaped their group) and
    describe each, for the report's warning."""
    found = carrying(marker)
    described = [describe(pid) for pid in found]
    end(found)
    return described

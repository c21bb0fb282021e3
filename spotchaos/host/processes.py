"""Finding a job's processes by identity, never by name.

A pid alone is not an identity: once a process dies its pid can be reused by an unrelated one.
A process here is named by its pid *and* its start time (``/proc/PID/stat`` field 22, clock
ticks since boot), or by the run's marker variable (``SPOTCHAOS_RUN_ID=<id>``) that every
process of a job inherits, including one that left its process group with ``setsid()``.
Linux ``/proc`` only; elsewhere these find nothing.

The marker is not enough: a process started with a clean environment (``env -i``, ``sudo``, a
launcher or a runtime shim) in a session of its own carries neither. So the harness makes itself
the *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``) before its first job: whatever a job
leaves orphaned, at any depth, is re-parented to the harness instead of to init, and is found by
ancestry once the attempt ends (:func:`end_adopted`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BackendError

PROC = Path("/proc")
PR_SET_CHILD_SUBREAPER = 36
_subreaper = False
# leaders of the jobs this process started itself and has not cleaned up yet: its own children,
# never taken for orphans it adopted
own_leaders: set[int] = set()


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


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (a Ray node's ``ray start`` and its daemons)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children(current))
    return found


def is_mine(pid: int) -> bool:
    """Whether ``pid`` runs as this user (its real uid): root reads every process's environment,
    so a marker alone proves nothing of another user's process."""
    try:
        return (PROC / str(pid)).stat().st_uid == os.getuid()
    except OSError:
        return False


def carries(pid: int, marker: str) -> bool:
    """Whether ``pid``'s environment holds ``marker`` (``NAME=value``). The environment is readable
    by its owner only, so a run's random marker there proves the process is that run's."""
    return marker.encode() in _environ(pid)


def _environ(pid: int) -> list[bytes]:
    """``pid``'s environment as it started, ``NAME=value`` items (none: gone or unreadable)."""
    try:
        return (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def environment_value(pid: int, name: str) -> str | None:
    """The value ``pid`` started with for the variable ``name`` (None: unset, or the process gone)."""
    prefix = name.encode() + b"="
    found = next((item for item in _environ(pid) if item.startswith(prefix)), None)
    return None if found is None else found[len(prefix) :].decode("utf-8", "replace")


def parent_of(pid: int) -> int | None:
    """``pid``'s parent (None: gone)."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


def carrying(marker: str) -> list[int]:
    """Live processes (not this one) of this user whose environment holds ``marker`` (``NAME=value``)."""
    if not PROC.is_dir():
        return []
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        if carries(pid, marker) and is_mine(pid) and start_time(pid) is not None:
            found.append(pid)
    return found


def holding(folder: Path) -> list[int]:
    """Live processes (not this one) with a file under ``folder`` open: what a dead session's
    scratch folder still has running in it (a daemon that dropped the run's marker, say). Links are
    only read, never followed."""
    if not PROC.is_dir():
        return []
    prefix = str(folder).rstrip("/") + "/"
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            descriptors = list((entry / "fd").iterdir())
        except OSError:
            continue
        targets = []
        for fd in descriptors:  # one closed while read is skipped, not the whole process
            with contextlib.suppress(OSError):
                targets.append(os.readlink(fd))
        if any(target.startswith(prefix) for target in targets) and start_time(int(entry.name)) is not None:
            found.append(int(entry.name))
    return found


def describe(pid: int) -> str:
    """``pid 123 (python3 -u train.py --steps ...)``, for messages: each absolute path by its last
    part, so what the process runs shows however deep the checkout lies."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        argv = []
    command = " ".join(" ".join(os.path.basename(a) if os.path.isabs(a) else a for a in argv if a).split())
    return f"pid {pid} ({command[:80]})" if command else f"pid {pid}"


def end(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` (already gone is fine)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_group_until_gone(handle: Any, seconds: float = 10.0) -> None:
    """SIGKILL an attempt's process group (``handle.end_group``) until its leader has exited and no
    member is left: one loop for an attempt started cold and one forked warm."""
    deadline = time.monotonic() + seconds
    while True:
        handle.end_group()
        handle.wait(0.2)
        if handle.poll() is not None and not handle.survivors():
            return
        if time.monotonic() > deadline:
            raise BackendError(
                f"processes {handle.survivors()} of job group {handle.pid} survived SIGKILL for {seconds:g} s"
            )


def _below(roots: Iterable[int]) -> list[int]:
    """``roots`` and every live process under them, from one reading of ``/proc``."""
    kids: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        fields = _stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and len(fields) > 2 and fields[0] != "Z":
            kids.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(kids.get(pid, ()))
    return sorted(found)


def sweep(marker: str | None, folder: Path | None = None, seconds: float = 10.0) -> dict[int, str]:
    """SIGKILL every live process of this user that carries ``marker`` or holds a file under
    ``folder`` open, and everything under each, pass after pass until a pass finds none (or
    ``seconds`` pass); each ended pid with its description, taken before its kill.

    One pass is not enough: a process forks between the scan and the kill, and a process that
    rewrote its title (Ray's agents, through ``setproctitle``) no longer shows its environment, so
    only its parent, or the folder it writes to, names it; a child of a process proven the run's
    own is the run's own."""
    if not PROC.is_dir() or not (marker or folder):
        return {}
    ended: dict[int, str] = {}
    deadline = time.monotonic() + seconds
    while True:
        proven = set(carrying(marker) if marker else ()) | set(holding(folder) if folder else ())
        live = [pid for pid in _below(proven) if pid != os.getpid() and is_mine(pid) and start_time(pid) is not None]
        if not live or time.monotonic() > deadline:
            return ended
        for pid in live:
            ended.setdefault(pid, describe(pid))
        end(live)
        time.sleep(0.05)


def job_tree(leader: int, marker: str | None = None) -> list[int]:
    """Every live process of one attempt: its process group, everything below its leader by
    ancestry (a torchrun worker, which its agent starts in a session of its own), and whatever
    carries the attempt's ``marker``."""
    if not PROC.is_dir():
        return group_members(leader)
    found = set(group_members(leader)) | set(_below([leader]))
    if marker:
        found |= set(carrying(marker))
    return sorted(pid for pid in found if pid != os.getpid() and is_mine(pid) and start_time(pid) is not None)


@dataclass
class Delivery:
    """What one signal to a job's whole tree met: the processes it reached, and those of them that
    a SIGKILL did not end (a harness error, never a landed fault)."""

    signal: str
    reached: list[str] = field(default_factory=list)
    outlived: list[str] = field(default_factory=list)


def signal_tree(leader: int, signum: int, marker: str | None = None, settle: float = 2.0) -> Delivery:
    """Send ``signum`` to every process of an attempt at once, as a host's end reaches them all.

    The tree is read before the signal: once its parent dies a worker is re-parented and no longer
    found below the leader. After a SIGKILL, each process it reached must be gone within
    ``settle`` seconds; one that is not is named in ``outlived``."""
    pids = job_tree(leader, marker)
    identities = {pid: start_time(pid) for pid in pids}
    delivery = Delivery(signal.Signals(signum).name, [describe(pid) for pid in pids])
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signum)  # a member forked since the reading is in the group still
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    if signum != signal.SIGKILL:
        return delivery
    deadline = time.monotonic() + settle
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if is_running(pid, identities[pid])]
        if alive:
            time.sleep(0.01)
    delivery.outlived = [describe(pid) for pid in alive]
    return delivery


def become_subreaper() -> bool:
    """Make this process the subreaper of everything it starts (Linux 3.4+); once, idempotent."""
    global _subreaper
    if not _subreaper and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            _subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _subreaper


def _adopted(since: int) -> list[tuple[int, bool]]:
    """(pid, is a zombie) for each child of this process that it did not start itself: not a
    job leader it holds, not in its own process group (what ``subprocess.run`` starts), and
    started at or after ``since`` (clock ticks: the ending attempt's start)."""
    if not PROC.is_dir():
        return []
    me, group, skip = os.getpid(), os.getpgrp(), set(own_leaders)
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or len(fields) < 20 or int(fields[1]) != me or int(fields[2]) == group:
            continue
        if int(fields[19]) >= since:
            found.append((int(entry.name), fields[0] == "Z"))
    return found


def end_adopted(since: int | None, ended: Iterable[int] = (), timeout: float = 5.0) -> list[str]:
    """End what an attempt left orphaned (re-parented to this subreaper): each one and, as they
    are re-parented in turn, everything below it; reap the zombies. Describes the live ones not
    in ``ended`` (already ended and described by the caller)."""
    if not _subreaper or since is None:
        return []
    described: dict[int, str] = dict.fromkeys(ended, "")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _adopted(since)
        if not found:
            break
        for pid, zombie in found:
            if zombie:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            else:
                described.setdefault(pid, describe(pid))
                end([pid])  # its own children are re-parented here in turn: the next pass ends them
        time.sleep(0.01)
    return [text for text in described.values() if text]


def end_escaped(marker: str, since: int | None) -> list[str]:
    """End every process an attempt left behind outside its group: those carrying its marker,
    then those it orphaned (found by ancestry, whatever their environment); one line each."""
    found = carrying(marker)
    described = [describe(pid) for pid in found]
    end(found)
    return described + end_adopted(since, ended=found)

"""What a pytest run that died left running, found and ended by the next one.

Every attempt of a job is written down while it runs, under the pytest process that started it
(``<tmp>/spotchaos-<uid>/live/<pid>-<start time>/``): a local job by its leader's pid and start
time plus the run's marker variable, a container by its id, with the attempt's temporary folder.
Cleanup removes the entry. If
pytest is SIGKILLed (an OOM kill, a CI runner that gives up) its entries stay; the next
``--spotchaos`` session, on any backend, finds entries whose pytest process is gone and ends
exactly those processes, containers and folders, never anything matched by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Any

from ..safety.safefs import NotPrivate, private_dir
from .processes import carries, end, group_members, is_mine, is_running, start_time, sweep

LIVE_DIR_VARIABLE = "SPOTCHAOS_LIVE_DIR"  # where the entries live (tests point it elsewhere)
MARKER_VARIABLE = "SPOTCHAOS_RUN_ID"


class LiveJobs:
    """The entries of the jobs this pytest process is running."""

    def __init__(self, directory: Path | None = None) -> None:
        default = Path(tempfile.gettempdir()) / f"spotchaos-{os.getuid()}" / "live"
        self.directory = directory or Path(os.environ.get(LIVE_DIR_VARIABLE) or default)
        me = os.getpid()
        self.owner = f"{me}-{start_time(me) or 0}"

    def add(self, run_id: str, identity: dict[str, Any]) -> Path | None:
        """Write down one running attempt; None when the directory cannot be used (then only
        this process's own cleanup protects it, as before)."""
        try:
            folder = private_dir(private_dir(self.directory) / self.owner)
            entry = folder / f"{uuid.uuid4().hex}.json"
            entry.write_text(json.dumps({"run_id": run_id, **identity}))
        except (OSError, NotPrivate):
            return None
        return entry

    def discard(self, entry: Path | None) -> None:
        if entry is not None:
            with contextlib.suppress(OSError):
                entry.unlink()

    def reap(self) -> list[str]:
        """End what pytest runs that died left behind; one line per thing ended.

        The entries are only trusted as far as their folder is private (this user's, writable by
        nobody else, no link on the way: :class:`NotPrivate` otherwise), and even then a process is
        ended only when it proves itself one of this user's spotchaos jobs: it is this user's and
        its environment, which only its owner can read, carries the run's random marker."""
        if not os.path.lexists(self.directory):
            return []
        private_dir(self.directory)
        ended: list[str] = []
        for folder in sorted(self.directory.iterdir()):
            pid, _, started = folder.name.partition("-")
            if not (pid.isdigit() and started.isdigit()) or folder.is_symlink():
                continue
            if is_running(int(pid), int(started)) or folder.name == self.owner:
                continue  # its pytest still runs: its jobs are its own to end
            for entry in sorted(folder.glob("*.json")):
                with contextlib.suppress(OSError, ValueError, TypeError):
                    ended += _end_entry(json.loads(entry.read_text()), f"pytest pid {pid}")
            shutil.rmtree(folder, ignore_errors=True)
        return ended


def _end_entry(entry: dict[str, Any], owner: str) -> list[str]:
    ended: list[str] = []
    run_id = str(entry.get("run_id") or "")
    pid, started = entry.get("pid"), entry.get("start")
    marker = f"{MARKER_VARIABLE}={run_id}"
    # the leader, as recorded, and only once it proves itself the run's own: then its whole group
    if isinstance(pid, int) and run_id and is_running(pid, started) and is_mine(pid) and carries(pid, marker):
        members = [member for member in group_members(pid) if is_mine(member)]
        end(members)
        ended += [f"job process group {pid} ({len(members)} process(es)) of run {run_id}, left by {owner}"]
    scratch = entry.get("scratch")
    scratch = Path(scratch) if isinstance(scratch, str) and _is_scratch(Path(scratch)) else None
    # everything else of the run: what carries its marker (group members, what escaped with setsid),
    # what holds its scratch folder open (a daemon that lost the marker), and what runs under either
    if run_id or scratch:
        swept = sweep(marker if run_id else None, scratch)
        ended += [f"{what} of run {run_id or scratch}, left by {owner}" for what in swept.values()]
    container = entry.get("container")
    if isinstance(container, str) and container:
        ended += _remove_container(container, owner)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)  # fd-based: links inside are removed, never followed
        ended.append(f"temporary folder {scratch}, left by {owner}")
    return ended


def _is_scratch(path: Path) -> bool:
    """Only an attempt's own temporary folder (``$TMPDIR/spotchaos-tmp-*``, a real folder of this
    user's) is removed: a record naming another session's or another user's folder removes nothing."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (
        path.parent == Path(tempfile.gettempdir())
        and path.name.startswith("spotchaos-tmp-")
        and stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
    )


def _remove_container(container: str, owner: str) -> list[str]:
    try:
        import docker

        docker.from_env(timeout=30).containers.get(container).remove(force=True)
    except Exception as exc:  # no SDK, no daemon, already gone
        if "404" in str(exc) or "No such container" in str(exc):
            return []
        return [f"container {container[:12]} left by {owner} could not be removed: {type(exc).__name__}"]
    return [f"container {container[:12]}, left by {owner}"]

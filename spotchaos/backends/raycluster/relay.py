"""An attempt's folder relayed through Ray, for nodes that do not share the harness's files.

Why: the job speaks to the harness through files in its attempt's folder (its events, its logs,
the step hold's two FIFOs, its exit status). On one machine, or a cluster with a shared folder,
the job writes them where the harness reads them. On a user's cluster whose worker nodes are other
hosts that folder does not exist there, so a fault would not be held at its step and no event
would arrive, and nothing would say so.

So the job's folder is a folder of its own node (:class:`NodeFolder`, made by the agent actor that
starts the job): every variable that named a path in the attempt's folder names the same path
there, the hold's FIFOs are made there, and the agent answers :meth:`NodeFolder.pull` with what
grew since the harness last asked. The harness's :class:`Relay` asks every few tens of
milliseconds over Ray's own channel (an actor call) and writes what comes back into the attempt's
own folder: the events, logs and exit status appended to the files the harness reads as usual, an
announced hold written into the harness's own ``held`` FIFO, and a release read from the harness's
``release`` FIFO and sent on. The rest of the harness does not know the difference; what was
relayed before a node's removal stays with the harness after it.

Both halves use the standard library alone (the node side runs in the agent on any host).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...probe import ENV_HOLD_DIR, ENV_SNAPSHOT_HOLD_DIR, HOLD_HELD, HOLD_RELEASE

HOLD_VARIABLES = (ENV_HOLD_DIR, ENV_SNAPSHOT_HOLD_DIR)
CHUNK_BYTES = 1 << 20  # what one pull carries of one file, at most
PULL_BYTES = 4 << 20  # what one pull carries in all, at most
FILES_MAX = 256  # files of one attempt's folder relayed, at most
PULL_SECONDS = 0.05  # between two pulls: a held job waits at most about this long for the harness to see it


def _beneath(folder: str, value: str) -> str | None:
    """``value``'s path relative to ``folder`` when it names one inside it, else None."""
    if value == folder:
        return ""
    if value.startswith(folder.rstrip(os.sep) + os.sep):
        return value[len(folder.rstrip(os.sep)) + 1 :]
    return None


class NodeFolder:
    """The node's side: the attempt's folder as the job sees it, on the job's own node."""

    def __init__(self, harness_folder: str) -> None:
        self.harness_folder = harness_folder
        self.path = tempfile.mkdtemp(prefix="spotchaos-node-")  # the node's own TMPDIR, 0700
        self.scratch = os.path.join(self.path, ".tmp")  # the job's TMPDIR: the harness's is not here
        os.mkdir(self.scratch, 0o700)
        self._holds: dict[str, tuple[int, int]] = {}  # a hold's folder (relative) -> its held and release fds

    def localize(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with each path in the attempt's folder moved to this node's folder, the hold's
        FIFOs made there, and the job's temporary folder its node's."""
        local = dict(env)
        for name, value in env.items():
            relative = _beneath(self.harness_folder, value)
            if relative is None:
                continue
            local[name] = os.path.join(self.path, relative) if relative else self.path
            if name in HOLD_VARIABLES:
                self._make_hold(relative)
        local["TMPDIR"] = self.scratch
        return local

    def local_path(self, harness_path: str) -> str:
        relative = _beneath(self.harness_folder, harness_path)
        if relative is None:
            raise ValueError(f"{harness_path} is not in the attempt's folder {self.harness_folder}")
        return os.path.join(self.path, relative)

    def _make_hold(self, relative: str) -> None:
        folder = os.path.join(self.path, relative)
        os.mkdir(folder, 0o700)
        fds = []
        for name in (HOLD_HELD, HOLD_RELEASE):
            path = os.path.join(folder, name)
            os.mkfifo(path, 0o600)
            # both ends held here, as the harness holds them: the job's opens never block nor fail
            fds.append(os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW))
        self._holds[relative] = (fds[0], fds[1])

    def pull(self, offsets: Mapping[str, int]) -> dict[str, Any]:
        """What grew in the folder since ``offsets`` (file -> bytes the harness has): each regular
        file's new bytes (bounded), and each hold's announcements since the last pull."""
        files: dict[str, bytes] = {}
        budget = PULL_BYTES
        for relative in self._regular_files():
            have = int(offsets.get(relative, 0))
            try:
                fd = os.open(os.path.join(self.path, relative), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_size <= have:
                    continue
                chunk = os.pread(fd, min(CHUNK_BYTES, budget), have)
            finally:
                os.close(fd)
            if chunk:
                files[relative] = chunk
                budget -= len(chunk)
            if budget <= 0:
                break
        held = {}
        for relative, (held_fd, _) in self._holds.items():
            with contextlib.suppress(BlockingIOError, OSError):
                said = os.read(held_fd, 4096)
                if said:
                    held[relative] = said
        return {"files": files, "held": held}

    def _regular_files(self) -> list[str]:
        found: list[str] = []
        for top, dirs, names in os.walk(self.path):  # os.walk never follows a link to a folder
            dirs[:] = [d for d in dirs if os.path.join(top, d) != self.scratch]
            for name in names:
                full = os.path.join(top, name)
                if os.path.islink(full):
                    continue
                relative = os.path.relpath(full, self.path)
                if os.path.dirname(relative) in self._holds and name in (HOLD_HELD, HOLD_RELEASE):
                    continue  # the hold's FIFOs go by their own protocol
                found.append(relative)
                if len(found) >= FILES_MAX:
                    return sorted(found)
        return sorted(found)

    def release(self, relative: str, count: int) -> None:
        """The harness released the hold in ``relative``: the bytes it wrote, written here."""
        fds = self._holds.get(relative)
        if fds is not None and count > 0:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(fds[1], b"\x01" * min(count, 4096))

    def close(self) -> None:
        for held_fd, release_fd in self._holds.values():
            for fd in (held_fd, release_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._holds = {}
        shutil.rmtree(self.path, ignore_errors=True)


class Relay:
    """The harness's side: a thread that pulls the node's folder into the attempt's own.

    ``call(method, *args)`` calls the agent actor (raising when it does not answer); ``holds``:
    the hold folders of the attempt (relative to ``folder``) whose FIFOs the harness made."""

    def __init__(self, call: Callable[..., Any], folder: Path, holds: tuple[str, ...]) -> None:
        self._call = call
        self.folder = folder
        self.offsets: dict[str, int] = {}
        self.relayed_bytes = 0
        self.errors = 0
        self._holds: dict[str, tuple[int, int]] = {}
        for relative in holds:
            hold = folder / relative
            with contextlib.suppress(OSError):
                held = os.open(hold / HOLD_HELD, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
                release = os.open(hold / HOLD_RELEASE, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
                self._holds[relative] = (held, release)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotchaos-ray-relay", daemon=True)

    def start(self) -> Relay:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(PULL_SECONDS):
            with contextlib.suppress(Exception):  # a node that does not answer now may next time
                self.pull_once()

    def pull_once(self, timeout: float = 10.0) -> None:
        """One round trip: releases sent on, then what grew on the node written here."""
        with self._lock:
            for relative, (_, release_fd) in self._holds.items():
                with contextlib.suppress(BlockingIOError, OSError):
                    count = len(os.read(release_fd, 4096))
                    if count:
                        self._call("relay_release", relative, count, timeout=timeout)
            try:
                answer = self._call("relay_pull", dict(self.offsets), timeout=timeout)
            except Exception:
                self.errors += 1
                raise
            for relative, chunk in sorted(answer.get("files", {}).items()):
                self._append(relative, chunk)
            for relative, said in answer.get("held", {}).items():
                fds = self._holds.get(relative)
                if fds is not None:
                    with contextlib.suppress(BlockingIOError, OSError):
                        os.write(fds[0], said)

    def _append(self, relative: str, chunk: bytes) -> None:
        """``chunk`` at the end of the harness's copy of ``relative``: made here, beneath the
        attempt's folder, never through a link."""
        from ...safety.safefs import open_beneath

        path = Path(relative)
        if path.is_absolute() or ".." in path.parts or not isinstance(chunk, bytes):
            return  # the node's answer is the job's machine's word: never a path outside the folder
        with contextlib.suppress(OSError):
            (self.folder / path.parent).mkdir(parents=True, exist_ok=True)
        try:
            fd = open_beneath(self.folder, path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except Exception:
            return
        try:
            os.write(fd, chunk)
        finally:
            os.close(fd)
        self.offsets[relative] = self.offsets.get(relative, 0) + len(chunk)
        self.relayed_bytes += len(chunk)

    def stop(self) -> None:
        """Stop pulling after one last pull (what the node wrote to the end, if it still answers)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        with contextlib.suppress(Exception):
            self.pull_once(timeout=5)
        for fds in self._holds.values():
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._holds = {}

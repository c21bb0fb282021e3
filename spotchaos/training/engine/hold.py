"""The harness's end of the hold: the job waits after the planned step until its fault is delivered.

Why: a fault sent when the harness *sees* a step lands wherever a fast job has got to by then
(a kill planned after step 9 of a job with 1 ms steps landed after step 19, its last, and the
plan passed without testing anything). The probe, and for an unmodified Python script the
in-process hook of ``spotchaos/faults/crashpoint``, hold the job right after it reports the planned
step; the harness delivers the fault, then releases it (see :class:`spotchaos.probe.StepHold`).

Two FIFOs (0600) in a folder (0700) the harness made itself, the job's user's only: the job
announces ``STEP PID`` on ``held`` and waits on ``release``. The harness keeps both open from before
the job starts until the attempt ends, so the job never blocks on an open, and nothing the job
writes there is trusted beyond a bounded, parsed line: a job that lies about its hold only mistimes
its own test.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path

from ...probe import (
    ENV_HOLD_AT,
    ENV_HOLD_DIR,
    ENV_HOLD_PHASE,
    ENV_HOLD_RANK,
    ENV_HOLD_SECONDS,
    ENV_SNAPSHOT_HOLD_DIR,
    HOLD_HELD,
    HOLD_RELEASE,
)

ANNOUNCE_BYTES = 256  # what one poll reads of the job's announcements, at most
LATER_HOLDS = 64  # holds a release lets go at once: the held process's, then any restarted one's
# the in-process hook of an unmodified script: the pattern its step lines match, the printed
# number of the planned step, the stream, and a pattern whose lines are no step (a rollback)
ENV_HOLD_PATTERN = "SPOTCHAOS_HOLD_PATTERN"
ENV_HOLD_PRINTED = "SPOTCHAOS_HOLD_PRINTED"
ENV_HOLD_STREAM = "SPOTCHAOS_HOLD_STREAM"
ENV_HOLD_SKIP = "SPOTCHAOS_HOLD_SKIP"
ENV_HOLD_PHASE_LINE = "SPOTCHAOS_HOLD_PHASE_LINE"  # a fault inside a printed phase: the line that begins it
ENV_HOLD_PROBE = "SPOTCHAOS_HOLD_PROBE"  # the probe's file: the hook waits with the probe's own code
PROBE_FILE = Path(__file__).resolve().parents[2] / "probe.py"  # spotchaos/probe.py


def announced_step(line: bytes) -> int | None:
    """The step of one ``STEP PID`` announcement, or None for anything else the job wrote there."""
    first = line.split(b" ", 1)[0]
    return int(first) if first.isdigit() and len(first) < 12 else None


class Hold:
    """One attempt's hold at step ``at`` (0-based), owned from before the launch to the cleanup."""

    def __init__(
        self,
        folder: Path,
        at: int,
        *,
        rank: int = 0,
        seconds: float = 30.0,
        owner: int | None = None,
        phase: str | None = None,
    ) -> None:
        folder.mkdir(mode=0o700)  # fails if it exists: never a folder the job made
        self.folder = folder
        # a container's job that runs as another uid gets the folder and the FIFOs as its own;
        # nobody else can release a held job, steal its release or fake an announcement
        self.owner = owner if owner is not None and owner != os.getuid() else None
        self.at = at
        self.phase = phase  # held at the start of the first such phase after step ``at``, not at the step
        self.rank = rank
        self.seconds = seconds
        self.held_step: int | None = None  # what the job announced, once it did
        self.held_wall: float | None = None  # when the harness read the announcement
        self.released_wall: float | None = None
        self._fds: list[int] = []
        try:
            if self.owner is not None:
                os.chown(folder, self.owner, -1, follow_symlinks=False)
            self._release = self._fifo(HOLD_RELEASE, os.O_RDWR)  # a writer always there: the job's open never blocks
            self._held = self._fifo(HOLD_HELD, os.O_RDWR)  # a reader always there: the job's open never fails
        except BaseException:
            self.close()
            raise

    def _fifo(self, name: str, flags: int) -> int:
        path = self.folder / name
        os.mkfifo(path, 0o600)
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW)
        self._fds.append(fd)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not the FIFO the harness made")
        os.fchmod(fd, 0o600)  # mkfifo's mode is masked by the umask: set it as meant
        if self.owner is not None:
            os.fchown(fd, self.owner, -1)
        return fd

    def environment(self) -> dict[str, str]:
        """What the probe (and the hook) read to know where and how long to hold."""
        return {
            ENV_HOLD_AT: str(self.at),
            ENV_HOLD_DIR: str(self.folder),
            ENV_HOLD_RANK: str(self.rank),
            ENV_HOLD_SECONDS: f"{self.seconds:g}",
            **({ENV_HOLD_PHASE: self.phase} if self.phase is not None else {}),
        }

    def poll(self) -> int | None:
        """The step the job announced it holds after, once it has (read without blocking)."""
        if self.held_step is None and self._fds:
            with contextlib.suppress(BlockingIOError, OSError):
                said = os.read(self._held, ANNOUNCE_BYTES)
                self.held_step = announced_step(said.split(b"\n", 1)[0])
                if self.held_step is not None:
                    self.held_wall = time.time()
        return self.held_step

    def release(self) -> None:
        """Let the job go on: its fault is delivered. Once, with a byte for every later hold of the
        attempt too: a worker group its launcher restarted after the fault (Ray Train's, whose
        workers cannot tell a restart) reaches the step again and must not wait. Bytes nobody
        reads are harmless."""
        if self.released_wall is None and self._fds:
            self.poll()
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._release, b"\x01" * LATER_HOLDS)
            self.released_wall = time.time()

    def close(self) -> None:
        """Read an announcement still unread first: a job whose fault was delivered (and the hold
        released) just before it announced was held all the same, and the landing is settled
        after the attempt's resources are closed."""
        self.poll()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []


class CheckpointHold(Hold):
    """The reference run's hold at each of its checkpoints (``probe.CheckpointHold``): the job
    announces the step of each checkpoint it reported and waits while the harness copies its
    checkpoint folder, then goes on with one byte; the copy is the folder as that checkpoint left it."""

    def __init__(self, folder: Path, *, seconds: float = 30.0) -> None:
        super().__init__(folder, -1, seconds=seconds)
        self._said = b""

    def environment(self) -> dict[str, str]:
        return {ENV_SNAPSHOT_HOLD_DIR: str(self.folder), ENV_HOLD_SECONDS: f"{self.seconds:g}"}

    def held_at(self, step: int, timeout: float) -> bool:
        """Whether the job announced it holds after its checkpoint of ``step`` (waiting up to
        ``timeout``: it announces just after the event the harness has read)."""
        deadline = time.monotonic() + timeout
        while self._fds:
            with contextlib.suppress(BlockingIOError, OSError):
                self._said = (self._said + os.read(self._held, ANNOUNCE_BYTES))[-ANNOUNCE_BYTES:]
            *lines, self._said = self._said.split(b"\n")
            if any(announced_step(line) == step for line in lines):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        return False

    def release(self) -> None:
        """Let the job go on after one checkpoint (one byte: each checkpoint waits for its own)."""
        if self._fds:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._release, b"\x01")

"""Warm starts: a session's forking interpreters, one per job's interpreter and environment.

A cold start of a Python job pays its imports again (``import torch``: 2-3 CPU-seconds), and a
gate starts a job dozens of times. :class:`WarmStarts` keeps, per job, one interpreter that has
paid them (``zygote.py``, run by the job's own Python, in the job's environment) and asks it to fork
each attempt. What can differ from attempt to attempt is only what Python and its libraries read
after start-up; an attempt whose command or environment differs where start-up reads it (an
interpreter flag, ``-m``, ``LD_PRELOAD``, ``OMP_NUM_THREADS``) starts cold, and says why. So do
jobs whose imports leave threads running (a fork would not be safe), and any job when the
interpreter cannot be reached: warm is an optimisation, never a condition.

What a fork would share that fresh processes do not: the string-hash secret, fixed when an
interpreter starts and cached in every ``str`` it made (so it cannot be changed in a child). A job
whose state depends on set or dict order of strings (parameter groups built from a set of names)
resumes wrong only when the resuming process hashes differently from the one that saved; children
of one interpreter never do, so such a job would pass warm and fail cold. Each job therefore gets
two interpreters started with different ``PYTHONHASHSEED`` values (``HASH_SLOTS``), and an attempt
forks from the one its predecessor in the run did not (by ``SPOTCHAOS_ATTEMPT``): a resume always
hashes differently from the attempt that wrote its checkpoint, as it would cold. A job whose own
environment fixes ``PYTHONHASHSEED`` gets one: cold starts would share it too.

The interpreters are this session's: each is written down with the attempts (``LiveJobs``) so a
later pytest ends it if this one dies, and :meth:`WarmStarts.close` ends them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import select
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..leftovers import MARKER_VARIABLE, LiveJobs
from ..processes import (
    Delivery,
    carries,
    group_members,
    is_running,
    kill_group_until_gone,
    own_leaders,
    signal_tree,
    start_time,
)

ZYGOTE_FILE = Path(__file__).with_name("zygote.py")
READY_TIMEOUT_SECONDS = 300.0  # importing torch on a loaded 2-core machine takes tens of seconds
# variables Python or a preloaded library reads while starting: an attempt that changes one starts cold
START_READ = re.compile(
    r"^(PYTHON|LD_|OMP_|MKL_|KMP_|OPENBLAS_|GOMP_|MALLOC_|GLIBC_|TORCH|LC_|LANG$"
    r"|HF_|TRANSFORMERS_|TOKENIZERS_|PL_|LIGHTNING_|ACCELERATE_)"  # the frameworks' own, read on import
)
# pytest's own record of the test and phase running now, in its environment and so in every job's:
# no interpreter reads it while it starts, and a key with it made each test of a session start its
# own warm interpreter (65 in the main job, 2.4-4.3 CPU-seconds each, where 20 served)
PER_TEST = frozenset({"PYTEST_CURRENT_TEST"})
ATTEMPT_VARIABLE = "SPOTCHAOS_ATTEMPT"  # the probe's ENV_ATTEMPT: which attempt of its run a process is
HASH_SLOTS = 2  # interpreters per job, each with its own string-hash secret: consecutive attempts alternate
SAFE_FLAGS = {"-u", "-B", "-O", "-OO", "-q", "-b", "-bb"}
PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?$")
MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class ColdStart(Exception):
    """Why an attempt starts cold; its message goes on the report."""


MARKER_WAIT_SECONDS = 10.0


def _until_it_carries_its_marker(pid: int, marker: str) -> None:
    """A forked attempt writes its run's marker over the warm interpreter's in its own environment
    a moment after the fork (zygote.py). Until then a reaper or a sweep would take it for the
    interpreter's, or for no run's: the caller registers it as its run's only once it is."""
    deadline = time.monotonic() + MARKER_WAIT_SECONDS
    while not carries(pid, marker) and start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.002)


@dataclass(frozen=True)
class _Launch:
    """What a warm start of one attempt needs: the zygote it comes from and what the child sets."""

    key: tuple
    interpreter: tuple[str, ...]
    request: dict[str, Any]


def plan_launch(
    argv: tuple[str, ...], env: Mapping[str, str], start_env: Mapping[str, str], cwd: Path, preload: tuple[str, ...]
) -> _Launch:
    """The zygote and request for ``argv``, or :class:`ColdStart` naming why it cannot be warm."""
    if not argv or not PYTHON_NAME.match(os.path.basename(argv[0])):
        raise ColdStart(f"not a Python command ({os.path.basename(argv[0]) if argv else 'empty'})")
    index, module = 1, None
    while index < len(argv) and argv[index].startswith("-"):
        flag = argv[index]
        if flag in SAFE_FLAGS or (flag.startswith(("-W", "-X")) and len(flag) > 2):
            index += 1
        elif flag in ("-W", "-X") and index + 1 < len(argv):
            index += 2
        elif flag == "-m" and index + 1 < len(argv) and MODULE_NAME.match(argv[index + 1]):
            module = argv[index + 1]  # what follows is the module's own argv, as Python reads it
            break
        else:
            raise ColdStart(f"the interpreter flag {flag} (only a script or a module run by Python starts warm)")
    if index >= len(argv):
        raise ColdStart("no script to run")
    script = argv[index]
    if module is None and not (cwd / script).is_file():
        raise ColdStart(f"{script} is not a file")
    changed = sorted(k for k in {*env, *start_env} if env.get(k) != start_env.get(k))
    early = [k for k in changed if START_READ.match(k) and k != "PYTHONPATH"]
    if early:
        raise ColdStart(f"the attempt sets {', '.join(early)}, read when Python starts")
    prepend, hooks = _path_prepend(env.get("PYTHONPATH", ""), start_env.get("PYTHONPATH", ""))
    if MARKER_VARIABLE not in env:
        raise ColdStart("the attempt has no run marker")
    # not the folder nor the script: the child takes those, so a job and the helpers that read its
    # checkpoints in its confinement share one interpreter
    key = (
        tuple(argv[:index]),
        tuple(sorted((k, v) for k, v in start_env.items() if k not in PER_TEST)),
        preload,
        hash_slot(env, start_env),
    )
    request = {
        "argv": list(argv[index + 2 :]) if module else list(argv[index:]),
        "module": module,
        "cwd": str(cwd),
        "env": dict(env),
        "path_prepend": prepend,
        "site_hooks": hooks,
    }
    return _Launch(key, tuple(argv[:index]), request)


def hash_slot(env: Mapping[str, str], start_env: Mapping[str, str]) -> int | None:
    """Which of the job's seeded interpreters an attempt forks from (None: the job fixes its own
    ``PYTHONHASHSEED``, and every fresh process of it would hash alike)."""
    if start_env.get("PYTHONHASHSEED", "random") != "random":
        return None
    try:
        return int(env.get(ATTEMPT_VARIABLE, "0")) % HASH_SLOTS
    except ValueError:
        return 0


def _path_prepend(attempt: str, start: str) -> tuple[list[str], list[str]]:
    """Folders the attempt puts before the job's own PYTHONPATH, and the ``sitecustomize`` files
    in them that a cold start would import first (the crash-point hook)."""
    ours = [p for p in attempt.split(os.pathsep) if p]
    theirs = [p for p in start.split(os.pathsep) if p]
    if ours == theirs:
        return [], []
    if theirs and ours[-len(theirs) :] != theirs:
        raise ColdStart("the attempt changes PYTHONPATH, read when Python starts")
    extra = ours[: len(ours) - len(theirs)]
    hooks = [str(Path(p) / "sitecustomize.py") for p in extra if (Path(p) / "sitecustomize.py").is_file()]
    return extra, hooks[:1]


class _Zygote:
    """One forking interpreter and the socket it takes requests on."""

    def __init__(self, launch: _Launch, start_env: Mapping[str, str], preload: tuple[str, ...], live: LiveJobs):
        self.id = uuid.uuid4().hex[:12]  # as long as a run id: each child writes its own in its place
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in start_env.items() if k != MARKER_VARIABLE}
        if launch.key[-1] is not None:  # its own string-hash secret; children take the attempt's environment
            env["PYTHONHASHSEED"] = str(1 + secrets.randbelow(4294967295))
        self.hash_seed = env.get("PYTHONHASHSEED")
        env[MARKER_VARIABLE] = self.id  # last: see zygote.py
        try:
            self.process = subprocess.Popen(
                [*launch.interpreter, str(ZYGOTE_FILE), str(theirs.fileno()), ",".join(preload)],
                cwd=launch.request["cwd"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise ColdStart(f"the warm interpreter could not start: {exc.strerror or exc}") from None
        finally:
            theirs.close()
        own_leaders.add(self.process.pid)  # the harness's own child, never an orphan to end
        self.socket = ours
        self.live = live
        self.entry = live.add(self.id, {"pid": self.process.pid, "start": start_time(self.process.pid)})
        self.lock = threading.Lock()
        self._hello()

    def _hello(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.socket], [], [], 0.5)
            if ready:
                data = self.socket.recv(65536)
                answer = json.loads(data) if data else {"refused": "it exited while importing"}
                if "ready" not in answer:
                    self.close()
                    raise ColdStart(str(answer.get("refused") or "it refused"))
                return
            if self.process.poll() is not None:
                break
        self.close()
        raise ColdStart("the warm interpreter did not get ready")

    def fork(self, request: dict[str, Any], stdout: int, stderr: int) -> tuple[int, socket.socket]:
        """Ask for one child; its pid and the socket its exit status comes on."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self.lock:
                socket.send_fds(self.socket, [json.dumps(request).encode()], [stdout, stderr, theirs.fileno()])
        except OSError as exc:
            ours.close()
            raise ColdStart(f"the warm interpreter is gone ({exc.strerror or exc})") from None
        finally:
            theirs.close()
        ready, _, _ = select.select([ours], [], [], 30.0)
        data = ours.recv(65536) if ready else b""
        pid = json.loads(data).get("pid") if data else None
        if not isinstance(pid, int):
            ours.close()
            raise ColdStart("the warm interpreter did not fork")
        return pid, ours

    def stop_listening(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.close()  # its end of file: it exits once its attempts have

    def close(self) -> None:
        self.stop_listening()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        own_leaders.discard(self.process.pid)
        self.live.discard(self.entry)


class WarmHandle:
    """One attempt forked from a warm interpreter: the same contract as a process group started
    cold (``backends.subprocess.SubprocessHandle``), its exit status told by the interpreter."""

    # the answers of backends.base.Handle a plain process group gives (this module sits below
    # backends/ and cannot subclass the protocol): spelled out, the same values
    start_kind = "warm"
    placement: dict | None = None
    delivery_note = ""
    notice_lag_seconds = 0.0
    notice_window_seconds: float | None = None
    launcher = "its launcher"
    reclaim = None

    def note_rank(self, rank: int, pid: object) -> None:
        """One process, no ranks to find."""

    def note_event(self, rank: int, step: int | None) -> None:
        """One process, no ranks to time."""

    def end_processes(self) -> None:
        self.kill()

    def __init__(self, pid: int, status: socket.socket) -> None:
        self._pid = pid
        self._status = status
        self._code: int | None = None
        self._orphaned = False
        self._cleaned = False
        self.identity = {"pid": pid, "start": start_time(pid)}
        self.marker: str | None = None  # NAME=value every process of the attempt inherits
        self.delivery: Delivery | None = None  # what the last signal to the whole job reached

    @property
    def pid(self) -> int:
        return self._pid

    def notify(self, signum: int, *, whole_group: bool) -> None:
        if whole_group:
            self.delivery = signal_tree(self._pid, signum, self.marker)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signum)

    def kill(self) -> None:
        self.delivery = signal_tree(self._pid, signal.SIGKILL, self.marker)

    def end_group(self) -> None:
        """SIGKILL to the process group alone (the cleanup's: see SubprocessHandle.end_group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._pid, signal.SIGKILL)

    def poll(self) -> int | None:
        return self.wait(0)

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + max(timeout, 0)
        while self._code is None:
            left = max(0.0, min(deadline - time.monotonic(), 0.5))
            if self._orphaned:  # its interpreter went first: the child's end is seen in /proc
                if not is_running(self._pid, self.identity["start"]):
                    self._code = -signal.SIGKILL  # its status went with the interpreter
                    break
                time.sleep(min(left, 0.05))
            elif select.select([self._status], [], [], left)[0]:
                data = self._status.recv(65536)
                if data:
                    self._code = int(json.loads(data)["exit"])
                else:
                    self._orphaned = True
            if self._code is None and time.monotonic() >= deadline:
                return None
        return self._code

    def survivors(self) -> list[int]:
        return group_members(self._pid)

    def cleanup(self) -> None:
        if self._cleaned:
            return
        kill_group_until_gone(self)
        self._status.close()
        self._cleaned = True


class WarmStarts:
    """A session's warm interpreters (at most ``limit``, the least recently used ended first: two
    jobs' worth, each job's ``HASH_SLOTS``)."""

    def __init__(self, limit: int = 2 * HASH_SLOTS, live: LiveJobs | None = None) -> None:
        self.limit = limit
        self.live = live or LiveJobs()
        self._zygotes: OrderedDict[tuple, _Zygote] = OrderedDict()
        self._refused: dict[tuple, str] = {}
        self._retired: list[_Zygote] = []
        self._lock = threading.Lock()
        self._closed = False

    def start(
        self,
        argv: tuple[str, ...],
        env: Mapping[str, str],
        start_env: Mapping[str, str],
        cwd: Path,
        preload: tuple[str, ...],
        output: tuple[int, int],
    ) -> WarmHandle:
        """Fork one attempt writing to ``output`` (its stdout's and stderr's descriptors);
        :class:`ColdStart` says why it must start cold instead."""
        launch = plan_launch(argv, env, start_env, cwd, preload)
        zygote = self._zygote(launch, start_env, preload)
        try:
            pid, status = zygote.fork(launch.request, *output)
        except ColdStart:
            with self._lock:
                if self._zygotes.get(launch.key) is zygote:
                    del self._zygotes[launch.key]
            zygote.close()
            raise
        _until_it_carries_its_marker(pid, f"{MARKER_VARIABLE}={env[MARKER_VARIABLE]}")
        return WarmHandle(pid, status)

    def _zygote(self, launch: _Launch, start_env: Mapping[str, str], preload: tuple[str, ...]) -> _Zygote:
        with self._lock:
            if self._closed:
                raise ColdStart("the session is closing")
            if launch.key in self._refused:
                raise ColdStart(self._refused[launch.key])
            zygote = self._zygotes.get(launch.key)
            if zygote is not None and zygote.process.poll() is None:
                self._zygotes.move_to_end(launch.key)
                return zygote
            try:
                zygote = _Zygote(launch, start_env, preload, self.live)
            except ColdStart as exc:
                self._refused[launch.key] = str(exc)
                raise
            self._zygotes[launch.key] = zygote
            while len(self._zygotes) > self.limit:  # it exits once its last attempt has ended
                retired = self._zygotes.popitem(last=False)[1]
                retired.stop_listening()
                self._retired.append(retired)
            return zygote

    def __enter__(self) -> WarmStarts:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            zygotes, self._zygotes = [*self._retired, *self._zygotes.values()], OrderedDict()
            self._retired = []
        for zygote in zygotes:
            zygote.close()

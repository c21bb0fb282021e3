"""Crash points and the step hold for unmodified Python trainers.

Crash points: SIGKILL at the Nth file-system event.

The harness puts this directory first on the trainer's PYTHONPATH; Python imports
``sitecustomize`` at start-up, which installs an audit hook (PEP 578). The hook sees every
``open``, ``os.rename``, ``os.replace``, ``os.remove``, ``os.rmdir``, ``os.mkdir`` and
``shutil.rmtree`` under the run's checkpoint directory (and each file ``torch.save`` opens in C++)
*before* it happens, numbers them, logs
them, and kills the whole process at the chosen one: the crash lands exactly between two steps
of a checkpoint write, rotation or load. Standard library only, like the probe.

Environment: SPOTCHAOS_CRASH_ROOT (the checkpoint directory), SPOTCHAOS_CRASH_LOG (JSON lines
of the events seen), SPOTCHAOS_CRASH_AT (1-based index of the event to die before; 0 logs only),
SPOTCHAOS_CRASH_AFTER_STEP (then SPOTCHAOS_CRASH_AT counts the events since the probe first reported
that step, which the probe announces with the audit event ``spotchaos.step``: the same moment of
a save whether the attempt trained from step 0 or resumed from a copy of an earlier checkpoint.
The count runs on across later steps' reports: a save written in a thread ends one step or
another by its timing, and its events keep their numbers either way. Each logged event carries
the last step announced, its number since, and, armed, its number since that step: ``counted``),
SPOTCHAOS_OUTSIDE_LOG (writes outside the checkpoint directory: each path the job writes,
renames, makes or removes below SPOTCHAOS_OUTSIDE_WITHIN's folders (its run folder, its working
folder) but not there nor in its attempt's own folder, once: what a copy of the checkpoint
directory alone would not hold), SPOTCHAOS_READS_LOG (each file the job reads
outside the checkpoint directory, its Python and installed packages, and spotchaos, once: what
a reference kept across sessions depends on beyond what its table names),
SPOTCHAOS_CRASH_RANK (a torchrun job: only that rank, in the first run of its worker group, is
armed and logs; the agent and the other ranks are left alone).

The step hold: a script that prints its steps (the log adapter) is held right after it printed
the planned step's line, before it runs the next, until the harness has delivered its fault, as
the probe holds a probe job (see spotchaos/training/engine/hold.py). The printed stream is wrapped; each whole
line is matched against the job's own step pattern until the planned one is seen, then the
wrapper steps aside. The wait itself is the probe's (loaded from SPOTCHAOS_HOLD_PROBE, a file),
so both kinds of job hold the same way (a fault inside a printed phase: at the line that begins it,
SPOTCHAOS_HOLD_PHASE_LINE). Environment: SPOTCHAOS_HOLD_PATTERN, _PRINTED, _STREAM,
_SKIP, _PROBE, and the probe's SPOTCHAOS_HOLD_AT, _DIR, _SECONDS.

A sitecustomize the environment had before this one is run after it: putting this folder first
on PYTHONPATH must not take the user's away.
"""

import json
import os
import signal
import sys
import threading
import time

_ROOT = os.environ.get("SPOTCHAOS_CRASH_ROOT")
_LOG = os.environ.get("SPOTCHAOS_CRASH_LOG")
_AT = int(os.environ.get("SPOTCHAOS_CRASH_AT", "0") or 0)
_AFTER = os.environ.get("SPOTCHAOS_CRASH_AFTER_STEP")
_AFTER = int(_AFTER) if _AFTER else None
_STEP_EVENT = "spotchaos.step"  # the probe's (spotchaos/probe.py STEP_AUDIT_EVENT)
_step = None  # the last step the probe announced, and the events counted since
_since = 0
_counted = None  # the events since the probe first announced step _AFTER (what crash@S+N counts)
_EVENTS = {"open", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree"}
_OUTSIDE_LOG = os.environ.get("SPOTCHAOS_OUTSIDE_LOG")
# what every run sees alike, or no later attempt sees: the attempt's own folder (its logs, events)
# and TMPDIR (both new for every attempt), the kernel's files, and the user's library caches
# (matplotlib's fonts, torch's compiled kernels: shared by every run, a copy's resume sees them too)
_HOME = os.path.expanduser("~")
_OUTSIDE_SKIP = tuple(
    os.path.abspath(p) + os.sep
    for p in [
        *([os.path.dirname(os.path.abspath(_OUTSIDE_LOG))] if _OUTSIDE_LOG else []),
        *([os.environ["TMPDIR"]] if os.environ.get("TMPDIR") else []),
        "/dev",
        "/proc",
        "/sys",
        os.environ.get("XDG_CACHE_HOME") or os.path.join(_HOME, ".cache"),
        os.environ.get("XDG_CONFIG_HOME") or os.path.join(_HOME, ".config"),
    ]
)
_OUTSIDE_WITHIN = tuple(
    os.path.abspath(p) + os.sep for p in os.environ.get("SPOTCHAOS_OUTSIDE_WITHIN", "").split(os.pathsep) if p
)
_DIR_FD_ARG = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 2, "os.rename": 2, "os.replace": 2}
_READS_LOG = os.environ.get("SPOTCHAOS_READS_LOG")
# what the reference cache fingerprints otherwise: the interpreter, the installed packages, spotchaos
_READS_SKIP = tuple(
    os.path.abspath(p) + os.sep
    for p in {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        *(p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)),
    }
)
_READS_MAX = 4096
_reads_seen = set()
_PYCACHE = os.sep + "__pycache__" + os.sep  # Python's own byte code, written as it imports
_OUTSIDE_MAX = 64  # paths logged at most: the first is what a refusal names
_outside_seen = set()
_count = 0
_lock = threading.Lock()  # a trainer may unlink or fsync from helper threads: one numbering for all
_local = threading.local()  # per thread: our own log write must not count


def _after_fork_in_child() -> None:
    """A fork (DataLoader workers) while a helper thread held the lock must not leave the child's held."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _die() -> None:
    """Die as a SIGKILL would: at once, no handler, no buffer flushed. A container's PID 1 cannot
    SIGKILL itself (the kernel ignores a signal to a namespace's init from inside it, so the
    crash never happened and the run went on), so it ends with ``_exit`` and the status a SIGKILL
    gives (137); the kernel then kills every other process of the container with it."""
    if os.getpid() == 1:
        os._exit(128 + signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _under_root(path) -> bool:
    try:
        path = os.fsdecode(path)
    except TypeError:
        return False
    return os.path.abspath(path).startswith(_ROOT + os.sep) or os.path.abspath(path) == _ROOT


def _describe(event, args):
    if event == "open":
        mode = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        writing = any(c in mode for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR))
        return ("open-write" if writing else "open-read"), os.fsdecode(args[0])
    return event, " -> ".join(os.fsdecode(a) for a in args[:2] if isinstance(a, str | bytes | os.PathLike))


def _hook(event, args):
    global _count, _step, _since, _counted
    if event == _STEP_EVENT:
        with _lock:
            _step, _since = (args[0] if args else None), 0
            if _counted is None and _AFTER is not None and _step == _AFTER:
                _counted = 0
        return
    if not _torch_seen and "torch.serialization" in sys.modules:
        _announce_torch_saves()
    if getattr(_local, "busy", False) or event not in _EVENTS or not args:
        return
    if not _under_root(args[0]):
        if _OUTSIDE_LOG:
            _log_outside(event, args)
        if _READS_LOG and event == "open":
            _log_read(args)
        return
    _local.busy = True
    try:
        with _lock:
            _count += 1
            _since += 1
            if _counted is not None:
                _counted += 1
            kind, target = _describe(event, args)
            if _LOG:
                record = {
                    "index": _count,
                    "event": kind,
                    "path": target,
                    "t": time.time(),
                    "pid": os.getpid(),
                    "step": _step,
                    "since": _since,
                }
                if _counted is not None:
                    record["counted"] = _counted
                if os.environ.get("RANK") is not None:  # a torchrun rank: each numbers its own events
                    record["rank"] = int(os.environ["RANK"])
                _append(_LOG, record)
            if (_count if _AFTER is None else _counted) == _AT:
                _die()
    finally:
        _local.busy = False


def _append(log, record):
    """One JSON line at the end of ``log`` (one write: lines of several processes never interleave)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _log_outside(event, args):
    """One line per path written outside the checkpoint directory (reads are not logged); never
    raises into the job."""
    if not isinstance(args[0], str | bytes | os.PathLike) or len(_outside_seen) >= _OUTSIDE_MAX:
        return
    try:
        kind = _describe(event, args)[0]
        path = os.fsdecode(args[0])
        at = _DIR_FD_ARG.get(event)
        dir_fd = args[at] if at is not None and len(args) > at else None
        if not os.path.isabs(path) and isinstance(dir_fd, int) and dir_fd >= 0:  # relative to a folder's fd
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        path = os.path.abspath(path)
    except (TypeError, ValueError, OSError):
        return
    if kind == "open-read" or path in _outside_seen or path.startswith(_OUTSIDE_SKIP) or _PYCACHE in path:
        return
    if not path.startswith(_OUTSIDE_WITHIN):  # shared by every run alike: a copy's resume sees it too
        return
    if _under_root(path):  # a name relative to a folder's descriptor inside the checkpoint directory
        return
    _local.busy = True
    try:
        with _lock:
            _outside_seen.add(path)
            _append(_OUTSIDE_LOG, {"event": kind, "path": path, "pid": os.getpid(), "step": _step})
    except OSError:
        pass
    finally:
        _local.busy = False


def _log_read(args):
    """One line per regular file the job opened for reading, outside what is fingerprinted anyway."""
    if not isinstance(args[0], str | bytes | os.PathLike) or len(_reads_seen) >= _READS_MAX:
        return
    try:
        if _describe("open", args)[0] != "open-read":
            return
        path = os.path.abspath(os.fsdecode(args[0]))
    except (TypeError, ValueError):
        return
    if _PYCACHE in path and path.endswith(".pyc"):  # an import that found its byte code: the module's source
        folder, name = os.path.split(os.path.dirname(path))[0], os.path.basename(path).split(".")[0]
        path = os.path.join(folder, name + ".py")
    if path in _reads_seen or path.startswith(_OUTSIDE_SKIP) or path.startswith(_READS_SKIP) or _PYCACHE in path:
        return
    _local.busy = True
    try:
        with _lock:
            _reads_seen.add(path)
            _append(_READS_LOG, {"path": path})
    except OSError:
        pass
    finally:
        _local.busy = False


_torch_seen = False


def _announce_torch_saves() -> None:
    """``torch.save(obj, "path")`` opens its file in C++, where no audit event is raised: a
    DeepSpeed rank's ZeRO files, a Trainer's optimizer.pt, a script's ``torch.save(state, tmp)``
    would be no crash point. Once torch is imported (the hook runs on every audit event, so before
    any save), its path writer announces each file it opens as an ``open`` for writing."""
    global _torch_seen
    writer = getattr(sys.modules["torch.serialization"], "_open_zipfile_writer_file", None)
    if writer is None:  # torch.serialization is still being imported: at a later event
        return
    _torch_seen = True
    opened = writer.__init__

    def announced(self, name, *args, **kwargs):
        if isinstance(name, str) and name.isascii():  # a non-ASCII name is opened by Python's open: seen
            _hook("open", (name, "wb"))
        opened(self, name, *args, **kwargs)

    writer.__init__ = announced


_RANK = os.environ.get("SPOTCHAOS_CRASH_RANK")
_ARMED = _RANK is None or (os.environ.get("RANK") == _RANK and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0")

if _ROOT and _ARMED:
    _ROOT = os.path.abspath(_ROOT)
    sys.addaudithook(_hook)


class _HeldStream:
    """The script's stdout or stderr, watched line by line for the planned step's line."""

    def __init__(self, stream, pattern, skip, printed, hold, phase_line=None):
        self._stream = stream
        self._pattern = pattern
        self._skip = skip
        self._printed = printed
        self._hold = hold
        self._partial = ""
        self._phase_line = phase_line  # a fault inside a printed phase: held at the line that begins it
        self._reached = False  # the planned step's line was printed: the phase's next line holds
        # rank 0's line times the fault; another rank's is read after the attempt, so it announces
        # its hold only once its line is out (a kill in between would cut the line from its log)
        self._announce_first = (os.environ.get("RANK") or "0") == "0"

    def write(self, text):
        hold = self._hold_in(text) if self._hold is not None and isinstance(text, str) else None
        if hold is not None and self._announce_first:
            # before the line: the harness delivers on reading it, and finds the hold said already
            if self._phase_line is None:
                hold.announce(hold.at)
            else:
                hold.announce_in_phase(hold.phase, hold.at)
        written = self._stream.write(text)
        if hold is not None:
            self._stream.flush()  # the harness must read the line it is held after
            if self._phase_line is None:
                hold.wait(hold.at)  # the step is the planned one or past it: it waits
            else:
                hold.wait_in_phase(hold.phase, hold.at)
        return written

    def _hold_in(self, text):
        """The hold, taken once, when ``text`` ends the line it holds after; None otherwise."""
        if "\n" not in text:
            self._partial = (self._partial + text)[-4096:]
            return None
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()[-4096:]
        for line in lines:
            if self._holds_after(line):
                hold, self._hold = self._hold, None
                return hold
        return None

    def _holds_after(self, line):
        if self._phase_line is None:
            return self._is_planned(line)
        if self._reached and self._phase_line.search(line):
            return True
        self._reached = self._reached or self._is_planned(line)
        return False

    def _is_planned(self, line):
        if self._skip is not None and self._skip.search(line):
            return False
        found = self._pattern.search(line)
        try:
            return found is not None and int(found.group("step")) >= self._printed
        except (IndexError, TypeError, ValueError):
            return False

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _install_hold():
    import importlib.util

    try:  # linear time where the job's Python has RE2 (the harness's own matching always does)
        import re2 as re
    except ImportError:
        import re

    spec = importlib.util.spec_from_file_location("_spotchaos_hold_probe", os.environ["SPOTCHAOS_HOLD_PROBE"])
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    if os.environ.get("SPOTCHAOS_NODE") and os.environ.get("RANK") is None:
        return  # torchrun's agent: it tees its ranks' lines, each rank holds on its own stream
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    hold = probe.StepHold.from_env(int(os.environ.get("RANK") or 0), int(restart) if restart else None)
    if hold is None:
        return
    skip = os.environ.get("SPOTCHAOS_HOLD_SKIP")
    phase_line = os.environ.get("SPOTCHAOS_HOLD_PHASE_LINE")
    name = "stderr" if os.environ.get("SPOTCHAOS_HOLD_STREAM") == "stderr" else "stdout"
    stream = _HeldStream(
        getattr(sys, name),
        re.compile(os.environ["SPOTCHAOS_HOLD_PATTERN"]),
        re.compile(skip) if skip else None,
        int(os.environ["SPOTCHAOS_HOLD_PRINTED"]),
        hold,
        re.compile(phase_line) if phase_line and hold.phase else None,
    )
    setattr(sys, name, stream)


def _run_the_next_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("SPOTCHAOS_HOLD_PATTERN") and os.environ.get("SPOTCHAOS_HOLD_PROBE"):
    import contextlib

    with contextlib.suppress(Exception):  # a hold that cannot be set up leaves the fault reactive
        _install_hold()
_run_the_next_sitecustomize()

"""torchrun, with each rank forked from its agent instead of started as a fresh interpreter.

Why: a rank started cold pays ``import torch`` (2-3 CPU-seconds) and the job's framework again; a
2-rank job pays it twice per attempt, on top of its agent, and a gate starts such attempts dozens
of times. torchrun has this mode itself (``--run-path --start-method=fork``: its agent forks each
worker and runs the script with runpy), and an agent forked from the job's warm interpreter has
torch and the job's preloads imported already. This file runs torchrun's own ``main`` in that mode
with the corrections that make a forked rank behave as the cold one it replaces (``python -u
script.py``, which torchrun starts in a session of its own):

- the rank runs in its own session, with default signal handlers (the agent's would raise
  torchrun's ``SignalException`` in the job), unbuffered standard streams, the script's folder
  first on ``sys.path``, its own ``atexit`` functions only, freshly seeded ``random``, an uncaught
  exception shown through ``sys.excepthook`` with exit status 1, and the crash-point hook
  (``--site-hook``) imported again in the rank's own environment, where it arms itself by RANK;
- it exits with its own status at once: torchrun's function workers otherwise wait for every rank
  before exiting;
- the agent counts a worker that exited 0 as done: torchrun waits for a return value that a script
  ending in ``sys.exit(0)`` or ``os._exit(0)`` never sends, and would wait forever.

Where torchrun's internals are not what this file expects (another torch), torchrun runs as usual,
its ranks cold, and one line on stderr says so (``COLD``); the harness reads it for the report.

Usage: ``python torchrun_ranks.py [--site-hook=FILE] <torchrun's arguments> script.py <its
arguments>``. Standard library and torch only, like the zygote: it imports nothing of spotchaos.
"""

import atexit
import contextlib
import io
import os
import runpy
import signal
import sys
import threading
import warnings

COLD = "spotchaos: torchrun starts its ranks cold: "
HOOK_OPTION = "--site-hook="
_site_hook = ""


def _unbuffered(fd: int, stream):
    """What ``python -u`` gives a standard stream: every write reaches the descriptor at once."""
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding=stream.encoding, errors=stream.errors, write_through=True)


def _become_rank(script: str, args: tuple) -> None:
    os.setsid()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout, sys.stderr = _unbuffered(1, sys.stdout), _unbuffered(2, sys.stderr)
    atexit._clear()  # the agent's: a fresh interpreter has none
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    if "random" in sys.modules:  # a fresh interpreter seeds it from the OS: each rank its own
        sys.modules["random"].seed()
    if _site_hook:  # what a cold rank imports first, run in this rank's environment (RANK set)
        module = type(sys)("sitecustomize")
        sys.modules["sitecustomize"] = module
        vars(module).update(runpy.run_path(_site_hook, run_name="sitecustomize"))


def _status(code: object) -> int:
    """The exit status a fresh interpreter gives ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _show_uncaught(script: str) -> None:
    """The traceback a cold rank prints, from the script's own frame (not this file's or runpy's),
    through ``sys.excepthook``: torch.distributed's prefixes each line with ``[rankN]:``."""
    kind, value, trace = sys.exc_info()
    frame = trace
    while frame is not None and frame.tb_frame.f_code.co_filename != script:
        frame = frame.tb_next
    if value is not None and frame is not None:
        value = value.with_traceback(frame)  # the hook prints the exception's own traceback
    sys.excepthook(kind, value, frame or trace)


def run_rank(script: str, *args: str) -> None:
    """One rank, as ``python -u script args`` would run it; never returns."""
    code = 0
    try:
        _become_rank(script, args)
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _status(exc.code)
    except KeyboardInterrupt:
        _show_uncaught(script)
        code = -signal.SIGINT
    except BaseException:
        _show_uncaught(script)
        code = 1
    threading._shutdown()  # as an interpreter ends: its threads first, then the atexit functions
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if code < 0:  # ended by a signal, as a cold interpreter ends on an uncaught Ctrl-C
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _unsupported(run_module, api) -> str:
    """Why this torch cannot fork ranks as above; '' when it can."""
    if not hasattr(run_module, "run_script_path"):
        return "this torch's torchrun has no --run-path"
    context = getattr(api, "MultiprocessContext", None)
    if context is None or not hasattr(context, "_poll"):
        return "this torch's torchrun has no MultiprocessContext._poll"
    return ""


def _count_exit_zero_as_done(api) -> None:
    original = api.MultiprocessContext._poll

    def _poll(self):
        processes = getattr(self._pc, "processes", None) or []
        for local_rank, process in enumerate(processes):
            if local_rank not in self._return_values and process.exitcode == 0:
                self._return_values[local_rank] = None
        return original(self)

    api.MultiprocessContext._poll = _poll


def main() -> None:
    global _site_hook
    argv = sys.argv[1:]
    if argv and argv[0].startswith(HOOK_OPTION):
        _site_hook = argv.pop(0)[len(HOOK_OPTION) :]
    from torch.distributed import run as run_module
    from torch.distributed.elastic.multiprocessing import api

    reason = _unsupported(run_module, api)
    if reason:
        print(COLD + reason, file=sys.stderr, flush=True)
        run_module.main(argv)
        return
    # Python 3.12 warns on any fork of a process with threads; torchrun's agent always has some
    warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
    run_module.run_script_path = run_rank  # what --run-path runs in each forked worker
    _count_exit_zero_as_done(api)
    run_module.main(["--run-path", "--start-method=fork", *argv])


if __name__ == "__main__":
    main()

"""The job's own interpreter, started once with its heavy imports, forking each attempt.

Why: ``import torch`` costs 2-3 CPU-seconds, paid again by every cold start of a job; a gate starts
a job dozens of times. This process runs in the job's interpreter, flags and environment (never in
the harness's), imports what the job declares (``preload``), and then only forks: each child
becomes one attempt, as ``python script.py args`` would have made it: its own session and process
group, its own argv, working folder, environment, standard streams, string-hash-independent random
state and run marker, and the script run as ``__main__``. Standard library only, like the probe: it
imports nothing of spotchaos.

Fork safety is checked, not assumed: a process with more than one thread after its imports and
a trial fork (a library that started a pool and does not stop it when the process forks, as
OpenBLAS's own fork handler does), or with the CUDA driver loaded by an import, cannot fork
safely, so it answers with the reason and exits, and the harness starts that job cold.

The run marker: the harness finds a job's processes by ``SPOTCHAOS_RUN_ID=<id>`` in
``/proc/<pid>/environ``, which the kernel reads from the memory the environment had at exec. A
child of this process would show this process's marker; so the marker is the last variable of this
process's environment, and each child overwrites its value in place (same length) with its run's.

Protocol, over the Unix socket the harness passes as ``argv[1]`` (a file descriptor number): this
process sends one JSON datagram (``{"ready": pid}`` or ``{"refused": reason}``); each request is one
datagram of JSON with three descriptors (stdout, stderr, the attempt's own socket). On the attempt's
socket it sends ``{"pid": n}`` after the fork and ``{"exit": code}`` (negative: the signal) when the
child ends. End of the harness's socket ends this process.
"""

import contextlib
import ctypes
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys

MARKER = "SPOTCHAOS_RUN_ID"
MAX_REQUEST = 1 << 20


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _cuda_driver() -> str:
    """The CUDA driver library this process has mapped, or ''. An import that asks whether a GPU
    is there (DeepSpeed's accelerator detection, ``torch.cuda.is_available()``) loads and
    initialises it, and a driver initialised before a fork is unusable in the child; torch's CUDA
    runtime alone (``libcudart``, mapped by ``import torch``) is not the driver."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                name = line.rsplit("/", 1)[-1].strip()
                if name.startswith("libcuda.so"):
                    return name
    except OSError:
        pass
    return ""


def _preload(names: list) -> str:
    """Import what the job declared (``?name``: only if it imports here: missing, or failing on this
    Python or this version of its package, it is left to the attempt, as a cold start would); the
    reason a fork would be unsafe, or ''."""
    for name in names:
        optional, name = name.startswith("?"), name.lstrip("?")
        try:
            importlib.import_module(name)
        except Exception as exc:
            if not optional:
                return f"preloading {name!r} failed: {type(exc).__name__}: {exc}"[:300]
        except BaseException as exc:
            return f"preloading {name!r} failed: {type(exc).__name__}: {exc}"[:300]
    driver = _cuda_driver()
    if driver:
        loaded = ", ".join(n.lstrip("?") for n in names)
        return f"preloading {loaded} loaded the CUDA driver ({driver}): a forked attempt could not use the GPU"
    threads = _threads()
    if threads > 1:  # a pool whose library stops it before a fork (OpenBLAS's atfork handler) is safe
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        threads = _threads()
    if threads > 1:
        loaded = ", ".join(n.lstrip("?") for n in names)
        return f"{threads} threads were running after preloading {loaded}: a fork would not be safe"
    return ""


def _overwrite_marker(run_id: str) -> None:
    """Put this child's run id where ``/proc/self/environ`` reads its marker (same length)."""
    with open("/proc/self/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    env_start = int(fields[47])  # field 50 of stat(5), counted from field 3 after "(comm)"
    with open("/proc/self/environ", "rb") as environ:
        block = environ.read()
    old = f"{MARKER}={os.environ.get(MARKER, '')}".encode()
    offset = block.rfind(old + b"\0")
    new = f"{MARKER}={run_id}".encode()
    if offset < 0 or len(new) != len(old):
        raise RuntimeError("the run marker cannot be written in place")
    ctypes.memmove(env_start + offset, new, len(new))


def _become(request: dict, fds: list) -> None:
    """Turn this fork into the attempt; returns with everything set for the script to run."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stdout, stderr = fds[0], fds[1]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    for fd in (null, stdout, stderr):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    _overwrite_marker(request["env"][MARKER])
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("module"):  # ``python -m module``: the working folder first on the path, argv[0] set by runpy
        sys.argv = ["-m", *request["argv"]]
        sys.path[0] = os.getcwd()
    else:
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.realpath(sys.argv[0]))
    sys.path[1:1] = [p for p in request.get("path_prepend", []) if p not in sys.path]
    import tempfile

    tempfile.tempdir = None  # read TMPDIR again: the attempt has its own
    if "random" in sys.modules:  # a fresh interpreter seeds these from the OS: so does each child
        sys.modules["random"].seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    for hook in request.get("site_hooks", []):  # what a cold start imports first: the crash-point hook
        import runpy

        sys.modules["sitecustomize"] = type(sys)("sitecustomize")
        vars(sys.modules["sitecustomize"]).update(runpy.run_path(hook, run_name="sitecustomize"))


def _send(sock: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):  # the harness closed its end: nobody waits for this answer
        sock.send(json.dumps(message).encode())


def _serve(control: socket.socket) -> tuple:
    """Fork on each request; in the parent forever (until the harness goes), in a child returns
    its request and descriptors."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    attempts: dict = {}  # child pid -> the attempt's socket
    listening = True
    while listening or attempts:
        try:
            ready, _, _ = select.select([control, wake_r] if listening else [wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        while attempts:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            sock = attempts.pop(pid, None)
            if sock is not None:
                _send(sock, {"exit": os.waitstatus_to_exitcode(status)})
                sock.close()
        if control not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 3)
        except OSError:
            data, fds = b"", []
        if not data:  # the harness is done with this interpreter: tell the attempts' ends, then go
            listening = False
            continue
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        sock = socket.socket(fileno=fds[2])
        pid = os.fork()
        if pid == 0:
            sock.close()
            control.close()
            os.close(wake_r)
            os.close(wake_w)
            for other in attempts.values():
                other.close()
            return json.loads(data), fds[:2]
        os.close(fds[0])
        os.close(fds[1])
        attempts[pid] = sock
        _send(sock, {"pid": pid})
    os._exit(0)


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    preload = [name for name in sys.argv[2].split(",") if name]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the harness's to handle
    reason = _preload(preload)
    control.send(json.dumps({"refused": reason} if reason else {"ready": os.getpid()}).encode())
    if reason:
        return
    # what was imported stays out of every child's collections: a collection or the teardown at a
    # child's exit would otherwise write to each preloaded object and copy its page (a forked
    # child with torch exited in 0.6 s here, frozen in 0.2 s, a cold process in 0.1 s)
    gc.freeze()
    request, fds = _serve(control)
    del control
    _become(request, fds)
    import runpy

    if request.get("module"):
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()

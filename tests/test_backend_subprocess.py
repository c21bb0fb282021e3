"""The subprocess backend with real process groups: who gets the notice, and who survives."""

from __future__ import annotations

import os
import sys
import time

import pytest

from spotchaos.backends import LaunchSpec, SubprocessBackend
from spotchaos.errors import BackendError

from .helpers import is_alive, read_pids

PARENT_AND_CHILD = """
import os, signal, subprocess, sys, time
out = sys.argv[1]
def touch(name):
    open(os.path.join(out, name), "w").close()
signal.signal(signal.SIGTERM, lambda *a: touch("main-term"))
child_code = (
    "import os, signal, sys, time;"
    "signal.signal(signal.SIGTERM, lambda *a: open(os.path.join(sys.argv[1], 'child-term'), 'w').close());"
    "open(os.path.join(sys.argv[1], 'child-ready'), 'w').close();"
    "[time.sleep(0.05) for _ in range(1200)]"
)
child = subprocess.Popen([sys.executable, "-c", child_code, out])
with open(os.path.join(out, "pids"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
while True:
    time.sleep(0.05)
"""


def wait_for(path, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def launch(tmp_path, script, *args):
    spec = LaunchSpec(
        argv=(*script, *args),
        env=dict(os.environ),
        cwd=tmp_path,
        stdout_path=tmp_path / "out.log",
        stderr_path=tmp_path / "err.log",
    )
    return SubprocessBackend().start(spec)


def test_notice_to_main_only_then_to_the_whole_group(tmp_path, script):
    handle = launch(tmp_path, script(PARENT_AND_CHILD), str(tmp_path))
    try:
        wait_for(tmp_path / "child-ready")
        wait_for(tmp_path / "pids")
        handle.notify(15, whole_group=False)
        wait_for(tmp_path / "main-term")
        time.sleep(0.3)
        assert not (tmp_path / "child-term").exists(), "main-only notice reached the child"
        handle.notify(15, whole_group=True)
        wait_for(tmp_path / "child-term")
        assert handle.poll() is None  # both handle SIGTERM and keep running
    finally:
        handle.cleanup()
    assert not any(is_alive(pid) for pid in read_pids(tmp_path / "pids"))
    assert handle.survivors() == []


def test_cleanup_kills_processes_the_main_process_left_behind(tmp_path, script):
    orphaning = """
    import subprocess, sys, os
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(os.path.join(sys.argv[1], "pids"), "w").write(str(child.pid))
    """
    handle = launch(tmp_path, script(orphaning), str(tmp_path))
    assert handle.wait(30) == 0
    (child,) = read_pids(tmp_path / "pids")
    assert handle.survivors() == [child]
    handle.cleanup()
    handle.cleanup()  # idempotent
    assert not is_alive(child)


def test_a_command_that_cannot_start_is_one_clear_error(tmp_path):
    with pytest.raises(BackendError, match="could not start '/nonexistent/train'"):
        launch(tmp_path, ("/nonexistent/train",))


def test_hard_kill_reports_the_signal(tmp_path):
    handle = launch(tmp_path, (sys.executable, "-c", "import time; time.sleep(60)"))
    handle.kill()
    assert handle.wait(10) == -9
    handle.cleanup()


# a launcher that starts its worker in a session of its own, as torchrun's agent does
# (torch.distributed.elastic's SubprocessHandler: start_new_session=True)
OWN_SESSION_WORKER = """
import os, subprocess, sys, time
out = sys.argv[1]
worker_code = (
    "import os, sys, time;"
    "open(os.path.join(sys.argv[1], 'worker-ready'), 'w').close();"
    "[time.sleep(0.05) for _ in range(1200)]"
)
worker = subprocess.Popen([sys.executable, "-c", worker_code, out], start_new_session=True)
with open(os.path.join(out, "pids"), "w") as f:
    f.write(f"{os.getpid()} {worker.pid}")
worker.wait()
"""


@pytest.mark.parametrize("signum", [9, 15])
def test_a_signal_to_the_whole_job_reaches_a_worker_in_a_session_of_its_own(tmp_path, script, signum):
    """Before: SIGKILL went to the launcher's group only; the worker, re-parented, trained on while
    the fault was reported landed (issue 60)."""
    handle = launch(tmp_path, script(OWN_SESSION_WORKER), str(tmp_path))
    try:
        wait_for(tmp_path / "worker-ready")
        wait_for(tmp_path / "pids")
        main, worker = read_pids(tmp_path / "pids")
        assert os.getpgid(worker) != os.getpgid(main)
        if signum == 9:
            handle.kill()
        else:
            handle.notify(signum, whole_group=True)
        assert handle.delivery is not None
        reached = " ".join(handle.delivery.reached)
        assert f"pid {main} " in reached and f"pid {worker} " in reached, handle.delivery.reached
        assert handle.delivery.outlived == []
        deadline = time.monotonic() + 5
        while is_alive(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not is_alive(worker), "the worker outlived the signal to the whole job"
    finally:
        handle.cleanup()


@pytest.mark.unit
def test_a_servers_port_is_picked_below_the_ephemeral_range_where_no_connect_can_take_it():
    """A port from bind(0) is an ephemeral one, which any outgoing connection may take as its source
    port before the server binds it: a torchrun restart's rendezvous failed EADDRINUSE so in the
    main job. The harness picks below the range, a port it could bind just now."""
    import socket

    from spotchaos.host.ports import EPHEMERAL_RANGE, free_port

    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports), (ports, low)
    assert len(ports) > 1  # random, not one port every picker shares
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports.pop()))


def test_a_process_is_described_by_what_it_runs_however_deep_the_checkout_lies(tmp_path):
    """A path's last part stays in the 80 characters a message gives a process (CI's checkout lies
    deeper than a developer's: a script's name cut off there failed a test once)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from spotchaos.host.processes import describe

    deep = "/" + "/".join(["a-long-folder-name"] * 8) + "/fixtures/reference_trainer.py"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", deep, "--steps", "12"])
    try:
        cmdline = Path(f"/proc/{child.pid}/cmdline")
        deadline = time.monotonic() + 10  # until the child has exec'd: its command line is empty while it execs
        while b"reference_trainer.py" not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        said = describe(child.pid)
    finally:
        child.kill()
        child.wait()
    assert said.startswith(f"pid {child.pid} (") and "reference_trainer.py --steps 12" in said, said
    assert "a-long-folder-name" not in said and len(said) <= len(f"pid {child.pid} ()") + 80, said

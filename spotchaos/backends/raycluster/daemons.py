"""The processes of a local Ray cluster: each node's ``ray start --block``, and their certain end.

Kept apart from the cluster's bookkeeping of nodes (``cluster.py``: which node is placed on,
drained, removed, replaced) because owning processes is its own job with its own dangers: each
daemon starts with the cluster's environment (loopback only, the cluster's private token, a
marker a later session finds should this one die), in this process's group (the harness never
takes them for a job's orphans), its log in the cluster's private folder; and :meth:`end` makes
sure of their end, by tree, by marker and by the files they hold open, and names any survivor.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from ...host.leftovers import MARKER_VARIABLE, LiveJobs
from ...host.ports import free_port
from ...host.processes import descendants, describe, end, start_time, sweep

# The harness's own cluster answers on loopback, which every local user shares: it admits only
# this session, by a token of its own (token authentication, RAY_AUTH_MODE=token) in a file of the
# cluster's private folder (0600 in 0700), named by RAY_AUTH_TOKEN_PATH to its processes, the
# harness's client and its Ray Train drivers. Never ~/.ray/auth_token, which any earlier local
# `ray.init()` writes and Ray 2.60 then picks up by itself; a RAY_AUTH_TOKEN of the user's
# environment is dropped (it would win over the file). The user's cluster (--spotchaos-ray-address)
# keeps its own settings.
AUTH_TOKEN_FILE = "auth_token"
INHERITED_TOKEN = "RAY_AUTH_TOKEN"  # a token of the user's environment: Ray would prefer it to the file


def private_token(folder: str) -> dict[str, str]:
    """A fresh token in a file only this user can read (``folder`` is mkdtemp's, 0700), and the
    variables that make a Ray process use it."""
    path = os.path.join(folder, AUTH_TOKEN_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": path}


def with_auth(env: Mapping[str, str], auth: Mapping[str, str]) -> dict[str, str]:
    """``env`` as a process that joins the cluster gets it: the cluster's own authentication over
    it, and a ``RAY_AUTH_TOKEN`` the user's environment carried dropped (Ray would prefer it to the
    cluster's file). No ``auth`` (the user's cluster): ``env`` as it is."""
    if not auth:
        return dict(env)
    return {**{k: v for k, v in env.items() if k != INHERITED_TOKEN}, **auth}


def agent_ports() -> list[str]:
    """Each node's agents on ports of its own: Ray's fixed defaults would collide on one machine."""
    agents = ("dashboard-agent-listen", "dashboard-agent-grpc", "runtime-env-agent", "metrics-export")
    return [f"--{agent}-port={free_port()}" for agent in agents]


def reap(pids: list[int]) -> None:
    """Collect the exit of each of ``pids`` that was re-parented here (this is their subreaper)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


class NodeDaemons:
    """The ``ray start --block`` processes of one local cluster, by node name (see the module)."""

    def __init__(self) -> None:
        self.temp_dir: str | None = None  # the cluster's private folder (0700): logs, token, Ray's folder
        self.ray_dir = ""  # Ray's --temp-dir, inside temp_dir
        self.marker = ""
        self.auth_env: dict[str, str] = {}
        self.starters: dict[str, subprocess.Popen] = {}  # node name -> its `ray start --block`
        self.killed: list[int] = []  # a removed node's processes: re-parented here later, reaped at the end
        self._live = LiveJobs()
        self._live_entry = None

    def open(self) -> None:
        """The cluster's folder, marker and token, before any daemon starts."""
        # short: Ray puts Unix sockets under it (107 bytes at most); an attempt's kind of scratch folder,
        # so a later session removes it should this one die (spotchaos.host.leftovers)
        self.temp_dir = tempfile.mkdtemp(prefix="spotchaos-tmp-ray-")
        # every process of the cluster carries this marker: a later session ends them all if this
        # process dies without closing it (SIGKILL, OOM), as it ends a dead session's jobs
        self.marker = f"ray-cluster-{uuid.uuid4().hex[:12]}"
        self._live_entry = self._live.add(self.marker, {"scratch": self.temp_dir})
        # Ray's own folder is one level down: Ray makes the folder it is given writable by everyone
        # (0777, its sockets inside), and this one (mkdtemp's 0700) keeps every other user out of
        # it and holds the cluster's token beside it. Ray writes the address of "the current
        # cluster" under RAY_TMPDIR/ray (else /tmp/ray, shared with every Ray user of the machine)
        self.ray_dir = os.path.join(self.temp_dir, "r")
        os.makedirs(os.path.join(self.ray_dir, "ray"))
        self.auth_env = private_token(self.temp_dir)

    def node_folder(self, name: str) -> str:
        """A worker node's own TMPDIR (a cluster of hosts that share no folder, on one machine)."""
        folder = os.path.join(str(self.temp_dir), "nodes", name)
        os.makedirs(folder, mode=0o700)
        return folder

    def start(self, name: str, args: list[str], env: Mapping[str, str]) -> subprocess.Popen:
        """``ray start --block`` for node ``name`` on loopback, with ``env`` and the cluster's token and marker."""
        env = with_auth({**env, "RAY_TMPDIR": self.ray_dir}, self.auth_env)
        env[MARKER_VARIABLE] = self.marker
        ray_cli = [sys.executable, "-m", "spotchaos.backends.raycluster.node_main"]  # loopback only: see there
        log = open(os.path.join(str(self.temp_dir), f"{name}.log"), "wb")
        with log:
            process = subprocess.Popen(
                [*ray_cli, "start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats", *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # in this process's group: the harness never takes its daemons for a job's orphans
        self.starters[name] = process
        return process

    def log_tail(self, name: str) -> str:
        """The end of node ``name``'s log, for an error that says why it did not start."""
        try:
            with open(os.path.join(str(self.temp_dir), f"{name}.log"), "rb") as log:
                return log.read()[-600:].decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self, name: str, also: list[int]) -> int:
        """The VM gone: node ``name``'s daemon and everything below it SIGKILLed at once, with ``also``
        (processes that left its tree, by identity); how many processes."""
        starter = self.starters.pop(name, None)
        pids = descendants(starter.pid) if starter is not None else []
        pids += [pid for pid in also if pid not in pids]
        end(pids)
        if starter is not None:
            starter.wait()
        reap(pids)
        self.killed += pids
        return len(pids)

    def end(self) -> list[str]:
        """End every daemon (workers first: a raylet without its GCS waits to give up) and whatever
        left their trees; remove the cluster's folder. Returns the processes that survived, described."""
        everything = [pid for starter in self.starters.values() for pid in descendants(starter.pid)]
        workers = [n for n in self.starters if n != "head"]
        for name in [*workers, "head"]:
            starter = self.starters.get(name)
            if starter is not None and starter.poll() is None:
                starter.terminate()  # `ray start --block` ends its node's processes on SIGTERM
        deadline = time.monotonic() + 15
        for starter in self.starters.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                starter.wait(timeout=max(0.1, deadline - time.monotonic()))
        everything += [pid for starter in self.starters.values() for pid in descendants(starter.pid)]
        end(everything)  # what shutdown left (a worker process, a stuck raylet)
        # what left the nodes' trees: by the cluster's marker, or, for an agent whose title hides
        # its environment, by the logs it holds open in the cluster's folder
        marker = f"{MARKER_VARIABLE}={self.marker}" if self.marker else None
        everything += list(sweep(marker, Path(self.temp_dir) if self.temp_dir else None))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and [p for p in everything if start_time(p) is not None]:
            reap(everything)
            time.sleep(0.05)
        reap(everything)
        reap(self.killed)  # a removed node's processes, re-parented here since: their exits collected
        left = [describe(p) for p in sorted(set(everything)) if start_time(p) is not None]
        self.starters.clear()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
        self._live.discard(self._live_entry)
        return left

"""Jobs under torchrun (TorchElastic): the agents of a job, the handle over all of them, and the
rank-level faults (one rank killed, one rank stopped, a node lost).

The job runs on the distributed engine its users run in production: ``python -m
torch.distributed.run``, one agent per "node", a c10d rendezvous on 127.0.0.1. What that engine
does is not reimplemented here, only observed and provoked: the agent forwards a SIGTERM to its
workers and SIGKILLs them 30 s later (its ``--shutdown-timeout``) whatever the provider's grace;
it restarts the whole worker group when one rank dies (``--max-restarts``); workers run in
sessions of their own, so only the run's marker variable finds them all. Ranks are known from the
probe's ``start`` events (pid and rank) and trusted only once the process carries the run's marker.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import unquote, urlparse

from ...backends.base import Backend, LaunchSpec
from ...config.declare import PYTHON_ALIASES
from ...config.jobs import JobSpec
from ...errors import JobError
from ...host.ports import bind_error, free_port
from ...host.processes import carrying, descendants, end
from ...host.warm import torchrun_ranks
from ...safety.safefs import UnsafeFile, log_tail, open_beneath
from ..engine.hold import ENV_HOLD_PATTERN
from ..engine.options import CRASHPOINT_DIR
from ..events import LineReader
from .ranked import LaunchedNode, RankedHandle

log = logging.getLogger("spotchaos")
ENV_NODE = "SPOTCHAOS_NODE"  # "<run id>:<node>": finds one node's processes
MONITOR_INTERVAL = "0.1"  # how often an agent looks at its workers (seconds)
SHUTDOWN_VARIABLE = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"  # torchrun's fallback for --shutdown-timeout
SHUTDOWN_DEFAULT_SECONDS = 30.0  # torchrun's own, and the only one before torch 2.11
# a script read through the log adapter: torchrun keeps each rank's output in its log folder (read
# there) and tees it to its agent's, each line after this (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)
RANK_PREFIX_TEMPLATE = "[rank${rank}]:"


def check_port(job: JobSpec, port: int) -> None:
    """A configured rendezvous port that is taken is the user's to fix, said before any agent starts."""
    error = bind_error(port)
    if error is not None and error.errno == errno.EADDRINUSE:
        raise JobError(
            f"{job.where('rdzv_port')}: port {port} on 127.0.0.1 is already taken, so torchrun's rendezvous "
            "cannot listen there; free it or leave rdzv_port unset (a free port is picked)"
        )
    if error is not None:
        raise error


@dataclass(frozen=True)
class Rendezvous:
    """Where one attempt's agents meet: node 0's store on loopback, and the run's id."""

    port: int
    run_id: str

    def options(self, node: int) -> list[str]:
        return [
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            f"--rdzv-id={self.run_id}",
            f"--rdzv-conf=is_host={1 if node == 0 else 0}",  # node 0 holds the store: the one never lost
        ]


def agent_argv(
    job: JobSpec,
    argv: tuple[str, ...],
    *,
    node: int,
    rendezvous: Rendezvous,
    forked: ForkedRanks | None = None,
    log_dir: Path | None = None,
) -> tuple[str, ...]:
    """One node's torchrun command: the job's own command after torchrun's options; ``forked``:
    torchrun forking its ranks (``host/warm/torchrun_ranks.py``), with the crash-point hook to
    import again in each; ``log_dir``: a script read through the log adapter, whose rank 0's lines
    torchrun tees to its output (``RANK0_PREFIX`` before each) and every rank's into that folder."""
    if forked is not None:
        hook = [f"{torchrun_ranks.HOOK_OPTION}{forked.site_hook}"] if forked.site_hook else []
        launcher = [sys.executable, torchrun_ranks.__file__, *hook]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run"]
    launcher += [
        f"--nproc-per-node={job.nproc_per_node}",
        f"--nnodes={job.nnodes}",
        f"--max-restarts={job.max_restarts}",
        f"--monitor-interval={MONITOR_INTERVAL}",
        *rendezvous.options(node),
        "--local-addr=127.0.0.1",  # MASTER_ADDR on loopback, never the host name's address
    ]
    if job.shutdown_timeout_seconds is not None:
        launcher.append(f"--shutdown-timeout={job.shutdown_timeout_seconds}")
    if log_dir is not None:
        launcher += ["--tee=3", f"--log-dir={log_dir}"]
    if argv[0] in (sys.executable, *PYTHON_ALIASES):
        return (*launcher, *argv[1:])  # "-m module" and "script.py" are torchrun's own forms
    return (*launcher, "--no-python", *argv)


@dataclass(frozen=True)
class ForkedRanks:
    """An attempt whose ranks torchrun's agent forks (warm) instead of starting cold."""

    site_hook: str = ""  # the crash-point hook a cold rank would import first


def forked_ranks(spec: LaunchSpec, backend: Backend) -> ForkedRanks | str:
    """Whether the agent may fork this attempt's ranks, or why they start cold. Forked where the
    attempt may start warm at all (``start_env``: a local Python job in a session that keeps warm
    interpreters) and its command is a script: ``python -m module`` and interpreter flags are
    torchrun's to start as ever. A crash point is armed in a forked rank by RANK, so it is
    re-imported there; one armed in every process (no rank named) stays with cold ranks."""
    argv = spec.argv
    if spec.start_env is None or backend.name != "subprocess":
        return "the attempt starts cold"
    if argv[0] not in (sys.executable, *PYTHON_ALIASES) or len(argv) < 2 or argv[1].startswith("-"):
        return "the job's command is no plain 'python script.py'"
    if ENV_HOLD_PATTERN in spec.env:
        return "the log adapter's hold watches each rank's own output, set up as the rank starts"
    if "SPOTCHAOS_CRASH_ROOT" not in spec.env:
        return ForkedRanks()
    if "SPOTCHAOS_CRASH_RANK" not in spec.env:
        return "a crash point armed in every process"
    return ForkedRanks(site_hook=str(CRASHPOINT_DIR / "sitecustomize.py"))


def log_dir(spec: LaunchSpec) -> Path:
    """Where torchrun keeps its ranks' output, for a script read through the log adapter: beside
    the attempt's own logs, in the harness's folder (``.node<n>`` for node n)."""
    return spec.stdout_path.parent / "torchrun-logs"


class RankLogLines(LineReader):
    """Rank 0's own output, as torchrun keeps it with ``--tee``:
    ``<log_dir>/<run id>_<random>/attempt_<n>/0/<stream>.log``, read as the rank writes it (the
    agent's tee copies it a poll later: a checkpoint would be credited before the step line that
    preceded it). Torchrun's own restarts of the worker group write a newer ``attempt_<n>``: read
    on from there once the older file is read to its end. Nothing below ``log_dir`` is followed
    through a link."""

    def __init__(self, folder: Path, stream: str, latency: float = 0.0) -> None:
        super().__init__(folder / "(rank 0, not started)", f"rank 0's {stream} log", latency)
        self.folder = folder
        self.stream = "stderr" if stream == "stderr" else "stdout"
        self.relative: str | None = None

    def _newest(self) -> str | None:
        found: list[tuple[int, str]] = []
        for run in _folders(self.folder):
            for number, attempt in _attempts(self.folder / run):
                found.append((number, f"{run}/{attempt}/0/{self.stream}.log"))
        return max(found)[1] if found else None

    def _open(self) -> int:
        assert self.relative is not None
        return open_beneath(self.folder, self.relative)

    def read_lines(self) -> list[bytes]:
        newest = self._newest()
        if newest is None:
            return []
        if newest == self.relative:
            return super().read_lines()
        earlier = super().read_lines() if self.relative is not None else []  # the older file, to its end
        self.close()
        self.relative, self.path, self.pending = newest, self.folder / newest, b""
        return [*earlier, *super().read_lines()]


RANK_LOG_LIMIT = 16 << 20  # the bytes of one rank's log of one attempt read for its steps


def node_log_dir(spec: LaunchSpec, node: int) -> Path:
    """Node ``node``'s torchrun log folder (node 0's is :func:`log_dir`)."""
    base = log_dir(spec)
    return base.with_name(base.name + (f".node{node}" if node else ""))


def other_ranks_lines(spec: LaunchSpec, job: JobSpec, stream: str) -> dict[int, list[str]]:
    """Every rank but 0's printed lines, from the logs torchrun kept of this launch (``--tee``,
    ``--log-dir``), each of its own restarts in order: what a script printing on every rank shows
    of each rank's trajectory. A rank's global number is its node's times ``nproc_per_node`` plus
    its local one (torchrun's folders are local ranks); nothing is followed through a link."""
    stream = "stderr" if stream == "stderr" else "stdout"
    lines: dict[int, list[str]] = {}
    for node in range(job.nnodes):
        folder = node_log_dir(spec, node)
        for run in _folders(folder):
            for _, attempt in _attempts(folder / run):
                for local in (r for r in _folders(folder / run / attempt) if r.isdigit()):
                    rank = node * job.nproc_per_node + int(local)
                    if rank == 0:
                        continue
                    try:
                        fd = open_beneath(folder, f"{run}/{attempt}/{local}/{stream}.log")
                    except (OSError, UnsafeFile):
                        continue  # no log, or one that is not a plain file: the rank is not judged on it
                    with os.fdopen(fd, "rb") as log:
                        text = log.read(RANK_LOG_LIMIT).decode("utf-8", "replace")
                    # a line not ended when the rank died is no step yet, as rank 0's own unfinished line
                    lines.setdefault(rank, []).extend(text.split("\n")[:-1])
    return lines


def _attempts(run: Path) -> list[tuple[int, str]]:
    """torchrun's restarts of one run's worker group, ``attempt_<n>`` folders, in order of n."""
    return sorted((int(a[8:]), a) for a in _folders(run) if a.startswith("attempt_") and a[8:].isdigit())


def _folders(path: Path) -> list[str]:
    """The folders directly in ``path``, links left out."""
    try:
        with os.scandir(path) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


PORT_LAUNCHES = 3


def store_port_taken(stderr: str) -> bool:
    """Whether an agent's stderr ends in its rendezvous store failing to listen on its port
    (``DistNetworkError ... EADDRINUSE`` from ``_create_tcp_store``): before any rank started."""
    return "EADDRINUSE" in stderr and "_create_tcp_store" in stderr


def loopback_environment() -> dict[str, str]:
    """Collectives on loopback only: gloo and nccl bind the interface they are told."""
    return {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}


class TorchrunHandle(RankedHandle):
    """Every agent of one attempt (one per node) and every rank they start, as one handle."""

    launcher = "torchrun"
    notice_lag_seconds = 5.0  # the agent forwards a SIGTERM to its ranks: a held rank waits this long for it

    def __init__(self, backend: Backend, job: JobSpec, spec: LaunchSpec, run_id: str) -> None:
        super().__init__(job, run_id)
        self.backend = backend
        self.port = job.rdzv_port or free_port()
        if job.rdzv_port:
            check_port(job, self.port)
        self.base_spec = spec
        self.launches = 1  # of the agents: another on a new port where the harness's pick was taken first
        forked = forked_ranks(spec, backend)
        self.forked, self.cold_ranks = (forked, "") if isinstance(forked, ForkedRanks) else (None, forked)
        self._launch_nodes()

    def _launch_nodes(self) -> None:
        try:
            for node in range(self.job.nnodes):
                self.nodes.append(LaunchedNode(node, self.backend.start(self._node_spec(node))))
        except BaseException:
            self.cleanup()
            raise
        self.identity = {**self.nodes[0].handle.identity}

    def poll(self) -> int | None:
        code = super().poll()
        return None if code and self._relaunched_on_a_taken_port() else code

    def _relaunched_on_a_taken_port(self) -> bool:
        """Node 0's agent could not listen on the rendezvous port the harness picked: another
        process took it between the pick and the agent's bind, seconds later (a port is only known
        free when it is checked: the main job's ``torchrun-snapshot`` reference once failed so).
        Nothing of the job ran: the agents start again on another port, ``PORT_LAUNCHES`` launches
        in all, the failed one's logs kept beside. A port the job declares (rdzv_port) is its own."""
        first = self._node_spec(0).stderr_path
        if self.job.rdzv_port or self.launches >= PORT_LAUNCHES or not store_port_taken(log_tail(first, 16384)):
            return False
        for node in self.nodes:
            self._end_node(node)
        for node in range(self.job.nnodes):
            spec = self._node_spec(node)
            for path in (spec.stdout_path, spec.stderr_path):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(path, path.with_name(f"{path.stem}.port-taken-{self.launches}.log"))
        log.warning(
            "spotchaos: job %r: torchrun's rendezvous port %d was taken; its agents start again",
            self.job.name,
            self.port,
        )
        self.nodes, self.port = [], free_port()
        self.launches += 1
        self._launch_nodes()
        return True

    def _log(self, path: Path, node: int) -> Path:
        """Node 0 logs where a one-process attempt would; node n beside it, ``.node<n>``."""
        return path.with_name(path.stem + (f".node{node}" if node else "") + ".log")

    def _node_spec(self, node: int) -> LaunchSpec:
        spec = self.base_spec
        env = {**spec.env, **loopback_environment(), ENV_NODE: f"{self.run_id}:{node}"}
        logs = None
        if self.job.log is not None:  # each rank's output kept in torchrun's log folder, and teed to the agent's
            logs = node_log_dir(spec, node)
            env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = RANK_PREFIX_TEMPLATE
        meeting = Rendezvous(self.port, self.run_id)
        argv = agent_argv(self.job, spec.argv, node=node, rendezvous=meeting, forked=self.forked, log_dir=logs)
        return replace(
            spec,
            argv=argv,
            env=env,
            marker=f"{ENV_NODE}={self.run_id}:{node}",  # one node's processes, not its peers'
            stdout_path=self._log(spec.stdout_path, node),
            stderr_path=self._log(spec.stderr_path, node),
        )

    def lose_node(self, index: int) -> None:
        if not 0 < index < len(self.nodes):
            raise JobError(
                f"job {self.job.name!r}: lose-node{index} needs a node {index} other than node 0, which holds the "
                f"rendezvous store (the job has nnodes = {self.job.nnodes})"
            )
        node = self.nodes[index]
        ended = self._end_node(node)
        listed = ", ".join(map(str, ended)) or "none found"
        self.delivery_note = f"node {index} lost (its agent and workers SIGKILLed: pids {listed})"

    def drain_node(self, index: int) -> None:
        """``drain-node<n>``: node ``n``'s reclaim notice, alone: SIGTERM to its agent, which
        forwards it to its ranks; the other nodes get nothing. At the grace window's end what is
        left of the job is SIGKILLed, as the VM goes and its peers fail without it."""
        if not 0 <= index < len(self.nodes):
            raise JobError(f"job {self.job.name!r}: drain-node{index} names no node (nnodes = {self.job.nnodes})")
        self.nodes[index].handle.notify(signal.SIGTERM, whole_group=False)
        self.delivery_note = (
            f"node {index}'s agent (pid {self.nodes[index].handle.pid}) sent SIGTERM; no other node was"
        )

    def _end_node(self, node: LaunchedNode) -> list[int]:
        """The agent and every process under it at once: ranks it forked carry the run's marker
        but not the node's (they were never exec'd with it), so they are found as its descendants,
        the agent stopped first so that it starts no other while they are listed."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.handle.pid, signal.SIGSTOP)
        forked = set(descendants(node.handle.pid)) & set(carrying(self.marker))
        node.handle.kill()
        workers = sorted(forked | set(carrying(f"{ENV_NODE}={self.run_id}:{node.index}")))
        end(workers)
        return workers

    # --- Handle -----------------------------------------------------------------------------------
    @property
    def start_kind(self) -> str:
        """Warm where every agent was forked warm and forked its ranks in turn; else cold, and why:
        the agent's reason, ranks that torchrun started (``cold_ranks``), or a torch whose torchrun
        could not fork them (the line its agent wrote, read back from the agent's stderr)."""
        kinds = {node.handle.start_kind for node in self.nodes}
        if kinds != {"warm"}:
            return min(kind for kind in kinds if kind != "warm")
        if self.forked is None:
            return f"cold: torchrun starts its ranks ({self.cold_ranks}; its agents were forked warm)"
        said = _cold_line(self._log(self.base_spec.stderr_path, 0))
        return f"cold: {said}" if said else "warm"

    @property
    def placement(self) -> dict | None:
        """Where each torchrun node ran, on a cluster backend (the Ray node of each agent)."""
        placed = [node.handle.placement for node in self.nodes]
        return {"torchrun_nodes": placed} if any(placed) else None


def _cold_line(stderr: Path) -> str:
    """The line an agent writes when its torch cannot fork ranks (read without following a link)."""
    try:
        fd = os.open(stderr, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as file:
        head = file.read(8192).decode("utf-8", "replace")
    for line in head.splitlines():
        if line.startswith(torchrun_ranks.COLD):
            return line[len("spotchaos: ") :][:200]
    return ""


def start(backend: Backend, job: JobSpec, spec: LaunchSpec, run_id: str) -> TorchrunHandle:
    """Start every agent of one attempt of ``job``."""
    if backend.name not in ("subprocess", "ray"):
        raise JobError(
            f"{job.where('launcher')}: torchrun jobs run on the subprocess or ray backend, not {backend.name}"
        )
    return TorchrunHandle(backend, job, spec, run_id)


def exited_on_notice(stderr_tail: str) -> bool:
    """torchrun's agent answers a SIGTERM by stopping its workers and exiting 1 with this exception:
    the exit is the launcher's, not a failed checkpoint (the ranks' events say how they ended)."""
    return "SignalException" in stderr_tail and "got signal: 15" in stderr_tail


RANK_ERROR = re.compile(r"^\[rank(\d+)\]: ((?:[\w.]+)?(?:Error|Exception)\b.*)$", re.MULTILINE)


def rank_errors(stderr_tail: str) -> str:
    """The exception each rank died with, from torchrun's "[rankN]: ..." lines: under the agent's
    own failure banner, these name the cause ("rank 1: RuntimeError: ..."); empty if none."""
    last: dict[int, str] = {}
    for match in RANK_ERROR.finditer(stderr_tail):
        last[int(match.group(1))] = match.group(2)[:300]
    return "; ".join(f"rank {rank}: {text}" for rank, text in sorted(last.items()))


def shutdown_seconds(job: JobSpec, env: Mapping[str, str]) -> float:
    """How long the agent of this launch gives its ranks between its SIGTERM and its SIGKILL: the
    job's ``--shutdown-timeout``, else the variable torchrun reads in the launch's environment, else
    torchrun's 30 s."""
    if job.shutdown_timeout_seconds is not None:
        return float(job.shutdown_timeout_seconds)
    try:
        return float(int(env.get(SHUTDOWN_VARIABLE, "")))
    except ValueError:
        return SHUTDOWN_DEFAULT_SECONDS


def killed_workers(stderr_tail: str) -> bool:
    """Whether the agent SIGKILLed workers that outlived its shutdown timeout after the notice it
    forwarded."""
    return "Unable to shutdown process" in stderr_tail and "forcefully exiting via" in stderr_tail


def uri_path(uri: str) -> Path:
    """The local path of a ``file://`` URI the job reported (percent-decoded, normalised as text,
    never resolved): a run folder's name holds a ``+`` that a URI encodes."""
    return Path(os.path.normpath(unquote(urlparse(uri).path) or "."))


OTHER_FORMATS = (".safetensors", ".bin", ".pt", ".pth", ".pkl", ".ckpt")  # a torch.save or framework folder


def _another_format(path: Path) -> bool:
    """A checkpoint folder that is not torch.distributed.checkpoint's, so has no ``.metadata`` to
    miss: no ``.distcp`` shard in it, and files of another format (accelerate's ``save_state``, a
    job's own ``torch.save``). A folder with only a manifest, or nothing yet, may be DCP's published
    early. Names only: nothing opened or followed."""
    try:
        with os.scandir(path) as entries:
            names = [entry.name for entry in entries]
    except OSError:  # gone or unreadable since: nothing known of it, so judged as DCP's
        return False
    return not any(n.endswith(".distcp") for n in names) and any(n.endswith(OTHER_FORMATS) for n in names)


def published_without_metadata(run_attempts: list, root: Path | str) -> list[str]:
    """Checkpoints the job reported durable whose directory holds shards but no ``.metadata``
    (torch.distributed.checkpoint's index, written by the coordinator after every shard): it was
    published before every shard was durable. Only paths inside the run's own directory are
    looked at, as text, never resolved."""
    root = Path(os.path.abspath(root))
    found = []
    for attempt in run_attempts:
        for event in attempt.of_kind("checkpoint"):
            path = uri_path(str(event.get("uri", "")))
            if not path.is_relative_to(root) or path == root or os.path.islink(path) or not path.is_dir():
                continue
            if not os.path.lexists(path / ".metadata") and not _another_format(path):
                found.append(
                    f"checkpoint {path.name} (after step {event['step']}, attempt {attempt.index}) was reported "
                    "durable but has no .metadata: it was published before every shard was written, so a rank killed "
                    "in between leaves a checkpoint the restart trusts; publish (manifest, probe.checkpoint) last, "
                    "and with dcp.async_save only once the future it returned has completed on every rank"
                )
    return found[:1]


MISSING_FILE = re.compile(r"(?:FileNotFoundError|No such file or directory)[^\n]*?'(/[^'\n]+)'")
RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.I)


def published_before_ranks(run_attempts: list, root: Path | str) -> list[str]:
    """A checkpoint the job reported durable that a restart then died reading a missing file of:
    it was marked complete before every rank had written its own files (rank 0 published without
    a barrier, and a rank was killed before its file). Names the checkpoint, the file that
    published it (the newest in its folder) and the missing one with the rank it belongs to. Only
    paths inside the run's own directory are looked at, as text, never resolved."""
    root = Path(os.path.abspath(root))
    published: dict[Path, tuple[int, int]] = {}
    for attempt in run_attempts:
        for event in attempt.of_kind("checkpoint"):
            path = uri_path(str(event.get("uri", "")))
            if path.is_relative_to(root) and path != root:
                published.setdefault(path, (event["step"], attempt.index))
    for attempt in run_attempts[1:]:
        for match in MISSING_FILE.finditer(attempt.stderr_tail or ""):
            missing = Path(os.path.normpath(match.group(1)))
            folder = next((f for f in published if missing.is_relative_to(f) and missing != f), None)
            if folder is None or os.path.lexists(missing):
                continue
            step, index = published[folder]
            rank = RANK_IN_NAME.search(missing.name)
            whose = f"rank {rank.group(1)}'s " if rank else ""
            publisher = _newest_file(folder)
            by = f" ({publisher} was written last, so it published the checkpoint)" if publisher else ""
            return [
                f"checkpoint {folder.name} (after step {step}, attempt {index}) was published before every rank had "
                f"written its files: {whose}{missing.relative_to(folder)} did not exist when the checkpoint was "
                f"marked complete{by}, and attempt {attempt.index} died reading it; publish (the manifest, the "
                "marker, probe.checkpoint) only after a barrier that every rank reaches once its own files are written"
            ]
    return []


def _newest_file(folder: Path) -> str | None:
    """The name of the regular file in ``folder`` written last (by mtime), without following links."""
    try:
        entries = [
            (e.stat(follow_symlinks=False).st_mtime_ns, e.name)
            for e in os.scandir(folder)
            if e.is_file(follow_symlinks=False)
        ]
    except OSError:
        return None
    return max(entries)[1] if entries else None

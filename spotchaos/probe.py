"""The trainer side of the spotchaos contract.

A training script imports this module (and nothing else of spotchaos) to report what it does:
the loss of every step, every checkpoint it makes, where it resumed from, which damaged
checkpoints it skipped, and the digests of its final weights. Everything travels through one
JSON-lines file named by ``SPOTCHAOS_EVENTS`` so that the same script works as a subprocess,
inside a container, or on another host whose file system the harness can read.

Why so strict about imports: this module must be importable inside the user's training image,
which has torch but not necessarily pytest, hypothesis, docker or boto3. Only the standard
library is imported at module level; torch is touched only when a tensor is handed in.

Every write is one ``os.write`` on an ``O_APPEND`` descriptor, so a line is either entirely in
the file or not at all, even when the process is SIGKILLed mid-training.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlparse

STEP_AUDIT_EVENT = "spotchaos.step"  # raised at each reported step (PEP 578): see spotchaos/faults/crashpoint

EVENT_SCHEMA_VERSION = 1

ENV_EVENTS = "SPOTCHAOS_EVENTS"
ENV_CHECKPOINT_URI = "SPOTCHAOS_CHECKPOINT_URI"
ENV_RUN_ID = "SPOTCHAOS_RUN_ID"
ENV_ATTEMPT = "SPOTCHAOS_ATTEMPT"
ENV_RANK = "SPOTCHAOS_RANK"
# what torchrun (TorchElastic) tells each worker: its global rank, and how many times the agent
# has restarted the worker group in this launch (a killed rank restarts every rank)
ENV_TORCH_RANK = "RANK"
ENV_TORCH_RESTARTS = "TORCHELASTIC_RESTART_COUNT"
# envelope mode: where final() also saves the tensors themselves, so the harness can measure how
# far apart two runs' weights are (a digest only says whether they are equal)
ENV_FINAL_TENSORS = "SPOTCHAOS_FINAL_TENSORS"
# the hold: the 0-based step after which this attempt waits until the harness has delivered its
# fault, the folder of the two FIFOs it waits on, the rank that holds, and how long it waits at most
ENV_HOLD_AT = "SPOTCHAOS_HOLD_AT"
ENV_HOLD_DIR = "SPOTCHAOS_HOLD_DIR"
ENV_HOLD_RANK = "SPOTCHAOS_HOLD_RANK"
ENV_HOLD_SECONDS = "SPOTCHAOS_HOLD_SECONDS"
ENV_HOLD_PHASE = "SPOTCHAOS_HOLD_PHASE"  # hold at the first such phase after the step, not at the step
HOLD_RELEASE = "release"  # the harness writes a byte here once the fault is delivered
HOLD_HELD = "held"  # the job writes "STEP PID" here as it starts to wait
# the reference run's checkpoint hold: the folder of its two FIFOs; after each checkpoint the job
# waits there while the harness copies the checkpoint folder (a prefix later plans start from)
ENV_SNAPSHOT_HOLD_DIR = "SPOTCHAOS_SNAPSHOT_HOLD_DIR"

__all__ = [
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_URI",
    "ENV_EVENTS",
    "ENV_RANK",
    "ENV_RUN_ID",
    "EVENT_SCHEMA_VERSION",
    "Probe",
    "StepHold",
    "checkpoint_dir_from_env",
    "fingerprint",
    "loss_to_hex",
    "tensor_digest",
    "tensor_digests",
]


def loss_to_hex(loss: Any) -> str:
    """Return the loss as ``float.hex`` so that every bit survives the trip through JSON.

    A decimal repr of a float32 loss widened to float64 is exact too, but hex makes the
    intent unmistakable in the events file and in the report.
    """
    if hasattr(loss, "detach"):  # a torch tensor; .item() keeps the value, float() the bits
        loss = loss.detach().float().cpu().item()
    value = float(loss)
    return value.hex()


def tensor_digest(tensor: Any) -> str:
    """sha256 over dtype, shape and the raw bytes of a tensor (any dtype, any device).

    dtype and shape are part of the digest: a resumed run that silently comes back in another
    dtype has not resumed bit-exact even if the bytes happened to agree.
    """
    import torch  # only trainers that report weights need torch

    t = tensor.detach().cpu().contiguous()
    header = f"{t.dtype}|{tuple(t.shape)}|".encode()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return hashlib.sha256(header + raw).hexdigest()


def tensor_digests(tensors: Mapping[str, Any]) -> dict[str, str]:
    """Digest every tensor of a state dict; non-tensor entries are digested from their repr."""
    out: dict[str, str] = {}
    for name in sorted(tensors):
        value = tensors[name]
        if hasattr(value, "detach"):
            out[name] = tensor_digest(value)
        else:
            out[name] = hashlib.sha256(repr(value).encode()).hexdigest()
    return out


def fingerprint(*parts: Any) -> str:
    """A short digest of anything: bytes, tensors, numbers, sequences (for step fingerprints)."""
    h = hashlib.sha256()
    for part in parts:
        if hasattr(part, "detach"):
            h.update(tensor_digest(part).encode())
        elif isinstance(part, bytes | bytearray):
            h.update(bytes(part))
        else:
            h.update(repr(part).encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


def _fingerprint_value(value: Any) -> Any:
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, str | int | bool) or value is None:
        return value
    return fingerprint(value)


def checkpoint_dir_from_env(default: str | None = None) -> str | None:
    """The local directory behind ``SPOTCHAOS_CHECKPOINT_URI`` (``file://`` URIs), else ``default``."""
    uri = os.environ.get(ENV_CHECKPOINT_URI)
    if not uri:
        return default
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    if parsed.scheme == "":
        return uri
    return default


def memory_peaks() -> dict[str, int | None]:
    """Peak resident memory of this process and, when torch uses CUDA, peak GPU memory (bytes).

    Reported at checkpoints and at the end, so a preempted attempt still tells its peak.
    """
    peaks: dict[str, int | None] = {"max_rss": None, "gpu_max_allocated": None}
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peaks["max_rss"] = rss if sys.platform == "darwin" else rss * 1024  # KiB on Linux, bytes on macOS
    except (ImportError, OSError):
        pass
    torch = sys.modules.get("torch")  # never import torch just to ask
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            peaks["gpu_max_allocated"] = int(torch.cuda.max_memory_allocated())
    except Exception:  # a broken CUDA runtime must not break the trainer's checkpoint
        pass
    return peaks


class StepHold:
    """Wait after the planned step until the harness has delivered its fault.

    A fault sent when the harness *sees* a step lands wherever the job has got to by then: on a
    job with millisecond steps, several steps later, and elsewhere on every run. Holding the job
    right after it reports the planned step, before its next one, makes the landing exact: a
    SIGKILL finds exactly that many steps done, a SIGTERM's handler runs while the job waits, a
    cloud notice is up before the job's next look. Any other step costs one comparison.

    The harness made two FIFOs in its own folder: the job announces on ``held`` and waits on
    ``release``. Whatever goes wrong there (the harness gone, a FIFO missing) ends the wait at
    once, and the wait never outlasts ``seconds``: a hold can delay the job, never stop it.
    """

    def __init__(self, at: int, folder: str, seconds: float, phase: str | None = None) -> None:
        self.at: int | None = at
        self.folder = folder
        self.seconds = seconds
        self.phase = phase  # a fault planned inside a phase (``sigterm@7/eval``) holds there instead
        self._announced = False

    @classmethod
    def from_env(cls, rank: int = 0, restart: int | None = None) -> StepHold | None:
        """The hold the harness armed for this process, or None (another rank holds; a worker
        group torchrun restarted reaches the step again after the fault and must not wait)."""
        at, folder = os.environ.get(ENV_HOLD_AT), os.environ.get(ENV_HOLD_DIR)
        if not at or not folder or restart not in (None, 0):
            return None
        if rank != int(os.environ.get(ENV_HOLD_RANK) or 0):
            return None
        try:
            seconds = float(os.environ.get(ENV_HOLD_SECONDS) or 30.0)
            return cls(int(at), folder, seconds, os.environ.get(ENV_HOLD_PHASE) or None)
        except ValueError:
            return None

    def announce(self, step: int) -> None:
        """Say the job holds after ``step`` before the step's event (or line) is written, when it
        will: the harness delivers the fault on reading the event, so the announcement is already
        there to read and the record says the fault landed on a held job (written after the event,
        a kill in between left a job that held recorded as one that did not)."""
        if self.phase is None and self._due(step):
            self._announced = _announce(self.folder, step)

    def announce_in_phase(self, name: str, step: int | None) -> None:
        """:meth:`announce` for the start of phase ``name``, before its begin event."""
        if name == self.phase and step is not None and self._due(step):
            self._announced = _announce(self.folder, step)

    def wait(self, step: int) -> None:
        """Hold after ``step`` if it is the planned one, or the first step after it (a restart that
        resumed past the planned step is preempted at its first); once per process."""
        if self.phase is None:
            self._hold_once(step)

    def wait_in_phase(self, name: str, step: int | None) -> None:
        """Hold at the start of phase ``name`` if it is the planned one and the job has reported
        the planned step (or a later one) before entering it; once per process."""
        if name == self.phase and step is not None:
            self._hold_once(step)

    def _due(self, step: int) -> bool:
        return self.at is not None and step >= self.at and not self._announced

    def _hold_once(self, step: int) -> None:
        if self.at is None or step < self.at:
            return
        self.at = None
        if self._announced or _announce(self.folder, step):
            _wait_for_release(self.folder, self.seconds)


class CheckpointHold:
    """Wait after each checkpoint of the reference run while the harness copies the checkpoint
    folder: a later plan whose first fault comes after that checkpoint starts from the copy (a
    real resume) instead of training the reference's prefix again. Held, the job writes nothing
    more, so the copy is the folder exactly as that checkpoint left it. Armed only in the
    reference run, on rank 0; like the step hold it delays the job at most ``seconds``."""

    def __init__(self, folder: str, seconds: float) -> None:
        self.folder = folder
        self.seconds = seconds

    @classmethod
    def from_env(cls, rank: int = 0, restart: int | None = None) -> CheckpointHold | None:
        folder = os.environ.get(ENV_SNAPSHOT_HOLD_DIR)
        if not folder or rank != 0 or restart not in (None, 0):
            return None
        try:
            return cls(folder, float(os.environ.get(ENV_HOLD_SECONDS) or 30.0))
        except ValueError:
            return None

    def wait(self, step: int) -> None:
        if _announce(self.folder, step):
            _wait_for_release(self.folder, self.seconds)


def _announce(folder: str, step: int) -> bool:
    """Write ``STEP PID`` on the harness's ``held`` FIFO; False where it is not the harness's (gone,
    or never made): then there is nothing to wait for."""
    try:
        announce = os.open(os.path.join(folder, HOLD_HELD), os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(announce, f"{step} {os.getpid()}\n".encode())
        finally:
            os.close(announce)
    except OSError:
        return False
    return True


def _wait_for_release(folder: str, seconds: float) -> None:
    """Wait for a byte on the harness's ``release`` FIFO, at most ``seconds``."""
    try:
        release = os.open(os.path.join(folder, HOLD_RELEASE), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return  # not the harness's FIFO (gone): nothing to wait for
    try:
        # a signal's handler (SIGTERM) runs during the wait, which then goes on (PEP 475)
        if select.select([release], [], [], seconds)[0]:
            os.read(release, 1)
    except OSError:
        pass
    finally:
        os.close(release)


class Probe:
    """Appends contract events for one attempt of one run.

    Without ``SPOTCHAOS_EVENTS`` the probe is disabled and every call is a cheap no-op, so a
    trainer can keep its probe calls in production.
    """

    def __init__(
        self, path: str | None, *, run_id: str = "", attempt: int = 0, rank: int = 0, restart: int | None = None
    ) -> None:
        self.path = path
        self.run_id = run_id
        self.attempt = attempt
        self.rank = rank
        self.restart = restart  # torchrun's restart count of the worker group; None outside torchrun
        self._fd: int | None = None
        self._last_step: int | None = None  # the last step reported: where a phase begins
        self._hold: StepHold | None = None
        self._checkpoint_hold: CheckpointHold | None = None
        if path:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._hold = StepHold.from_env(rank, restart)
            self._checkpoint_hold = CheckpointHold.from_env(rank, restart)

    @classmethod
    def from_env(cls) -> Probe:
        """Build a probe from the contract's environment variables."""
        return cls(
            os.environ.get(ENV_EVENTS) or None,
            run_id=os.environ.get(ENV_RUN_ID, ""),
            attempt=int(os.environ.get(ENV_ATTEMPT, "0") or 0),
            rank=int(os.environ.get(ENV_RANK) or os.environ.get(ENV_TORCH_RANK) or 0),
            restart=int(os.environ[ENV_TORCH_RESTARTS]) if os.environ.get(ENV_TORCH_RESTARTS) else None,
        )

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def emit(self, event: str, **fields: Any) -> None:
        """Write one event line. Public so trainers can add their own event kinds."""
        if self._fd is None:
            return
        record = {"event": event, "t": time.time(), "rank": self.rank, **fields}
        if self.restart is not None:
            record["restart"] = self.restart
        line = json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n"
        os.write(self._fd, line.encode())

    def start(self, **info: Any) -> None:
        """The trainer is up: the harness measures start-up latency and hang detection from here."""
        self.emit("start", schema=EVENT_SCHEMA_VERSION, pid=os.getpid(), run_id=self.run_id, **info)

    def step(
        self,
        step: int,
        loss: Any,
        *,
        seconds: float | None = None,
        fingerprints: Mapping[str, Any] | None = None,
    ) -> None:
        """Step ``step`` (0-based, global) finished with ``loss``.

        ``fingerprints`` are optional values that must also be identical in a resumed run (the
        learning rate, a digest of the batch's sample ids, of the RNG state): when the loss
        diverges, the harness names which of them diverged with it, which is usually the cause.
        """
        # the crash-point hook (an audit hook, when the harness installed one) counts file-system events
        # from here too: a crash point "after step S" is the same moment of a save from any start
        sys.audit(STEP_AUDIT_EVENT, int(step))
        fields: dict[str, Any] = {"step": int(step), "loss": loss_to_hex(loss)}
        if seconds is not None:
            fields["seconds"] = float(seconds)
        if fingerprints:
            fields["fp"] = {str(k): _fingerprint_value(v) for k, v in fingerprints.items()}
        if self._hold is not None:
            self._hold.announce(int(step))
        self.emit("step", **fields)
        self._last_step = int(step)
        if self._hold is not None:
            self._hold.wait(int(step))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The job is inside phase ``name`` (``"eval"``, ``"save"``, ``"data"``, ``"warmup"``): a
        plan can land its fault there (``sigterm@7/eval``: inside the first eval phase after step
        7), held at the phase's start as a step's fault is held after the step. Real notices come
        during evaluation or a save, not only between steps; the phase's begin and end events tell
        the report where the fault landed.

            with probe.phase("eval"):
                evaluate(model)
        """
        if self._hold is not None:
            self._hold.announce_in_phase(str(name), self._last_step)
        self.emit("phase", name=str(name), state="begin", step=self._last_step)
        if self._hold is not None:
            self._hold.wait_in_phase(str(name), self._last_step)
        try:
            yield
        finally:
            self.emit("phase", name=str(name), state="end", step=self._last_step)

    def checkpoint(
        self,
        step: int,
        *,
        seconds: float,
        nbytes: int,
        uri: str,
        reason: str = "periodic",
        caveat: str | None = None,
    ) -> None:
        """A checkpoint holding the state *after* step ``step`` is durable at ``uri``.

        ``reason`` is ``periodic`` or ``preemption`` (written because of SIGTERM). ``caveat``: what
        the trainer knows this checkpoint lacks (no RNG state, written mid-step); the verdict gives
        it as the cause when a resume from it diverges.
        """
        self.emit(
            "checkpoint",
            step=int(step),
            seconds=float(seconds),
            bytes=int(nbytes),
            uri=uri,
            reason=reason,
            memory=memory_peaks(),
            **({"caveat": str(caveat)} if caveat else {}),
        )
        if self._checkpoint_hold is not None:
            self._checkpoint_hold.wait(int(step))

    def checkpoint_failed(self, step: int, *, seconds: float, reason: str) -> None:
        """A checkpoint of the state after ``step`` was given up after ``seconds`` (storage kept
        refusing or was too slow) and training goes on; the previous durable checkpoint stays the
        newest. Lets the harness tell a job that copes with a storage storm from one that hangs."""
        self.emit("checkpoint_failed", step=int(step), seconds=float(seconds), reason=str(reason))

    def notice(self, signum: int) -> None:
        """The trainer received a preemption notice (call it from the SIGTERM handler).

        Optional, but it lets the harness tell "the signal never reached the trainer" (a shell as
        a container's PID 1) from "the trainer got it and was too slow".
        """
        self.emit("notice", signal=int(signum))

    def resume(self, from_step: int, uri: str, *, caveat: str | None = None, data_caveat: str | None = None) -> None:
        """Training continues after step ``from_step``, restored from ``uri``; ``caveat`` as for
        :meth:`checkpoint`, of this resume. ``data_caveat``: one about the data's position or order
        (a loader the framework restarts from its first batch), given as the cause only where the
        batches differ: a job that skips the trained batches itself makes it moot."""
        said = {"caveat": str(caveat)} if caveat else {}
        if data_caveat:
            said["data_caveat"] = str(data_caveat)
        self.emit("resume", from_step=int(from_step), uri=uri, **said)

    def rollback(self, skipped_uri: str, reason: str) -> None:
        """A checkpoint newer than the one resumed from was skipped because it did not verify."""
        self.emit("rollback", skipped_uri=skipped_uri, reason=reason)

    def removed(self, uri: str) -> None:
        """The checkpoint at ``uri`` was deleted by the job (its rotation). Optional: it lets the
        harness name a rotation that deleted the last complete checkpoint before a newer one was
        durable (an asynchronous save deleting older checkpoints when the save is handed off)."""
        self.emit("removed", uri=uri)

    def logger(self, run_id: str) -> None:
        """The experiment logger's run this process writes to (a W&B or MLflow run id). Optional:
        a resume that opens a new run splits the dashboard, and the harness says so."""
        self.emit("logger", run_id=str(run_id))

    def logged(self, step: int) -> None:
        """The step the logger was just given (``wandb.log(..., step=step)``). Optional: after a
        resume from step S a logged step at or before S means the logger's counter began again."""
        self.emit("logged", step=int(step))

    def best(self, score: float, *, step: int, mode: str = "min") -> None:
        """The checkpoint kept as best was just replaced by the one after ``step``, of ``score``
        (``mode``: "min" or "max", which is better). Optional: a resumed job that forgot the best
        score replaces the best with a worse one, and the harness says so."""
        self.emit("best", score=float(score), step=int(step), mode="max" if mode == "max" else "min")

    def final(self, tensors: Mapping[str, Any], *, step: int) -> None:
        """Training finished after step ``step``; ``tensors`` are the weights (and any state) to compare."""
        self.emit("final", step=int(step), digests=tensor_digests(tensors), memory=memory_peaks())
        target = os.environ.get(ENV_FINAL_TENSORS)
        if target:
            import torch

            torch.save({k: v.detach().cpu() for k, v in tensors.items() if hasattr(v, "detach")}, target)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

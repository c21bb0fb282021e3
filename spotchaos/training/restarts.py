"""Why a restart failed: the checkpoint a kill tore, or a resume flag with nothing to resume.

A restart that exits non-zero before its first step is a finding of the plan that preempted the
attempt before it, not an accident: a bare ``torch.save`` killed half-way leaves a torn file
where the only copy was, and a ``--resume`` flag given before the first checkpoint exists makes
many scripts stop. This module looks at what the kill left (without loading any of it: size and
archive structure only) and says which, naming the file, the fault and the fix.
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

from ..config.jobs import JobSpec
from ..faults import traits
from ..safety.safefs import UnsafeFile, open_beneath
from .state.formats import PICKLE_MAGIC, TORCH_SUFFIXES, ZIP_MAGIC
from .trajectory import Attempt, FaultRecord


def fault_text(fault: FaultRecord) -> str:
    """``sigkill after step 7`` / ``crash before open-write checkpoints/ckpt.pt (file-system event 9)``."""
    if traits(fault.fault).armed_by_environment:
        return f"crash {fault.detail}"
    return f"{fault.fault} after step {fault.observed_step}"


def torn_files(job: JobSpec, checkpoints: Path) -> list[tuple[str, str]]:
    """(name, what is wrong) for each file the job's checkpoint glob matches that is not a whole
    ``torch.save`` archive: empty, or a zip without its central directory (cut short)."""
    pattern = job.log.checkpoints if job.log is not None else None
    if pattern is None:
        return []
    torn = []
    for path in sorted(checkpoints.glob(pattern)):
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue  # a link is never followed
            fd = open_beneath(checkpoints, path.relative_to(checkpoints))
        except (OSError, UnsafeFile):
            continue
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                torn.append((path.name, "0 bytes"))
                continue
            head = f.read(4)
            f.seek(0)
            if not path.name.lower().endswith(TORCH_SUFFIXES) and head != ZIP_MAGIC:
                continue  # safetensors, JSON, a format of the job's own: not a torch.save archive to judge
            try:
                zipfile.ZipFile(f).close()
            except zipfile.BadZipFile:
                if head[:1] != PICKLE_MAGIC:  # a legacy pickle cannot be told whole from torn without loading
                    torn.append((path.name, f"{size} bytes, not a whole torch.save archive (cut short)"))
    return torn


def diagnose(
    job: JobSpec, attempt: Attempt, previous: Attempt, checkpoints: Path, resume_argv: list[str] | None
) -> str:
    """One message for a restart (``attempt``) that exited non-zero before its first step, after
    the fault ``previous`` received; ``resume_argv`` is what it was told to resume with (None:
    it was started fresh)."""
    fault = previous.fault
    after = f", the restart after {fault_text(fault)}," if fault is not None else ", a restart,"
    head = f"attempt {attempt.index}{after} exited with status {attempt.exit_code} before its first step"
    damage = previous.damage
    if damage is not None and damage.applied and damage.makes_unloadable:  # the harness's own, on purpose
        touched = Path(damage.checkpoint).name + (f"/{damage.file}" if damage.file else "")
        return (
            f"{head}: the planned damage ({damage.fault} on {touched}"
            + (f", {damage.detail}" if damage.detail else "")
            + ") made the restart fail instead of roll back: verify a checkpoint before loading it (checksums "
            "written after the save) and resume from the newest one that verifies, saying so (probe.rollback)"
            + _stderr(attempt)
        )
    torn = torn_files(job, checkpoints)
    glob = job.log.checkpoints if job.log is not None else None
    if torn:
        names = "; ".join(f"{name} is {what}" for name, what in torn)
        where = "inside its write" + (
            f" ({fault.detail})" if fault is not None and traits(fault.fault).armed_by_environment else ""
        )
        return (
            f"{head}: torn checkpoint — {names}: the kill landed {where}, and the script writes the checkpoint in "
            "place (a bare torch.save to its final name), so the kill destroyed the only copy. Write to a temporary "
            "file in the same folder, fsync it, and os.replace it into place (or keep the previous checkpoint until "
            f"the new one is whole){_stderr(attempt)}"
        )
    if resume_argv is not None and glob is not None and not any(checkpoints.glob(glob)):
        asked = " ".join(job.resume_args) if job.resume_args and not job.resume_command else "resume_command"
        return (
            f"{head}: it was started with {asked!r} but no checkpoint matching {glob!r} existed yet (the fault came "
            "before the first checkpoint), and the script cannot resume without one. Set "
            f"resume_if_exists = {glob!r} in the job so such a restart starts fresh, or make the script start "
            f"fresh when there is nothing to resume{_stderr(attempt)}"
        )
    return f"{head}{_stderr(attempt)}"


def _stderr(attempt: Attempt, count: int = 8) -> str:
    from .multirank.torchrun import rank_errors  # a torchrun job's last lines are its agent's banner, not the cause

    died = rank_errors(attempt.stderr_tail)
    if died:
        return f"\n  the ranks died with: {died}"
    lines = [line for line in attempt.stderr_tail.splitlines() if line.strip()][-count:]
    return "\n  stderr (last lines):\n" + ("\n".join("    " + line for line in lines) or "    (empty)")

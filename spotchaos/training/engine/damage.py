"""Checkpoint damage between attempts: the newest durable checkpoint the run reported, inside the
run's own directory, changed by the plan's fault (never a file the harness did not create, never
through a link the job made)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from ...errors import JobError
from ...faults import CHECKPOINT_FAULTS, CheckpointSet, Damage
from ...safety.safefs import UnsafeFile
from ..trajectory import Attempt


def _durable_checkpoints(attempts: list[Attempt], root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint the run reported durable that still exists inside ``root``,
    oldest first (``root`` is absolute). Anything outside the run's own directory is never a target.

    A reported path is normalised as text, never resolved: resolving would follow the links the
    job made (``ckpt-5 -> /home/user``) and take their targets for checkpoints."""
    found: dict[Path, int] = {}
    for attempt in attempts:
        for event in attempt.of_kind("checkpoint"):
            parsed = urlparse(event["uri"])
            path = Path(os.path.normpath(unquote(parsed.path) or "."))
            if parsed.scheme == "s3":
                raise OutsideCheckpoint(
                    f"checkpoint {event['uri']} is in S3: damaging S3 objects between attempts is not supported yet"
                )
            if (
                parsed.scheme not in ("", "file")
                or not path.is_absolute()
                or not path.is_relative_to(root)
                or path == root
            ):
                raise OutsideCheckpoint(
                    f"the job reported checkpoint {event['uri']} outside the run's own directory {root.as_uri()} "
                    "(SPOTCHAOS_CHECKPOINT_URI): spotchaos damages only checkpoints its run created, so it refuses"
                )
            found[path] = event["step"]
    return sorted(((step, path) for path, step in found.items() if os.path.lexists(path)), key=lambda sp: sp[0])


class OutsideCheckpoint(JobError):
    """A checkpoint fault was asked for a checkpoint the harness did not create."""


class DamageRefused(JobError):
    """A checkpoint fault could not change the checkpoint (read-only, a full disk)."""


def damage_newest(fault_name: str, pick: float, attempts: list[Attempt], root: Path) -> Damage:
    """Apply a checkpoint fault to the newest durable checkpoint of this run, between attempts."""
    root = Path(os.path.abspath(root))  # once, as text: never resolved (that would follow the job's links)
    durable = _durable_checkpoints(attempts, root)
    if not durable:
        return Damage(fault_name, "", applied=False, detail="no durable checkpoint yet")
    # the previous checkpoint is one of an earlier step: a second copy of the newest step (Lightning's
    # last.ckpt beside epoch=E-step=S.ckpt) holds the same bytes, and swapping it in changes nothing
    newest_step, newest = durable[-1]
    checkpoints = CheckpointSet((*(path for step, path in durable if step < newest_step), newest), root)
    checkpoints.verify()  # UnsafeCheckpoint: a link or a special file in it, and nothing is touched
    try:
        damage = CHECKPOINT_FAULTS[fault_name].apply(checkpoints, pick)
    except ValueError as exc:
        return Damage(fault_name, str(checkpoints.newest), applied=False, detail=str(exc))
    except UnsafeFile:
        raise
    except OSError as exc:  # read-only checkpoints (the job chmod-ed them), a full disk: nothing was changed
        where = Path(exc.filename).name if isinstance(exc.filename, str) else checkpoints.newest.name
        raise DamageRefused(
            f"{fault_name} could not be applied to checkpoint {checkpoints.newest.name} ({where}: "
            f"{exc.strerror or exc}): the job left its checkpoints unwritable for the harness's user, so this "
            "plan tests nothing; nothing was changed (make them writable, or leave this fault out of the plan)"
        ) from None
    damage.damaged_step = durable[-1][0]
    if damage.makes_unloadable:
        damage.expected_resume = durable[-2][0] if len(durable) > 1 else None
    else:
        damage.expected_resume = durable[-1][0]
    return damage

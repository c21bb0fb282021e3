"""Checkpoint faults never act by path: a link the job swaps in after the check is never followed,
and a checkpoint the harness cannot change is one clear error that changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

import pytest

from spotchaos.errors import JobError
from spotchaos.faults import CHECKPOINT_FAULTS, CheckpointSet
from spotchaos.safety.safefs import UnsafeFile
from spotchaos.training.engine.damage import DamageRefused, damage_newest
from spotchaos.training.trajectory import Attempt

PATH_FAULTS = ["delete-manifest", "corrupt-manifest", "drop-file", "delete-newest", "swap-older", "truncate-zero"]


def _tree_digest(top: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(top.rglob("*")):
        digest.update(str(path.relative_to(top)).encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _checkpoints(root: Path) -> CheckpointSet:
    paths = []
    for step in (4, 8):
        folder = root / f"ckpt-{step:08d}"
        (folder / "shards").mkdir(parents=True)
        (folder / "shards" / "model.pt").write_bytes(bytes(range(256)) * 8)
        (folder / "manifest.json").write_text('{"files": {"shards/model.pt": {"sha256": "0123abcd"}}}')
        paths.append(folder)
    (root / "latest").write_text("ckpt-00000008\n")
    return CheckpointSet(tuple(paths), root)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    (victim / "shards").mkdir(parents=True)
    (victim / "shards" / "model.pt").write_bytes(b"the user's own weights")
    (victim / "manifest.json").write_text('{"files": {"shards/model.pt": {"sha256": "feedbeef"}}}')
    return victim


@pytest.mark.unit
@pytest.mark.parametrize("fault", PATH_FAULTS)
def test_a_link_swapped_in_after_the_check_is_never_followed(tmp_path, fault):
    """The race a helper of the job wins: the newest checkpoint folder becomes a link to a folder
    outside the run between ``verify()`` and the fault. The fault refuses it; the victim is as it was."""
    victim = _victim(tmp_path)
    before = _tree_digest(victim)
    checkpoints = _checkpoints(tmp_path / "run")
    checkpoints.verify()
    newest = checkpoints.newest
    newest.rename(newest.with_name("moved-away"))
    newest.symlink_to(os.path.relpath(victim, newest.parent))  # ../../victim
    with pytest.raises(UnsafeFile, match="symbolic link"):
        CHECKPOINT_FAULTS[fault].apply(checkpoints, 0.5)
    assert _tree_digest(victim) == before
    assert newest.is_symlink()  # nothing was made in the link's place either


@pytest.mark.unit
def test_a_helper_flipping_a_link_in_and_out_never_reaches_the_victim(tmp_path):
    """The same race for real: a thread swaps the newest folder for a link and back as fast as it
    can while every path-acting fault runs against it, 40 times each."""
    victim = _victim(tmp_path)
    before = _tree_digest(victim)
    root = tmp_path / "run"
    stop = threading.Event()
    swapped = 0

    def flip(newest: Path) -> None:
        nonlocal swapped
        aside, link = newest.with_name("aside"), newest.with_name("link")
        while not stop.is_set():
            try:
                os.symlink(os.path.relpath(victim, newest.parent), link)
                os.rename(newest, aside)
                os.rename(link, newest)  # the link is in place
                os.rename(newest, link)
                os.rename(aside, newest)  # the real folder is back
                os.unlink(link)
                swapped += 1
            except OSError:
                pass  # a fault removed or replaced the folder meanwhile: try again

    outcomes: set[str] = set()
    for fault in PATH_FAULTS:
        for _ in range(40):
            for leftover in (root, tmp_path / "aside", tmp_path / "link"):
                if leftover.is_symlink() or leftover.is_file():
                    leftover.unlink()
            if root.exists():
                shutil.rmtree(root)
            checkpoints = _checkpoints(root)
            stop.clear()
            racer = threading.Thread(target=flip, args=(checkpoints.newest,))
            racer.start()
            try:
                CHECKPOINT_FAULTS[fault].apply(checkpoints, 0.5)
                outcomes.add("applied")
            except (UnsafeFile, OSError, ValueError):  # a fault the race spoilt; never one that followed the link
                outcomes.add("refused")
            finally:
                stop.set()
                racer.join()
    assert _tree_digest(victim) == before
    assert swapped > 0 and outcomes == {"applied", "refused"}  # the race was really run both ways


def _make_read_only(top: Path) -> None:
    for path in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        path.chmod(stat.S_IMODE(path.lstat().st_mode) & ~0o222)


def _damage_as_an_unprivileged_user(workspace: Path) -> dict[str, str]:
    """Every fault against read-only checkpoints, in a forked child that drops root (root writes
    through permission bits; the job's user in CI does not): each fault's one-line outcome."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exec, so nothing needs to be readable by the unprivileged user
        try:
            os.close(read_end)
            if os.getuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            outcomes = {}
            for fault in CHECKPOINT_FAULTS:
                root = workspace / fault
                checkpoints = _checkpoints(root)
                events = [
                    {"event": "checkpoint", "step": step, "seconds": 0.1, "bytes": 1, "uri": path.as_uri()}
                    for step, path in zip((4, 8), checkpoints.paths, strict=True)
                ]
                attempt = Attempt(index=0, exit_code=0, wall_seconds=1, start_seconds=0.1, events=events)
                _make_read_only(root)
                root.chmod(0o555)
                try:
                    damage = damage_newest(fault, 0.5, [attempt], root)
                    outcomes[fault] = f"applied: {damage.detail}"
                except DamageRefused as exc:
                    outcomes[fault] = f"refused: {exc}"
                except BaseException as exc:  # anything else is a bug the test reports
                    outcomes[fault] = f"crashed: {type(exc).__name__}: {exc}"
            os.write(write_end, json.dumps(outcomes).encode())
        except BaseException as exc:
            os.write(write_end, json.dumps({"child": f"{type(exc).__name__}: {exc}"}).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def workspace():
    """A folder the unprivileged child can write (pytest's own tmp folders are root's, 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="spotchaos-read-only-"))
    folder.chmod(0o777)
    yield folder
    for path in folder.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755)
    shutil.rmtree(folder)


def test_read_only_checkpoints_are_one_clear_error_and_nothing_is_left_behind(workspace):
    outcomes = _damage_as_an_unprivileged_user(workspace)
    assert set(outcomes) == set(CHECKPOINT_FAULTS)
    for fault, outcome in outcomes.items():
        assert outcome.startswith("refused: "), (fault, outcome)
        assert "\n" not in outcome and "could not be applied" in outcome and "nothing was changed" in outcome
        root = workspace / fault
        assert sorted(p.name for p in root.iterdir()) == ["ckpt-00000004", "ckpt-00000008", "latest"], fault
        assert (root / "ckpt-00000008" / "shards" / "model.pt").read_bytes() == bytes(range(256)) * 8, fault
        assert (root / "latest").read_text() == "ckpt-00000008\n"
    assert issubclass(DamageRefused, JobError)

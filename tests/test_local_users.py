"""Another local user of the same machine: spotchaos's folders under the shared temp directory, the
leftover reaper's records and the hold's FIFOs are the session's own, and what another user plants
there is refused or ignored, never acted on. As root (CI) the attacks are made as ``nobody``."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from spotchaos.host.leftovers import LiveJobs
from spotchaos.probe import HOLD_HELD, HOLD_RELEASE
from spotchaos.safety.safefs import NotPrivate, private_dir
from spotchaos.training.engine.hold import Hold

from .helpers import is_alive

ROOT_USER = os.getuid() == 0
NOBODY = pwd.getpwnam("nobody").pw_uid


def someone_elses_folder(tmp_path: Path) -> Path:
    """A folder of another user's: made and given to ``nobody`` as root, else one of root's."""
    if not ROOT_USER:
        return Path("/usr/share")
    folder = tmp_path / "planted"
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY, -1)
    return folder


@pytest.mark.unit
def test_a_folder_another_user_made_first_is_refused_naming_its_owner(tmp_path):
    planted = someone_elses_folder(tmp_path)
    with pytest.raises(NotPrivate, match=r"belongs to (nobody|root) \(uid \d+\)") as caught:
        private_dir(planted)
    assert str(planted) in str(caught.value)
    below = planted / "live" if ROOT_USER else planted
    with pytest.raises(NotPrivate, match="belongs to"):  # as an ancestor it is refused too
        private_dir(below / "deeper")


@pytest.mark.unit
def test_a_folder_others_can_write_or_a_link_is_refused(tmp_path):
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    with pytest.raises(NotPrivate, match=r"writable by others \(mode 777\)"):
        private_dir(open_folder)
    with pytest.raises(NotPrivate, match="without the sticky bit"):
        private_dir(open_folder / "live")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(NotPrivate, match="a symbolic link, not a folder"):
        private_dir(tmp_path / "link" / "live")
    made = private_dir(tmp_path / "mine" / "live")
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700


def _forged_entry(live: Path, record: str) -> None:
    dead = live / "999999999-1"  # a pytest process that no longer runs
    dead.mkdir(parents=True, mode=0o700)
    (dead / "forged.json").write_text(record)


def test_the_reaper_ends_no_process_on_a_records_word(tmp_path):
    """A record naming a process of this user that is no spotchaos job (its environment lacks the
    run's marker) ends nothing, even in a private folder; a scratch record naming a folder that is
    not this user's removes nothing."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        with open(f"/proc/{victim.pid}/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])
        live = tmp_path / "live"
        live.mkdir(mode=0o700)
        _forged_entry(live, f'{{"run_id": "abcdef123456", "pid": {victim.pid}, "start": {started}}}')
        assert LiveJobs(live).reap() == []
        time.sleep(0.2)
        assert is_alive(victim.pid), "the reaper killed a process group on a record's word"
    finally:
        victim.kill()
        victim.wait()


def test_a_reaper_folder_another_user_planted_ends_nothing_and_says_whose_it_is(tmp_path):
    planted = someone_elses_folder(tmp_path)
    if ROOT_USER:  # the attacker's own record, in the attacker's folder
        _forged_entry(planted, '{"run_id": "x", "scratch": "/tmp/spotchaos-tmp-victim"}')
    with pytest.raises(NotPrivate, match="belongs to"):
        LiveJobs(planted).reap()


def test_a_holds_fifos_are_the_jobs_user_only(tmp_path):
    # beside the shared temp directory's other folders, reachable by anyone up to the hold's own
    parent = Path(tempfile.mkdtemp(prefix="spotchaos-test-"))
    parent.chmod(0o755)
    hold = Hold(parent / "hold", 3)
    try:
        assert (hold.folder.stat().st_mode & 0o777) == 0o700
        for name in (HOLD_HELD, HOLD_RELEASE):
            assert ((hold.folder / name).stat().st_mode & 0o777) == 0o600, name
        if ROOT_USER:  # another local user tries to release the held job early
            for name in (HOLD_RELEASE, HOLD_HELD):
                tried = subprocess.run(
                    ["/bin/sh", "-c", 'exec 3>"$1" && echo opened', "sh", str(hold.folder / name)],
                    user="nobody",
                    capture_output=True,
                    text=True,
                    cwd="/",
                    timeout=10,
                )
                assert "opened" not in tried.stdout and "denied" in tried.stderr.lower(), (name, tried.stderr)
    finally:
        hold.close()
        shutil.rmtree(parent)


def test_a_containers_numeric_user_owns_its_hold(tmp_path):
    """Only root can give a file away: as another user the hold's creation fails, one OSError."""
    if not ROOT_USER:
        with pytest.raises(PermissionError):
            Hold(tmp_path / "hold", 3, owner=NOBODY)
        return
    hold = Hold(tmp_path / "hold", 3, owner=NOBODY)
    try:
        assert hold.folder.stat().st_uid == NOBODY
        assert all((hold.folder / name).stat().st_uid == NOBODY for name in (HOLD_HELD, HOLD_RELEASE))
    finally:
        hold.close()

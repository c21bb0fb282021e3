"""The one way the harness opens files the job could have touched: no link followed anywhere on
the way, regular files only, one name for a file it will change, bounded reads."""

from __future__ import annotations

import os
import time

import pytest

from spotchaos.safety.redact import SecretMatcher, redact_files
from spotchaos.safety.safefs import (
    UnsafeFile,
    copy_contents,
    create_new,
    links_below,
    open_beneath,
    read_bounded,
    regular_files,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "run"
    (root / "ckpt").mkdir(parents=True)
    (root / "ckpt" / "model.pt").write_bytes(b"weights")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.pt").write_bytes(b"precious")
    return root, outside


def test_a_link_anywhere_on_the_path_is_refused(tree):
    root, outside = tree
    os.symlink(outside, root / "linked")  # a folder in the middle of the path
    os.symlink(outside / "model.pt", root / "ckpt" / "link.pt")  # the file itself
    with pytest.raises(UnsafeFile, match="linked is a symbolic link"):
        open_beneath(root, "linked/model.pt")
    with pytest.raises(UnsafeFile, match=r"link.pt is a symbolic link \(link.pt -> .*outside/model.pt\)"):
        open_beneath(root, "ckpt/link.pt")
    with pytest.raises(UnsafeFile, match="not a path below"):
        open_beneath(root, "../outside/model.pt")
    os.close(open_beneath(root, "ckpt/model.pt"))  # a plain file below the root opens


def test_hard_links_fifos_and_devices_are_refused(tree):
    root, outside = tree
    os.link(outside / "model.pt", root / "ckpt" / "hard.pt")
    with pytest.raises(UnsafeFile, match=r"hard-linked \(2 names\)"):
        open_beneath(root, "ckpt/hard.pt", os.O_RDWR, single_link=True)
    os.mkfifo(root / "ckpt" / "pipe")
    with pytest.raises(UnsafeFile, match="is a FIFO"):  # and it did not block
        open_beneath(root, "ckpt/pipe")
    found = dict(links_below(root / "ckpt"))
    assert set(found) == {root / "ckpt" / "hard.pt", root / "ckpt" / "pipe"}
    assert regular_files(root / "ckpt") == [root / "ckpt" / "hard.pt", root / "ckpt" / "model.pt"]


def test_reads_are_bounded_and_missing_files_read_empty(tmp_path):
    log = tmp_path / "stderr.log"
    log.write_bytes(b"a" * 1000 + b"THE END")
    assert read_bounded(log, 7, tail=True) == b"THE END"
    assert read_bounded(log, 3) == b"aaa"
    assert read_bounded(tmp_path / "missing.log", 10) == b""


def test_new_files_refuse_anything_already_there_and_logs_are_rewritten_in_place(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / "stdout.log")
    with pytest.raises(UnsafeFile, match="already exists"):
        create_new(tmp_path / "stdout.log")
    assert victim.read_text() == "keep"
    with create_new(tmp_path / "stderr.log") as f:
        f.write(b"token=abc123secret\n")
    assert redact_files(tmp_path, SecretMatcher(["abc123secret"])) == ["stderr.log"]  # the link is never read
    assert (tmp_path / "stderr.log").read_text() == "token=[REDACTED]\n"
    assert victim.read_text() == "keep"


def test_a_copied_folder_keeps_every_files_and_folders_times_so_a_job_orders_its_checkpoints_as_before(tmp_path):
    """transformers 5.24.0 rotates a Trainer's checkpoints by modification time: a copy that stamped
    each folder with the time it was copied deleted the checkpoint a resumed run had just loaded
    (docs/frameworks.md). The copy keeps the times, folders' included, set after their entries."""
    source, target = tmp_path / "source", tmp_path / "target"
    for step, age in ((6, 300), (12, 200)):  # checkpoint-6 older than checkpoint-12, as written
        folder = source / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "model.pt").write_bytes(b"weights %d" % step)
        stamp = time.time_ns() - age * 10**9
        os.utime(folder / "model.pt", ns=(stamp, stamp))
        os.utime(folder, ns=(stamp, stamp))
    target.mkdir()
    copy_contents(source, target)
    for relative in ("checkpoint-6", "checkpoint-6/model.pt", "checkpoint-12", "checkpoint-12/model.pt"):
        assert os.stat(target / relative).st_mtime_ns == os.stat(source / relative).st_mtime_ns, relative
    assert (target / "checkpoint-12" / "model.pt").read_bytes() == b"weights 12"

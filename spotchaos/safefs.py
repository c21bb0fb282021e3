"""Touching files the job under test could have made, without trusting them.

Everything under a run's directory is writable by the job, which is untrusted code: it may put a
symbolic link where the harness expects a checkpoint file (pointing at a file outside the run,
or, from inside a container, at a host path the container cannot even see), hard-link a file
from elsewhere, or swap its events file for a FIFO (an ``open()`` that never returns) or for a
link to ``/dev/zero`` (a read that never ends). So the harness opens such files only through
this module: every path component is opened relative to the one before it with ``O_NOFOLLOW``
(no link is followed anywhere on the way), only regular files are accepted (a FIFO or a device
is refused, and ``O_NONBLOCK`` keeps even the attempt from blocking), files the harness will
change must have one link only, and reads are bounded.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path, PurePath
from typing import Any

from .errors import JobError

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW


class UnsafeFile(JobError):
    """A file the harness was about to read or change is a link, a hard link or not a regular file."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def describe_link(path: Path) -> str:
    """``path -> target`` for a symbolic link (its text only: the link is never followed)."""
    try:
        return f"{path.name} -> {os.readlink(path)}"
    except OSError:
        return path.name


def _refuse(path: Path, what: str) -> UnsafeFile:
    return UnsafeFile(f"{path} is {what}: spotchaos never follows a link the job made, refused")


def open_beneath(root: Path, relative: str | PurePath, flags: int = os.O_RDONLY, *, single_link: bool = False) -> int:
    """An fd of ``root/relative``, opened without following a link anywhere below ``root``.

    ``relative`` must stay below ``root`` (no ``..``, not absolute). Raises :class:`UnsafeFile`
    when a component is a link, the file is not a regular file, or (``single_link``) another
    name links to the same file, and ``FileNotFoundError`` when it does not exist.
    """
    parts = PurePath(relative).parts
    if not parts or PurePath(relative).is_absolute() or ".." in parts:
        raise UnsafeFile(f"{relative}: not a path below {root}")
    path = root.joinpath(*parts)
    directory = os.open(root, _DIR_FLAGS)
    try:
        for index, part in enumerate(parts[:-1]):
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=directory)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link, or a file, where a folder should be
                    where = root.joinpath(*parts[: index + 1])
                    raise _refuse(where, _kind(os.lstat(where).st_mode)) from None
                raise
            os.close(directory)
            directory = inner
        try:
            fd = os.open(parts[-1], flags | _NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=directory)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refuse(path, f"a symbolic link ({describe_link(path)})") from None
            raise
    finally:
        os.close(directory)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (single_link and info.st_nlink != 1):
        os.close(fd)
        what = _kind(info.st_mode) if not stat.S_ISREG(info.st_mode) else f"hard-linked ({info.st_nlink} names)"
        raise _refuse(path, what)
    os.set_blocking(fd, True)  # a regular file: blocking reads are bounded by its size
    return fd


def open_regular(path: Path, flags: int = os.O_RDONLY) -> int:
    """An fd of ``path``, refused unless its last component is a regular file (not a link)."""
    return open_beneath(path.parent, path.name, flags)


def read_bounded(path: Path, limit: int, *, tail: bool = False) -> bytes:
    """At most ``limit`` bytes of a regular file (its end with ``tail``); b"" when it is missing."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if tail:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - limit))
        return f.read(limit)


def read_text_bounded(path: Path, limit: int, *, tail: bool = False) -> str:
    return read_bounded(path, limit, tail=tail).decode("utf-8", "replace")


def log_tail(path: Path, limit: int) -> str:
    """The end of a log the job wrote, read without following a link or blocking on a FIFO; a
    refused file says why instead."""
    try:
        return read_text_bounded(path, limit, tail=True)
    except UnsafeFile as exc:
        return f"({exc})"


def last_lines(text: str, count: int = 8) -> str:
    """The last non-blank lines of ``text``, indented for an error message."""
    lines = [line for line in text.splitlines() if line.strip()][-count:]
    return "\n".join("    " + line for line in lines) or "    (empty)"


def links_between(root: Path, path: Path) -> Iterator[tuple[Path, str]]:
    """``root`` or the first folder from it down to ``path``'s parent that is not a real folder:
    a link in the middle of a path is followed by every ordinary file call."""
    folders = [root]
    for part in path.relative_to(root).parts[:-1]:
        folders.append(folders[-1] / part)
    for folder in folders:
        try:
            mode = os.lstat(folder).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode):
            yield folder, _kind(mode) + (f" ({describe_link(folder)})" if stat.S_ISLNK(mode) else "")
            return


def links_below(top: Path) -> Iterator[tuple[Path, str]]:
    """Every entry under ``top`` (``top`` included) that the harness must not touch: symbolic
    links, hard-linked files and anything that is not a regular file or a directory."""
    info = os.lstat(top)
    if not stat.S_ISDIR(info.st_mode):
        if not stat.S_ISREG(info.st_mode):
            yield top, _kind(info.st_mode) + (f" ({describe_link(top)})" if stat.S_ISLNK(info.st_mode) else "")
        elif info.st_nlink != 1:
            yield top, f"hard-linked ({info.st_nlink} names)"
        return
    with os.scandir(top) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            yield from links_below(Path(entry.path))


def regular_files(top: Path) -> list[Path]:
    """The regular files under ``top`` (itself, if it is one), sorted; links are never followed."""
    if not stat.S_ISDIR(os.lstat(top).st_mode):
        return [top]
    found: list[Path] = []
    for folder, dirs, files in os.walk(top, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder, name)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.lstat(path).st_mode):
                    found.append(path)
    return found


LOG_SUFFIXES = (".log", ".jsonl", ".out", ".err")
LOG_BYTES = 16 << 20


def captured_logs(root: Path, limit: int = LOG_BYTES) -> dict[str, str]:
    """Every log of a run directory (stdout, stderr, events, helper output) by relative name:
    regular files only, reached without a link, each read up to ``limit`` bytes."""
    found: dict[str, str] = {}
    if not root.is_dir():
        return found
    for path in regular_files(root):
        if path.suffix in LOG_SUFFIXES:
            with contextlib.suppress(UnsafeFile, OSError):
                found[str(path.relative_to(root))] = read_text_bounded(path, limit)
    return found


def rewrite_logs(root: Path, transform: Callable[[str], str]) -> list[str]:
    """Apply ``transform`` to every log under ``root`` (see :func:`captured_logs`), rewriting in
    place, through an fd that followed no link, the ones it changes; their relative names."""
    changed = []
    for name, text in captured_logs(root).items():
        new = transform(text)
        if new == text:
            continue
        with contextlib.suppress(UnsafeFile, OSError):
            fd = open_beneath(root, name, os.O_WRONLY | os.O_TRUNC)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
                f.write(new)
            changed.append(name)
    return changed


def create_new(path: Path) -> Any:
    """A new file opened for writing (binary): refused if anything, a link included, is already
    at ``path``, since the job can write beside it and may have put one there first."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    except FileExistsError:
        raise UnsafeFile(f"{path} already exists: the job wrote into the harness's own files, refused") from None
    return os.fdopen(fd, "wb")

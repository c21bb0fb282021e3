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
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path, PurePath
from typing import Any

from ..errors import JobError, SpotchaosError

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


def _parts(root: Path, relative: str | PurePath) -> tuple[str, ...]:
    parts = PurePath(relative).parts
    if not parts or PurePath(relative).is_absolute() or ".." in parts:
        raise UnsafeFile(f"{relative}: not a path below {root}")
    return parts


def _open_dir(name: str | Path, dir_fd: int | None, where: Path) -> int:
    """A folder's fd, opened without following a link: a link or a file there is refused."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link, or a file, where a folder should be
            try:
                mode = os.lstat(where).st_mode
                what = _kind(mode) + (f" ({describe_link(where)})" if stat.S_ISLNK(mode) else "")
                if stat.S_ISREG(mode):
                    what = "a file where a folder was expected"
            except OSError:
                what = "not a folder"
            raise _refuse(where, what) from None
        raise


class Folder:
    """A folder opened once, every component reached without following a link, and everything
    done below it through its fd (``dir_fd=``): nothing is resolved by path again, so a link the
    job swaps in after the harness looked is never followed (no check-then-act race).

    A context manager: the fd is closed on leaving.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, root: Path) -> Folder:
        """``root`` as a folder; ``root`` itself must not be a link."""
        root = Path(root)
        return cls(_open_dir(root, None, root), root)

    def folder(self, relative: str | PurePath) -> Folder:
        parts = _parts(self.path, relative)
        fd = self.fd
        try:
            for index, part in enumerate(parts):
                inner = _open_dir(part, fd, self.path.joinpath(*parts[: index + 1]))
                if fd != self.fd:
                    os.close(fd)
                fd = inner
        except BaseException:
            if fd != self.fd:
                os.close(fd)
            raise
        return Folder(fd, self.path.joinpath(*parts))

    def _parent(self, relative: str | PurePath) -> tuple[Folder, str]:
        parts = _parts(self.path, relative)
        if len(parts) == 1:
            return Folder(os.dup(self.fd), self.path), parts[0]
        return self.folder(PurePath(*parts[:-1])), parts[-1]

    def open_file(self, relative: str | PurePath, flags: int = os.O_RDONLY, *, single_link: bool = False) -> int:
        """An fd of a regular file below this folder (see :func:`open_beneath`)."""
        parent, name = self._parent(relative)
        path = parent.path / name
        with parent:
            try:
                fd = os.open(name, flags | _NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=parent.fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise _refuse(path, f"a symbolic link ({describe_link(path)})") from None
                raise
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (single_link and info.st_nlink != 1):
            os.close(fd)
            what = _kind(info.st_mode) if not stat.S_ISREG(info.st_mode) else f"hard-linked ({info.st_nlink} names)"
            raise _refuse(path, what)
        os.set_blocking(fd, True)  # a regular file: blocking reads are bounded by its size
        return fd

    def create_file(self, relative: str | PurePath, mode: int = 0o644) -> int:
        """A new file below this folder, for writing: refused if anything, a link included, is there."""
        parent, name = self._parent(relative)
        with parent:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode, dir_fd=parent.fd)

    def mode(self, relative: str | PurePath) -> int:
        """The entry's own mode (a link's, never its target's)."""
        parent, name = self._parent(relative)
        with parent:
            return os.stat(name, dir_fd=parent.fd, follow_symlinks=False).st_mode

    def unlink(self, relative: str | PurePath) -> None:
        """Remove one name; a link is removed itself, its target never touched."""
        parent, name = self._parent(relative)
        with parent:
            os.unlink(name, dir_fd=parent.fd)

    def remove(self, relative: str | PurePath) -> None:
        """Remove a file, a link or a whole folder below this one, through fds only (shutil's
        fd-based tree removal: links inside are removed, never followed)."""
        parent, name = self._parent(relative)
        with parent:
            if stat.S_ISDIR(os.stat(name, dir_fd=parent.fd, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=parent.fd)
            else:
                os.unlink(name, dir_fd=parent.fd)

    def rename(self, source: str | PurePath, target: str | PurePath) -> None:
        """Rename within this folder's tree (the target replaced: an empty folder or a file)."""
        from_parent, from_name = self._parent(source)
        with from_parent:
            to_parent, to_name = self._parent(target)
            with to_parent:
                os.rename(from_name, to_name, src_dir_fd=from_parent.fd, dst_dir_fd=to_parent.fd)

    def copy_tree(self, source: str | PurePath, target: str | PurePath) -> None:
        """Copy the folder ``source`` to the new name ``target`` (which must not exist), reading
        and creating everything through fds; a link or a special file inside is refused."""
        to_parent, to_name = self._parent(target)
        with self.folder(source) as src, to_parent:
            os.mkdir(to_name, 0o755, dir_fd=to_parent.fd)
            with to_parent.folder(to_name) as dst:
                _copy_into(src, dst)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy_into(src: Folder, dst: Folder) -> None:
    for entry in sorted(os.scandir(src.fd), key=lambda e: e.name):
        info = entry.stat(follow_symlinks=False)
        mode = info.st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(entry.name, 0o755, dir_fd=dst.fd)
            with src.folder(entry.name) as inner_src, dst.folder(entry.name) as inner_dst:
                _copy_into(inner_src, inner_dst)
                os.utime(inner_dst.fd, ns=(info.st_atime_ns, info.st_mtime_ns))  # after its entries changed it
        elif stat.S_ISREG(mode):
            copy_file(src, entry.name, dst, entry.name)
        else:
            raise _refuse(src.path / entry.name, _kind(mode))


def copy_file(src: Folder, name: str, dst: Folder, target: str, mode: int = 0o644) -> None:
    """One regular file of ``src`` copied to the new name ``target`` in ``dst``: read and created
    through the folders' fds, a link at either end refused. Its access and modification times go
    with it, as ``cp -p`` keeps them: a job may order its checkpoints by them (transformers rotates
    a Trainer's by modification time), and a copy must order them as the original did."""
    source = src.open_file(name)
    try:
        written = dst.create_file(target, mode)
        try:
            copy_bytes(source, written)
            info = os.fstat(source)
            os.utime(written, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(written)
    finally:
        os.close(source)


def copy_bytes(source: int, target: int) -> None:
    """Copy one open file into another: ``copy_file_range`` first, which shares the blocks where
    the file system can (a reflink on XFS and Btrfs: a gigabyte checkpoint copied in no time and
    no space), else plain reads and writes."""
    try:
        while os.copy_file_range(source, target, 1 << 30):
            pass
        return
    except (AttributeError, OSError):
        os.lseek(source, 0, os.SEEK_SET)
        os.lseek(target, 0, os.SEEK_SET)
        os.ftruncate(target, 0)
    while chunk := os.read(source, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view) :]


def copy_contents(source: Path, target: Path) -> None:
    """Copy everything in the folder ``source`` into the existing folder ``target``, both reached
    without following a link and everything done through fds; a link or a special file inside
    ``source`` is refused, and nothing already in ``target`` is replaced. Every file and folder
    below keeps its access and modification times (``copy_file``); ``target`` itself is the caller's."""
    with Folder.open(source) as src, Folder.open(target) as dst:
        _copy_into(src, dst)


def listing(top: Path) -> tuple[tuple[str, int, int, int], ...]:
    """What a folder holds, to tell whether it changed: (path, size, modification time, inode) of
    every entry below ``top``, no link followed; a folder's size is 0 (its bytes are its files')."""
    found = []
    for folder, dirs, files in os.walk(top, followlinks=False):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = os.path.join(folder, name)
            with contextlib.suppress(FileNotFoundError):
                info = os.lstat(path)
                size = 0 if stat.S_ISDIR(info.st_mode) else info.st_size
                found.append((os.path.relpath(path, top), size, info.st_mtime_ns, info.st_ino))
    return tuple(found)


def open_beneath(root: Path, relative: str | PurePath, flags: int = os.O_RDONLY, *, single_link: bool = False) -> int:
    """An fd of ``root/relative``, opened without following a link anywhere below ``root``.

    ``relative`` must stay below ``root`` (no ``..``, not absolute). Raises :class:`UnsafeFile`
    when a component is a link, the file is not a regular file, or (``single_link``) another
    name links to the same file, and ``FileNotFoundError`` when it does not exist.
    """
    _parts(root, relative)
    with Folder.open(root) as folder:
        return folder.open_file(relative, flags, single_link=single_link)


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
    """The regular files under ``top`` (itself, if it is one), sorted; links are never followed
    (``top`` itself a link is refused)."""
    mode = os.lstat(top).st_mode
    if stat.S_ISLNK(mode):
        raise _refuse(top, f"a symbolic link ({describe_link(top)})")
    if not stat.S_ISDIR(mode):
        return [top] if stat.S_ISREG(mode) else []
    found: list[Path] = []
    for folder, dirs, files in os.walk(top, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder, name)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.lstat(path).st_mode):
                    found.append(path)
    return found


def create_new(path: Path) -> Any:
    """A new file opened for writing (binary): refused if anything, a link included, is already
    at ``path``, since the job can write beside it and may have put one there first."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    except FileExistsError:
        raise UnsafeFile(f"{path} already exists: the job wrote into the harness's own files, refused") from None
    return os.fdopen(fd, "wb")


class NotPrivate(SpotchaosError):
    """A folder spotchaos keeps its own state in (under a shared temp directory) could be changed by
    another local user: its records would then be that user's word, so it is refused."""


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check_component(path: Path, info: os.stat_result, *, own: bool) -> None:
    """An ancestor may be root's or this user's, and writable by others only with the sticky bit
    (``/tmp``: nobody else may rename or remove what is this user's in it); a folder of
    spotchaos's own must be this user's and writable by nobody else."""
    me = os.getuid()
    if own:
        if info.st_uid != me:
            raise NotPrivate(
                f"{path} belongs to {_owner_name(info.st_uid)}, not to this user ({_owner_name(me)}): "
                "another local user made it first; spotchaos will not trust what is in it (remove it, or set TMPDIR)"
            )
        if info.st_mode & 0o022:
            raise NotPrivate(
                f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}): spotchaos keeps its state "
                "only in a folder nobody else can write (chmod 700 it, or remove it)"
            )
        return
    if info.st_uid not in (0, me):
        raise NotPrivate(f"{path} belongs to {_owner_name(info.st_uid)}: spotchaos will not keep its state below it")
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise NotPrivate(
            f"{path} is writable by others without the sticky bit (mode {stat.S_IMODE(info.st_mode):o}): "
            "another user could swap spotchaos's folders below it"
        )


def private_dir(path: Path) -> Path:
    """``path`` made (0700) where missing and proven private, component by component through file
    descriptors: no component is a link, every ancestor is root's or this user's and writable by
    others only where sticky, and ``path`` itself is this user's and writable by nobody else.
    Anything else is one line naming the folder and its owner (:class:`NotPrivate`)."""
    path = Path(os.path.abspath(path))
    fd = os.open("/", _DIR_FLAGS)
    try:
        current = Path("/")
        for name in path.parts[1:]:
            current = current / name
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    kind = _kind(os.lstat(name, dir_fd=fd).st_mode)
                    says = f"{current} is {kind}, not a folder: spotchaos will not keep its state there"
                    raise NotPrivate(says) from None
                raise
            os.close(fd)
            fd = child
            _check_component(current, os.fstat(fd), own=current == path)
    finally:
        os.close(fd)
    return path

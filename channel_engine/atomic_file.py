"""Durable metadata writes: temp file in the same directory, fsync, rename, fsync the directory;
the durable rename that keeps a damaged or stray file aside (never deleting it); and the
opening of a `.lock` file, which moves aside anything but a regular file in its place (a
directory, a dangling symlink: no process can hold that as its lock) and names the path in
UnusableFileError when the lock file still cannot be opened (permissions, read-only)."""
from __future__ import annotations

import os
from pathlib import Path

from channel_engine.errors import UnusableFileError
from channel_engine.filenames import STRAY_SUFFIX, TMP_SUFFIX, aside_path


def fsync_directory(directory: Path) -> None:
    """Make a directory's entries (creates, renames, deletes) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_directory(path.parent)


def move_aside(path: Path, suffix: str) -> Path:
    """Rename `path` to a free `<name><suffix>` beside it, durably; return the new path."""
    target = aside_path(path, suffix)
    os.rename(path, target)
    fsync_directory(path.parent)
    return target


def open_lock_file(path: Path, what: str) -> tuple[int, Path | None]:
    """Open (creating) the lock file `path` for flock: (descriptor, where a non-regular file
    in its place was moved aside, or None). UnusableFileError names `what` and the path when
    it cannot be opened."""
    moved = None
    try:
        if os.path.lexists(path) and not path.is_file():
            moved = move_aside(path, STRAY_SUFFIX)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644), moved
    except OSError as exc:
        raise UnusableFileError(path, what, exc) from exc

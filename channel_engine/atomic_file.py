"""Durable metadata writes: temp file in the same directory, fsync, rename, fsync the directory."""
from __future__ import annotations

import os
from pathlib import Path

from channel_engine.filenames import TMP_SUFFIX


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

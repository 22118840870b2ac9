"""The disk guard (Flume's minimumRequiredSpace): refuse a write before it can fill a disk.

Flume checks usable space on every log operation; Weir checks before a put
writes anything, on every directory the put would touch, and reports which
directory is short and by how much. Free space is what an unprivileged writer
may use (statvfs f_bavail), as the root reserve is not ours to spend.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from channel_engine.errors import DiskSpaceError

FreeSpace = Callable[[Path], int]


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged process may still write on the filesystem of `directory`."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def check_free_space(directories: Iterable[Path], required: int,
                     free_space: FreeSpace = free_bytes) -> None:
    """Raise DiskSpaceError for the first directory with less than `required` bytes free."""
    if required <= 0:
        return
    for directory in directories:
        free = free_space(directory)
        if free < required:
            raise DiskSpaceError(directory, free, required)

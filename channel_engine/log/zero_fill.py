"""ZeroFill: zeros kept written ahead of an append point, shared by a segment's .log
(segment_file.py) and the commit journal (queue/commit_journal.py).

Why zeros ahead at all is told in segment_file.py's module doc (fsync durability's
zero-fill ahead). This module owns the writing of them and what a failure does:

  * write(fd, start, end) writes zeros over [start, end) with as many pwrite(2) calls
    as it takes (pwrite may write less than asked), and returns where the zeros
    written end: `end`, or less when an OSError stopped it (the caller cuts the file
    back, or keeps what was written: zeros are preallocated space either way);
  * after a failure for want of space (ENOSPC, EDQUOT) no fill is tried until the
    filesystem has room for one again: allows() checks statvfs at most once every
    RETRY_SECONDS, so a full disk does not make every append take and give back up
    to a MiB. Any other error is retried at the next append.

Not thread-safe: the caller holds the lock that serialises its appends. Never raises
for the zeros: preallocation never refuses a put.
"""
from __future__ import annotations

import errno
import os
import time

RETRY_SECONDS = 1.0  # how often a fill stopped for want of space looks at free space
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_ZEROS = bytes(1 << 20)


def free_bytes_of(fd: int) -> int:
    """Bytes an unprivileged process may still write on the filesystem of `fd`."""
    stats = os.fstatvfs(fd)
    return stats.f_bavail * stats.f_frsize


class ZeroFill:
    """Writes zeros ahead for one file, and holds off after the disk was full (module doc)."""

    def __init__(self) -> None:
        self._no_space_at: float | None = None  # when a fill last failed for want of space

    def allows(self, fd: int, size: int) -> bool:
        """May a fill of `size` bytes be tried now?"""
        if self._no_space_at is None:
            return True
        now = time.monotonic()
        if now - self._no_space_at < RETRY_SECONDS:
            return False
        self._no_space_at = now
        try:
            if free_bytes_of(fd) < size:
                return False
        except OSError:
            return False
        self._no_space_at = None
        return True

    def write(self, fd: int, start: int, end: int) -> int:
        """Write zeros over [start, end); where the zeros written end (module doc)."""
        position = start
        try:
            while position < end:
                position += os.pwrite(fd, memoryview(_ZEROS)[:min(end - position, len(_ZEROS))],
                                      position)
        except OSError as exc:
            if exc.errno in NO_SPACE:
                self._no_space_at = time.monotonic()
        return position

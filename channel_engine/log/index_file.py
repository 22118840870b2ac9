"""IndexFile: what the offset index and the time index share (Kafka's AbstractIndex).

An index is derived data: a sparse table of fixed-size entries kept in memory
(array) and appended to a file. It is never trusted blindly: on every open its
shape is checked (whole entries, increasing) and its last entries against the
log, and it is rebuilt from the log when a check fails, and after an unclean
shutdown for every segment from the one holding the recovery point on; at use,
every entry a lookup lands on is checked against the batch it names and the
indexes are rebuilt when it is wrong (LogSegment.find_position, start_for_time).
Unlike Kafka's, Weir's index files are not preallocated or memory-mapped: the
file holds exactly the valid entries, which Kafka's tools read the same way.
An index is full at max_entries (max_bytes // entry size); is_full keeps one
slot for the time index's final entry, and the log rolls when either is full.

Not thread-safe for writers; the caller holds the log lock (and the segment's index
lock). Readers may look up concurrently with one appender (array reads and appends
are atomic under the GIL; a repair swaps the arrays whole).
"""
from __future__ import annotations

import os
from pathlib import Path

from channel_engine.errors import CorruptIndexError


class IndexFile:
    """A file of fixed-size entries plus its in-memory copy. Subclasses define the entry."""

    ENTRY_SIZE = 0

    def __init__(self, path: Path, max_entries: int, writable: bool) -> None:
        self.path = path
        self.max_entries = max_entries
        self.writable = writable
        self._fd: int | None = None
        self._dirty = False

    # -- file plumbing -----------------------------------------------------
    def _open_fd(self) -> int:
        if self._fd is None:
            if not self.writable:
                raise PermissionError(f"{self.path}: index opened read-only")
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def _read_file(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise CorruptIndexError(self.path, "missing") from None

    def _write_entry(self, entry: bytes) -> None:
        if self.writable:
            os.write(self._open_fd(), entry)
            self._dirty = True

    def _rewrite(self, data: bytes) -> None:
        """Replace the file's content with `data` (after a rebuild or truncation)."""
        if not self.writable:
            return
        fd = self._open_fd()
        os.ftruncate(fd, 0)
        if data:
            os.write(fd, data)
        self._dirty = True

    def create_empty(self) -> None:
        """Create the file with no entries (a new segment's index)."""
        self._rewrite(b"")

    @property
    def is_open(self) -> bool:
        """True while a descriptor is held (a sealed segment's indexes are closed)."""
        return self._fd is not None

    def _truncate_file(self, entries: int) -> None:
        if self.writable:
            os.ftruncate(self._open_fd(), entries * self.ENTRY_SIZE)
            self._dirty = True

    def flush(self) -> None:
        """fsync the index file if it changed since the last flush."""
        if self._dirty and self._fd is not None:
            os.fsync(self._fd)  # the caller holds the log lock: no append races with this
            self._dirty = False

    def close(self) -> None:
        """Close the file descriptor (the in-memory entries stay usable)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def rename(self, new_path: Path) -> None:
        """Rename the file (to .deleted); an open descriptor stays valid."""
        if self.path.exists():
            os.rename(self.path, new_path)
        self.path = new_path

    def delete(self) -> None:
        """Close and remove the file."""
        self.close()
        self.path.unlink(missing_ok=True)

    # -- to be provided by subclasses -----------------------------------------
    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def is_full(self) -> bool:
        """True when one slot is left: kept for the final entry of roll and close."""
        return len(self) >= self.max_entries - 1

    @property
    def size_bytes(self) -> int:
        """Bytes the valid entries take on disk."""
        return len(self) * self.ENTRY_SIZE

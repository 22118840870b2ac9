"""The supervisor's log files, rotated by size: each child's stdout and stderr come to the
log writer (scripts/log_writer.py) through a pipe, and one thread per child writes them,
line by line, to $WEIR_VAR_DIR/log/<name>.log.

Rotation (as Python's RotatingFileHandler and logrotate name the files): before a line
that would take <name>.log past WEIR_LOG_MAX_BYTES (10 MiB), <name>.log.N-1 becomes
<name>.log.N, ..., <name>.log becomes <name>.log.1, and the line starts a new <name>.log;
WEIR_LOG_BACKUPS (5) rotated files are kept, the oldest is deleted. The writer is the only
one to write the file, so rotation loses no line and has no copytruncate window; a file is
never larger than the limit, except by a single line longer than the limit itself.

A file written by a process of its own (nginx's access log) cannot be rotated so:
rotate_reopened() renames it and then asks the writer to reopen its file (nginx: SIGUSR1),
as logrotate's postrotate does; lines written between the two land in <name>.log.1.

A write error (a full disk, the log dir removed) never stops the reading of a child's pipe
(the child would meet a broken pipe at its next write): RotatingLog drops and counts the
lines until a retry works, then says how many bytes went missing, and why, in the log.

Not thread-safe per file: one PipeLog (one thread) writes a RotatingLog.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHUNK = 65536  # bytes read from a child's pipe at a time


@dataclass(frozen=True)
class Rotation:
    """How big a log file may grow and how many rotated ones are kept."""

    max_bytes: int = 10 * 1024 * 1024  # WEIR_LOG_MAX_BYTES
    backups: int = 5  # WEIR_LOG_BACKUPS


def shift(path: Path, backups: int) -> None:
    """Rename path to path.1, path.1 to path.2, ...; the one past `backups` goes."""
    for n in range(backups - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{n + 1}"))
    if path.exists():
        path.replace(path.with_name(f"{path.name}.1"))


def lines_of(data: bytes) -> list[bytes]:
    """data cut after each newline (the last piece kept when it has none)."""
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


class RotatingLog:
    """An appended log file rotated by size before a line would take it past the limit.

    Writing never raises: a child's log must not end because the disk filled for a while
    (ENOSPC, EDQUOT, EIO, the log dir removed). On an OSError the file is closed, the lines
    are counted as dropped, and the lines coming until a retry (after 0.1 s, doubling up
    to RETRY_MAX_S) are dropped and counted too; the first write that works again (the file
    reopened) starts with one line "weir: N bytes of this log dropped: <error>".
    """

    RETRY_MIN_S, RETRY_MAX_S = 0.1, 5.0

    def __init__(self, path: Path, rotation: Rotation, fd: int | None = None) -> None:
        """Append to `path`, or to `fd` when given (`path` opened by the caller, who can
        so tell it cannot be opened before starting a child)."""
        self.path, self.rotation = path, rotation
        self.fd = -1  # -1: closed (after a failure, until a retry reopens it)
        self.size = 0
        self.written = 0  # bytes written in all, to count those of a failed write
        self.dropped = 0  # bytes dropped since the last write that worked
        self.error = ""  # why the first of them was dropped
        self.retry_s = 0.0
        self.retry_at = 0.0
        if fd is None:
            self._open()  # raises: a log that cannot be opened is the caller's to report
        else:
            self.fd, self.size = fd, os.fstat(fd).st_size

    def _open(self) -> None:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.fd).st_size

    def write(self, lines: list[bytes]) -> None:
        """Append whole lines (each ends with a newline, or is a last partial line), in as
        few writes as the rotations between them allow; on an error, drop and count them."""
        total = sum(len(line) for line in lines)
        if self.dropped and time.monotonic() < self.retry_at:
            self.dropped += total
            return
        start = -1  # self.written when the lines' first byte was due
        try:
            if self.fd < 0:
                self._open()
            if self.dropped:
                self._write([f"weir: {self.dropped} bytes of this log dropped: "
                             f"{self.error}\n".encode()])
                self.dropped, self.retry_s = 0, 0.0
            start = self.written
            self._write(lines)
        except OSError as exc:
            self._failed(exc, total - (self.written - start if start >= 0 else 0))

    def _write(self, lines: list[bytes]) -> None:
        batch: list[bytes] = []
        size = self.size
        for line in lines:
            if size and size + len(line) > self.rotation.max_bytes:
                self._append(batch)
                self._rotate()
                batch, size = [], 0
            batch.append(line)
            size += len(line)
        self._append(batch)

    def _append(self, batch: list[bytes]) -> None:
        view = memoryview(b"".join(batch))
        while view:  # a write to a file may be short (a signal, a full disk's last bytes)
            n = os.write(self.fd, view)
            view = view[n:]
            self.size += n
            self.written += n

    def _rotate(self) -> None:
        fd, self.fd = self.fd, -1  # should shift or open fail, no closed fd is kept
        os.close(fd)
        shift(self.path, self.rotation.backups)
        self._open()

    def _failed(self, exc: OSError, dropped: int) -> None:
        if not self.dropped:
            self.error = str(exc)
        self.dropped += dropped
        self.close()  # reopened at the retry: the file may be another by then
        self.retry_s = min(max(2 * self.retry_s, self.RETRY_MIN_S), self.RETRY_MAX_S)
        self.retry_at = time.monotonic() + self.retry_s

    def close(self) -> None:
        """Close the file (when open)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:  # EIO from a last deferred write: that file is done anyway
                pass


class PipeLog:
    """A thread copying a child's output pipe, line by line, into its RotatingLog and
    handing each line to `on_line` (the foreground view); ends at the pipe's end (every
    process holding its write end gone), then closes both and calls `on_end`."""

    def __init__(self, pipe_fd: int, log: RotatingLog,
                 on_line: Callable[[bytes], None] | None = None,
                 on_end: Callable[[], None] | None = None) -> None:
        self.pipe_fd, self.log, self.on_line, self.on_end = pipe_fd, log, on_line, on_end
        self.thread = threading.Thread(target=self._copy, name=f"log {log.path.name}",
                                       daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        pending = bytearray()
        try:
            while chunk := os.read(self.pipe_fd, CHUNK):
                pending += chunk
                end = pending.rfind(b"\n") + 1
                if not end and len(pending) >= self.log.rotation.max_bytes:
                    end = len(pending)  # a line longer than a file: written as it comes
                if end:
                    self._lines(lines_of(bytes(pending[:end])))
                    del pending[:end]
            if pending:
                self._lines([bytes(pending) + b"\n"])
        finally:
            os.close(self.pipe_fd)
            self.log.close()
            if self.on_end is not None:
                self.on_end()

    def _lines(self, lines: list[bytes]) -> None:
        self.log.write(lines)
        if self.on_line is not None:
            for line in lines:
                self.on_line(line)

    def join(self, timeout_s: float | None) -> None:
        """Wait until the child's last line is written (or timeout_s passes)."""
        self.thread.join(timeout_s)


def rotate_reopened(path: Path, rotation: Rotation, reopen: Callable[[], None]) -> bool:
    """Rotate a file another process writes when it has reached the limit: shift the files,
    then reopen() (that process opens `path` anew); True when it rotated."""
    try:
        if path.stat().st_size < rotation.max_bytes:
            return False
    except FileNotFoundError:
        return False
    shift(path, rotation.backups)
    reopen()
    return True

"""`export.lock` in a channel's home: one export job of a channel at a time.

    file                  what                                  who
    --------------------  ------------------------------------  -----------------------------
    <home>/export.lock    empty; an exclusive flock(2) on it    the export job (export.py),
                          means "an export job runs"            from before Spark starts
                                                                until the process exits

The job takes the lock without waiting: when another process holds it the job refuses
with ExportRunningError ("an export of channel 'orders' is already running"), writes
nothing and exits with EXIT_BUSY. The kernel drops a flock when its process dies, kill -9
included, so a dead job never leaves a stale lock; the file itself stays and means
nothing. (The appliance holds a lock of its own, `export-run.lock`, around the ExportRun
row it keeps of a job: appliance/exports.py.)

Concurrency contract: hold() is reentrant in the thread that holds the lock (main() takes
it for the whole run and Exporter.run takes it again; flock would refuse a second open
file of the same process), and refuses other threads as it refuses other processes.
"""
from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from channel_engine.errors import ExportRunningError

LOCK_FILE = "export.lock"
EXIT_BUSY = 75  # EX_TEMPFAIL: nothing was done, try again later

_held: dict[str, tuple[int, int]] = {}  # lock file -> (holding thread, depth)
_guard = threading.Lock()


@contextmanager
def hold(home: str | Path, channel: str | None = None) -> Iterator[None]:
    """Hold <home>/export.lock while the block runs; ExportRunningError if it is held.

    `channel` names the channel in the error (the home's path when None)."""
    path = Path(home) / LOCK_FILE
    key, me = os.path.realpath(path), threading.get_ident()
    with _guard:
        holder, depth = _held.get(key, (me, 0))
        if depth and holder == me:
            _held[key] = (me, depth + 1)
            fd = -1
        elif depth:
            raise ExportRunningError(channel or str(home), path)
        else:
            fd = _lock(path, channel or str(home))
            _held[key] = (me, 1)
    try:
        yield
    finally:
        with _guard:
            holder, depth = _held[key]
            if depth > 1:
                _held[key] = (holder, depth - 1)
            else:
                del _held[key]
                os.close(fd)  # closing the last descriptor releases the flock


def _lock(path: Path, channel: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ExportRunningError(channel, path) from None
    except BaseException:
        os.close(fd)
        raise
    return fd

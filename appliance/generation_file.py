"""The row generation file: a value every process of one appliance reads at each request and
any process replaces when a token or channel row changes (appliance/row_cache.py).

It lives in the var dir (`$WEIR_VAR_DIR/row-generation`), which every process of an
appliance shares (docker-compose mounts it into each service), as it shares the channels'
disks. Reading it is one pread of 20 bytes from the page cache, about a microsecond: no
network round trip per request, and no dependency on Redis being up. The page cache makes
it exact: once a replacement's pwrite has returned, every later read in any process on the
machine sees it.

Format (20 bytes, rewritten whole by each replacement):

    offset  size  field
    0       4     magic and version: b"WRG1"
    4       16    generation: 16 random bytes (hex digits), replaced on every change

A read that sees anything else (a file cut short, another magic, a read racing a write) is
a generation that matches no other: caches read under it are simply read again. Random
values, not a counter, so that a file removed and made again cannot bring back an old
generation.
"""
from __future__ import annotations

import logging
import os
import secrets
import threading
from pathlib import Path

MAGIC = b"WRG1"
SIZE = len(MAGIC) + 16
log = logging.getLogger(__name__)


class GenerationFile:
    """The generation file at `path`, opened at first use and kept open (a forked child
    reads and writes through its parent's descriptor: pread and pwrite share no file
    position). Every use of the descriptor holds the lock, so that reopening it (after the
    file was replaced: reopen_if_replaced) never closes a descriptor another thread is
    about to use, whose number a new file could have taken by then."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._failing = False  # logged once per run of failures, not per request

    def read(self) -> bytes | None:
        """The current generation; None when the file cannot be read (then nothing may be
        cached)."""
        try:
            with self._lock:
                value = os.pread(self._open(), SIZE, 0)
        except OSError as exc:
            self._failed(exc)
            return None
        self._failing = False
        if len(value) != SIZE or not value.startswith(MAGIC):
            return self.replace()  # new, cut short or damaged: a fresh generation
        return value

    def replace(self) -> bytes | None:
        """Write a new generation (every process reads rows again); None when it cannot be
        written."""
        value = MAGIC + secrets.token_hex(8).encode()
        try:
            with self._lock:
                os.pwrite(self._open(), value, 0)
        except OSError as exc:
            self._failed(exc)
            return None
        self._failing = False
        return value

    def reopen_if_replaced(self) -> None:
        """Open the file again when the path no longer names the file held open (removed,
        or replaced by a restore): a process holding the old one would never see another
        process's replacement. The generation watch calls this every tick."""
        with self._lock:
            if self._fd is None:
                return
            try:
                held, named = os.fstat(self._fd), os.stat(self.path)
                same = (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
            except OSError:
                same = False
            if not same:
                os.close(self._fd)
                self._fd = None  # the next use opens (and makes) the file at the path

    def _open(self) -> int:
        """The descriptor; caller holds the lock."""
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    def _failed(self, exc: OSError) -> None:
        if not self._failing:
            self._failing = True
            log.warning("row cache off: the generation file %s cannot be used (%s)",
                        self.path, exc)

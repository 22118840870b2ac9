"""HomeLock: the owner's hold on a channel home — `.lock`, taken with flock.

The first process to flock `<home>/.lock` owns the channel; a second would-be
owner gets ChannelLockedError (naming the holder the file records) and becomes
a client instead. A lock taken on a `.lock` unlinked meanwhile (by an open
letting go of a deleted channel) is dropped and taken again on the file there
now, so that two owners never share one home. An operator may delete a channel
and create another of the same name while a process has the old one open:
`replaced()` says so (the home's `.lock` is no longer the file held) and
`check()` then refuses writes with ChannelGoneError.

Concurrency: take() and release() run at open and close, in one thread; the
checks are safe from any thread (they only stat).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from channel_engine.atomic_file import open_lock_file
from channel_engine.errors import ChannelGoneError, ChannelLockedError
from channel_engine.queue.channel_config import CONFIG_FILE, ChannelConfig

LOCK_FILE = ".lock"


class HomeLock:
    """`.lock` in a channel's home, held with flock while the owner has it open."""

    def __init__(self, config: ChannelConfig) -> None:
        self.config = config
        self.path = config.home / LOCK_FILE
        self.fd = -1  # the locked file, while held
        self.identity = (0, 0)  # its (st_dev, st_ino): a held file's never change

    def take(self) -> list[str]:
        """Take `.lock`; return a line for the recovery report if a non-regular file in its
        place was moved aside (atomic_file.open_lock_file)."""
        path = self.path
        while True:
            fd, moved = open_lock_file(path, "the channel's lock file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown pid"
                os.close(fd)
                raise ChannelLockedError(self.config.home, holder) from None
            if _names_file(path, fd):
                break
            # the file was unlinked between our open and our flock (an open of a deleted
            # channel lets go of the lock file it made): a lock on it excludes no one
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode(), 0)
        held = os.fstat(fd)
        self.fd, self.identity = fd, (held.st_dev, held.st_ino)
        return [] if moved is None else [f"{path}: not a regular file, moved aside to {moved}; "
                                         "the engine writes a new one"]

    def check_not_deleted(self) -> None:
        """ChannelGoneError unless the home still holds channel.json (an open that may not
        create: the channel's directories are being or were removed)."""
        if not os.path.lexists(self.config.home / CONFIG_FILE):
            if self.fd >= 0:
                _unlink_if_same(self.path, self.fd)
            raise ChannelGoneError(f"channel {self.config.name!r}: {self.config.home} holds "
                                   f"no {CONFIG_FILE} (the channel was deleted); not "
                                   "recreated, nothing written")

    def replaced(self) -> bool:
        """Is the home's .lock no longer the file this owner holds? (An operator may delete
        a channel and create another of the same name while a process has the old open.)"""
        if self.fd < 0:
            return False
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (current.st_dev, current.st_ino) != self.identity  # one stat per commit

    def check(self) -> None:
        """ChannelGoneError if the home was deleted or replaced since the lock was taken."""
        if self.replaced():
            raise ChannelGoneError(f"channel {self.config.name!r}: {self.config.home} was "
                                   "deleted or replaced since this process opened it; "
                                   "nothing written")

    def release(self) -> None:
        """Let go of the lock (another process may own the channel now)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _names_file(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino)


def _unlink_if_same(path: Path, fd: int) -> None:
    """Unlink `path` if it is still the file open as `fd` (a lock file this open made in a
    home being removed: it must not keep the directory from going)."""
    with contextlib.suppress(OSError):
        current, held = os.stat(path), os.fstat(fd)
        if (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            path.unlink()

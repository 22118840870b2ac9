"""path_identity: the (st_dev, st_ino) a path names now, without reading its timestamps.

The commit path checks, once per append and once after each group fsync, that the
active segment's path still names the file the log holds open (segment_file.py's
`gone`). os.stat answers that, but it also reports the file's mtime and ctime, and on
Linux 6.13 and later (multigrain timestamps, on ext4, XFS, btrfs, tmpfs) a reported
timestamp marks the inode "queried": the next write to the file then takes a
fine-grained time instead of the coarse clock tick, so every write after a stat
changes the mtime, dirties the inode (a filesystem journal handle) and raises the
coarse clock's floor, so the log.state rewritten after each commit gets a new mtime
too. Measured on this project's ext4 disk (bench/fsync_cost.py): a stat of the file
before each 20 KB overwrite adds ~35-55 us to the fdatasync that follows, a third of
an fsync'd put of 100 events.

statx(2) with a mask of STATX_INO asks for no timestamp, and the kernel then leaves
the inode unmarked (fill_mg_cmtime), so writes keep coarse timestamps. st_dev is
always filled in (stx_dev_major/minor); the inode number is what the mask asks for
(a result whose stx_mask lacks it is asked again with os.stat).

Fallback: os.stat where statx cannot be called (not Linux, a libc without the
wrapper) or the kernel refuses it (ENOSYS: before 4.11; EPERM: a seccomp filter),
remembered for the process. Errors are os.stat's (FileNotFoundError for a missing
path, OSError naming the path otherwise).

Thread-safe: each call uses its own result buffer.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from collections.abc import Callable

AT_FDCWD = -100
STATX_INO = 0x100  # <linux/stat.h>: ask for stx_ino only, no timestamp
STATX_SIZE = 256  # sizeof(struct statx)
INO_AT = 32  # __u64 stx_ino
MASK_AT = 0  # __u32 stx_mask: what the kernel filled in
DEV_AT = 136  # __u32 stx_dev_major, __u32 stx_dev_minor
_INO = struct.Struct("=Q")
_MASK = struct.Struct("=I")
_DEV = struct.Struct("=II")
_FALLBACK_ERRNOS = (errno.ENOSYS, errno.EPERM)

Identity = tuple[int, int]  # (st_dev, st_ino)


def _load_statx() -> Callable[..., int] | None:
    """libc's statx wrapper, or None where there is none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name, use_errno=True).statx
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint,
                         ctypes.c_void_p)
    function.restype = ctypes.c_int
    return function


_statx = _load_statx()


def stat_identity(path: str | os.PathLike[str]) -> Identity:
    """(st_dev, st_ino) of `path` from os.stat (the fallback; reads the timestamps)."""
    found = os.stat(path)
    return found.st_dev, found.st_ino


def path_identity(path: str | os.PathLike[str]) -> Identity:
    """(st_dev, st_ino) of the file `path` names now, without marking its timestamps
    queried (module doc); os.stat's errors."""
    global _statx
    statx = _statx
    if statx is None:
        return stat_identity(path)
    buffer = ctypes.create_string_buffer(STATX_SIZE)
    if statx(AT_FDCWD, os.fsencode(path), 0, STATX_INO, buffer) == 0:
        if not _MASK.unpack_from(buffer, MASK_AT)[0] & STATX_INO:  # no inode number given
            return stat_identity(path)
        major, minor = _DEV.unpack_from(buffer, DEV_AT)
        return os.makedev(major, minor), _INO.unpack_from(buffer, INO_AT)[0]
    code = ctypes.get_errno()
    if code == errno.ENOSYS:
        _statx = None  # this kernel has none: never ask again
    if code in _FALLBACK_ERRNOS:
        return stat_identity(path)
    raise OSError(code, os.strerror(code), os.fspath(path))  # ENOENT: FileNotFoundError

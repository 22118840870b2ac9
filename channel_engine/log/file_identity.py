"""path_identity: the (st_dev, st_ino) a path names now, without reading its timestamps.

The commit path checks, before each append in policy durability and after each group
fsync in fsync durability (log_append.py), that the active segment's path still names
the file the log holds open (segment_file.py's
`gone`). os.stat answers that, but it also reports the file's mtime and ctime, and on
Linux 6.13 and later (multigrain timestamps, on ext4, XFS, btrfs, tmpfs) a reported
timestamp marks the inode "queried": the next write to the file then takes a
fine-grained time instead of the coarse clock tick, so every write after a stat
changes the mtime, dirties the inode (a filesystem journal handle) and raises the
coarse clock's floor, so the log.state rewritten after each commit gets a new mtime
too. Measured on this project's ext4 disk on Linux 6.18 (bench/fsync_cost.py, two runs
recorded in bench/README.md): a stat of the file before each 20 KB overwrite adds
26-61 us to the median write+fdatasync, 14-31% of the ~190 us a whole fsync'd put of
100 events may take (1.5x SQLite WAL FULL, measured in the same runs).

statx(2) with a mask of STATX_INO asks for no timestamp, and the kernel then leaves
the inode unmarked (fill_mg_cmtime), so writes keep coarse timestamps. st_dev is
always filled in (stx_dev_major/minor); the inode number is what the mask asks for
(a result whose stx_mask lacks it is asked again with os.stat).

The flags are AT_NO_AUTOMOUNT, as os.stat's stat(2): a path on an automount point
is not mounted by the check.

The call: the compiled module channel_engine/log/_statx.c where it was built (about 1 us),
else libc's statx through ctypes (about 4 us: the call, a buffer, three unpacks); the
same flags, mask and errors.

Fallback: os.stat where statx cannot be called (not Linux, a libc without the
wrapper) or the kernel refuses it (ENOSYS: before 4.11; EPERM: a seccomp filter,
which applies to the whole process), remembered for the process and logged.
Errors are os.stat's (FileNotFoundError for a missing path, OSError naming the path
otherwise, ValueError for a path holding a NUL byte).

Thread-safe: each call uses its own result buffer.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import struct
from collections.abc import Callable

logger = logging.getLogger(__name__)

AT_FDCWD = -100
AT_NO_AUTOMOUNT = 0x800  # <fcntl.h>: what stat(2) implies; statx needs it asked for
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
    """libc's statx wrapper, or None where there is none (logged)."""
    # the symbols the process already has (libc among them): find_library would run
    # ldconfig in a subprocess, and finds nothing in a minimal image
    try:
        function = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError) as exc:
        _log_fallback(f"no statx in this process's C library ({exc})")
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint,
                         ctypes.c_void_p)
    function.restype = ctypes.c_int
    return function


def _log_fallback(why: str) -> None:
    """Say once per process that segment identity checks use os.stat, and why."""
    logger.info("segment identity checks use os.stat, which marks file timestamps "
                "queried (fsync'd appends cost more on Linux 6.13+): %s", why)


_statx = _load_statx()
try:
    from channel_engine.log._statx import identity as _native
except ImportError:  # not built (no compiler at install, no statx in the C library)
    _native = None


def stat_identity(path: str | bytes | os.PathLike[str]) -> Identity:
    """(st_dev, st_ino) of `path` from os.stat (the fallback; reads the timestamps)."""
    found = os.stat(os.fsdecode(path))  # its errors name the path as text
    return found.st_dev, found.st_ino


def path_identity(path: str | bytes | os.PathLike[str]) -> Identity:
    """(st_dev, st_ino) of the file `path` names now, without marking its timestamps
    queried (module doc); os.stat's errors. A caller asking often passes the path encoded
    (os.fsencode) once: the encoding is a third of the call's cost."""
    global _statx, _native
    statx = _statx
    if statx is None:
        return stat_identity(path)
    name = os.fsencode(path)
    native = _native
    if native is not None:
        try:
            found: Identity | None = native(name)
        except OSError as exc:
            if exc.errno in _FALLBACK_ERRNOS:
                _statx = _native = None
                _log_fallback(f"statx refused: {os.strerror(exc.errno)}")
                return stat_identity(path)
            raise OSError(exc.errno, exc.strerror, os.fsdecode(path)) from None
        return found if found is not None else stat_identity(path)
    if b"\0" in name:  # c_char_p would cut it there and check another path
        raise ValueError("embedded null byte")
    buffer = ctypes.create_string_buffer(STATX_SIZE)
    if statx(AT_FDCWD, name, AT_NO_AUTOMOUNT, STATX_INO, buffer) == 0:
        if not _MASK.unpack_from(buffer, MASK_AT)[0] & STATX_INO:  # no inode number given
            return stat_identity(path)
        major, minor = _DEV.unpack_from(buffer, DEV_AT)
        return os.makedev(major, minor), _INO.unpack_from(buffer, INO_AT)[0]
    code = ctypes.get_errno()
    if code in _FALLBACK_ERRNOS:
        # no statx in this kernel, or a seccomp filter (whole-process): never ask again
        _statx = None
        _log_fallback(f"statx refused: {os.strerror(code)}")
        return stat_identity(path)
    raise OSError(code, os.strerror(code), os.fsdecode(path))  # ENOENT: FileNotFoundError

"""LogState: the `log.state` file of a partition directory.

Kafka keeps these facts in three places (recovery-point-offset-checkpoint and
log-start-offset-checkpoint per log dir, .kafka_cleanshutdown per broker); Weir
keeps them per partition in one small file, replaced atomically (temp file,
fsync, rename, fsync the directory).

    offset  size  field
    ------  ----  ------------------------------------------------------------
         0     4  magic             b"WLST"
         4     1  version           1
         5     1  flags             bit 0: clean shutdown
         6     2  reserved          0
         8     8  log_start_offset  int64 BE: first offset readers may see
        16     8  recovery_point    int64 BE: every offset below is on disk
        24     8  log_end_offset    int64 BE: next offset at the time of writing
        32     8  written_at_ms     int64 BE: wall clock, for operators
        40     4  crc               CRC-32C of bytes 0..39
    total 44 bytes

Rules: the clean flag is written only at close, after every segment is trimmed
and fsynced and the directory fsynced; a writer that opens the log rewrites the
file with the flag clear *before* loading segments, so a crash while loading
counts as unclean (KAFKA-10471). Offsets lie in [0, 2**62]. A file that fails its
checks (size, magic, version, CRC, offsets) is reported and
treated as absent: recovery then scans the whole log, which is slow but safe.
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass, replace
from pathlib import Path

import crc32c

from channel_engine.atomic_file import write_atomically
from channel_engine.errors import CorruptStateError

MAGIC = b"WLST"
VERSION = 1
FLAG_CLEAN = 0x01
BODY = struct.Struct(">4sBBHqqqq")
CRC = struct.Struct(">I")
SIZE = BODY.size + CRC.size
# No log gets near it (146 years at 10**9 events a second); a larger offset is damage, and
# trusting one would overflow int64 offsets at the next append.
MAX_OFFSET = 2**62
assert SIZE == 44


@dataclass(frozen=True)
class LogState:
    """What a partition log must remember between runs besides its segments."""

    log_start_offset: int = 0
    recovery_point: int = 0
    log_end_offset: int = 0
    clean_shutdown: bool = False
    written_at_ms: int = 0

    def with_(self, **changes: object) -> LogState:
        """Return a copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


def encode(state: LogState) -> bytes:
    """Serialise a LogState to its 44 bytes."""
    body = BODY.pack(
        MAGIC, VERSION, FLAG_CLEAN if state.clean_shutdown else 0, 0,
        state.log_start_offset, state.recovery_point, state.log_end_offset,
        state.written_at_ms or int(time.time() * 1000),
    )
    return body + CRC.pack(crc32c.crc32c(body))


def decode(data: bytes, path: Path | str = "log.state") -> LogState:
    """Parse a log.state file; raise CorruptStateError naming what is wrong."""
    if len(data) != SIZE:
        raise CorruptStateError(path, f"size {len(data)}, expected {SIZE}", min(len(data), SIZE))
    magic, version, flags, _, start, recovery, end, written = BODY.unpack_from(data)
    if magic != MAGIC:
        raise CorruptStateError(path, f"magic {magic!r}, expected {MAGIC!r}", 0)
    if version != VERSION:
        raise CorruptStateError(path, f"version {version} is not supported (expected {VERSION})",
                                4)
    (stored,) = CRC.unpack_from(data, BODY.size)
    if crc32c.crc32c(data[: BODY.size]) != stored:
        raise CorruptStateError(path, "CRC-32C mismatch", BODY.size)
    for name, offset, at in (("log_start_offset", start, 8), ("recovery_point", recovery, 16),
                             ("log_end_offset", end, 24)):
        if not 0 <= offset <= MAX_OFFSET:
            raise CorruptStateError(path, f"{name} {offset} outside [0, {MAX_OFFSET}]", at)
    return LogState(start, recovery, end, bool(flags & FLAG_CLEAN), written)


def read(path: Path) -> LogState | None:
    """Read the state file; None if it does not exist. Raises CorruptStateError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # a directory in its place, an I/O error
        raise CorruptStateError(path, f"cannot be read ({exc.strerror or exc})", 0) from exc
    return decode(data, path)


def write(path: Path, state: LogState) -> None:
    """Replace the state file atomically and durably."""
    write_atomically(path, encode(state))

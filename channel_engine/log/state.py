"""LogState: the `log.state` file of a partition directory.

Kafka keeps these facts in three places (recovery-point-offset-checkpoint and
log-start-offset-checkpoint per log dir, .kafka_cleanshutdown per broker); Weir
keeps them per partition in one small file, replaced atomically (temp file,
fsync, rename, fsync the directory), plus one fact Kafka does not need (a
replica refetches what a broker loses): the partition's committed end.

    offset  size  field
    ------  ----  ------------------------------------------------------------
         0     4  magic             b"WLST"
         4     1  version           2 (1 is still read: bytes 0..43 alone)
         5     1  flags             bit 0: clean shutdown
         6     2  reserved          0
         8     8  log_start_offset  int64 BE: first offset readers may see
        16     8  recovery_point    int64 BE: every offset below is on disk
        24     8  log_end_offset    int64 BE: next offset at the time of writing
        32     8  written_at_ms     int64 BE: wall clock, for operators
        40     4  crc               CRC-32C of bytes 0..39
    -- version 2: the committed-end record, also rewritten in place --------------
        44     8  committed_end     int64 BE: every offset below was committed
        52     4  end_crc           CRC-32C of bytes 44..51
    total 56 bytes (version 1: 44)

Rules: the clean flag is written only at close, after every segment is trimmed
and fsynced and the directory fsynced; a writer that opens the log rewrites the
file with the flag clear *before* loading segments, so a crash while loading
counts as unclean (KAFKA-10471). Offsets lie in [0, 2**62]. A file that fails its
checks (size, magic, version, either CRC, offsets) is reported and
treated as absent: recovery then scans the whole log, which is slow but safe.

The committed-end record (PartitionLog) is the end of the appends whose commit
returned, or is about to: rewritten in place, 12 bytes with one pwrite and no
fsync, after the group fsync in 'fsync' durability (every offset below is on
disk) and after each append in 'policy' durability (every offset below was
handed out); each atomic replace of the file carries it too. It is the only
record of a partition's end outside its active segment: the first batch of a
segment is never indexed (and later ones only every index_interval_bytes), a
single-partition put writes no commit journal record, and the other fields are
written at opens, closes, retention and recovery-point checkpoints only. A kill
keeps the page cache, so after a kill that destroyed the active segment the
loader still knows which offsets were committed: counted lost, never handed out
again (loader.py). The record lies in the file's first sector with the
fields above it, which it never changes: power loss keeps the old or the new
record whole (a sector is written whole), and a torn one would fail end_crc.
Written after the bytes it vouches for, it can run ahead of the disk only under
power loss in 'policy' durability, where those appends were acknowledged: their
loss is then counted, as it should be. A reader racing the in-place write may
see a CRC mismatch; it reads the file again later.
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
VERSION = 2
READABLE_VERSIONS = (1, 2)
FLAG_CLEAN = 0x01
BODY = struct.Struct(">4sBBHqqqq")
CRC = struct.Struct(">I")
END = struct.Struct(">q")  # committed_end, then its CRC
COMMITTED_END_AT = BODY.size + CRC.size  # where the in-place record starts
SIZES = {1: COMMITTED_END_AT, 2: COMMITTED_END_AT + END.size + CRC.size}
SIZE = SIZES[VERSION]
# No log gets near it (146 years at 10**9 events a second); a larger offset is damage, and
# trusting one would overflow int64 offsets at the next append.
MAX_OFFSET = 2**62
assert SIZE == 56 and SIZES[1] == 44


@dataclass(frozen=True)
class LogState:
    """What a partition log must remember between runs besides its segments.
    committed_end: None when read from a version 1 file, or not yet known when writing
    (encode then writes the end a clean log had, else the recovery point)."""

    log_start_offset: int = 0
    recovery_point: int = 0
    log_end_offset: int = 0
    clean_shutdown: bool = False
    written_at_ms: int = 0
    committed_end: int | None = None

    def with_(self, **changes: object) -> LogState:
        """Return a copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


def encode(state: LogState) -> bytes:
    """Serialise a LogState to its 56 bytes (version 2)."""
    body = BODY.pack(
        MAGIC, VERSION, FLAG_CLEAN if state.clean_shutdown else 0, 0,
        state.log_start_offset, state.recovery_point, state.log_end_offset,
        state.written_at_ms or int(time.time() * 1000),
    )
    committed = state.committed_end if state.committed_end is not None else (
        state.log_end_offset if state.clean_shutdown else state.recovery_point)
    return body + CRC.pack(crc32c.crc32c(body)) + encode_committed_end(committed)


def encode_committed_end(end: int) -> bytes:
    """The 12-byte committed-end record, written in place at COMMITTED_END_AT."""
    value = END.pack(end)
    return value + CRC.pack(crc32c.crc32c(value))


def decode(data: bytes, path: Path | str = "log.state") -> LogState:
    """Parse a log.state file (version 1 or 2); raise CorruptStateError naming what is
    wrong."""
    expected = SIZES.get(data[4], SIZE) if len(data) > 4 else SIZE
    if len(data) != expected:
        raise CorruptStateError(path, f"size {len(data)}, expected {expected}",
                                min(len(data), expected))
    magic, version, flags, _, start, recovery, end, written = BODY.unpack_from(data)
    if magic != MAGIC:
        raise CorruptStateError(path, f"magic {magic!r}, expected {MAGIC!r}", 0)
    if version not in READABLE_VERSIONS:
        raise CorruptStateError(path, f"version {version} is not supported (expected "
                                      f"{' or '.join(map(str, READABLE_VERSIONS))})", 4)
    (stored,) = CRC.unpack_from(data, BODY.size)
    if crc32c.crc32c(data[: BODY.size]) != stored:
        raise CorruptStateError(path, "CRC-32C mismatch", BODY.size)
    committed = None
    if version >= 2:
        (committed,) = END.unpack_from(data, COMMITTED_END_AT)
        (end_crc,) = CRC.unpack_from(data, COMMITTED_END_AT + END.size)
        if crc32c.crc32c(data[COMMITTED_END_AT:COMMITTED_END_AT + END.size]) != end_crc:
            raise CorruptStateError(path, "committed-end record: CRC-32C mismatch",
                                    COMMITTED_END_AT + END.size)
    for name, offset, at in (("log_start_offset", start, 8), ("recovery_point", recovery, 16),
                             ("log_end_offset", end, 24),
                             ("committed_end", committed, COMMITTED_END_AT)):
        if offset is not None and not 0 <= offset <= MAX_OFFSET:
            raise CorruptStateError(path, f"{name} {offset} outside [0, {MAX_OFFSET}]", at)
    return LogState(start, recovery, end, bool(flags & FLAG_CLEAN), written, committed)


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

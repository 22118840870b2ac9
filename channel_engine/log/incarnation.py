"""The `incarnation` file of a partition directory: which storage the partition's offsets
belong to (channel_engine/incarnations.py says why the drains need it; Kafka's topic ID,
KIP-516, is the model).

A partition directory as first made has no such file: its incarnation is ORIGINAL (so
the directories already on users' disks need no rewrite). A directory of a partition the
channel had, found missing and made again by a writable open (the operator's recreate of
vanished storage), gets one: a new id, and the offset the new incarnation starts at.

    offset  size  field
    ------  ----  ------------------------------------------------------------
         0     4  magic          b"WINC"
         4     1  version        1
         5     1  flags          bit 0: start pending (set by the open that made the
                                 directory, cleared once it knows the start offset)
         6     2  reserved       0
         8     8  start_offset   int64 BE: the first offset this incarnation hands out
                                 (0 while pending)
        16     8  made_at_ms     int64 BE: wall clock when the directory was made again
        24    16  id             the incarnation's id (a random UUID; shown as 32 hex)
        40     4  crc            CRC-32C of bytes 0..39
    total 44 bytes

Rules: written atomically (temp file, fsync, rename, fsync the directory). The open that
makes the directory makes it under a temp name (`<name>-<i>.tmp`), writes the file there
pending, and renames the directory into place before it loads or writes anything else
there, so no crash leaves the directory without its file; that open (or, after a crash,
the next one) sets the start offset once the checkpoint told where the partition goes on
(channel_recovery.py step 5), before any put: the log end then. A file that fails its
checks (size, magic, version, CRC) is CorruptStateError naming it: the open fails rather
than take the partition for another incarnation (move it aside by hand only knowing that
the partition then counts as its original storage). An engine older than this file moves
it aside as `incarnation.stray`.

Concurrency: written only by the partition's owner at its open; read by anyone.
"""
from __future__ import annotations

import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import crc32c

from channel_engine.atomic_file import write_atomically
from channel_engine.errors import CorruptStateError
from channel_engine.filenames import INCARNATION_FILE
from channel_engine.incarnations import ORIGINAL

MAGIC = b"WINC"
VERSION = 1
FLAG_PENDING = 0x01
BODY = struct.Struct(">4sBBHqq16s")
CRC = struct.Struct(">I")
SIZE = BODY.size + CRC.size
assert SIZE == 44


@dataclass(frozen=True)
class Incarnation:
    """A partition's incarnation: ORIGINAL (no file) or a recreate's (the table above)."""

    id: str
    start_offset: int = 0
    pending: bool = False
    made_at_ms: int = 0


ORIGINAL_INCARNATION = Incarnation(ORIGINAL)


def read(directory: Path) -> Incarnation:
    """The incarnation of the partition in `directory` (ORIGINAL without a file);
    CorruptStateError naming the file when it fails its checks."""
    path = directory / INCARNATION_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ORIGINAL_INCARNATION
    try:
        return decode(data, path)
    except CorruptStateError as exc:
        raise CorruptStateError(path, f"{exc.reason}: which storage the partition's offsets "
                                "belong to cannot be told (restore the file; moved aside, the "
                                "partition counts as its original storage)", exc.position
                                ) from exc


def decode(data: bytes, path: Path | str = INCARNATION_FILE) -> Incarnation:
    """Parse an incarnation file; CorruptStateError naming what is wrong."""
    if len(data) != SIZE:
        raise CorruptStateError(path, f"size {len(data)}, expected {SIZE}", min(len(data), SIZE))
    magic, version, flags, _, start, made_at, raw_id = BODY.unpack_from(data)
    if magic != MAGIC:
        raise CorruptStateError(path, f"magic {magic!r}, expected {MAGIC!r}", 0)
    if version != VERSION:
        raise CorruptStateError(path, f"version {version} is not supported (expected "
                                      f"{VERSION})", 4)
    (stored,) = CRC.unpack_from(data, BODY.size)
    if crc32c.crc32c(data[:BODY.size]) != stored:
        raise CorruptStateError(path, "CRC-32C mismatch", BODY.size)
    if start < 0:
        raise CorruptStateError(path, f"start offset {start} is negative", 8)
    return Incarnation(raw_id.hex(), start, bool(flags & FLAG_PENDING), made_at)


def encode(incarnation: Incarnation) -> bytes:
    """The 44 bytes of an incarnation other than ORIGINAL."""
    body = BODY.pack(MAGIC, VERSION, FLAG_PENDING if incarnation.pending else 0, 0,
                     incarnation.start_offset, incarnation.made_at_ms,
                     bytes.fromhex(incarnation.id))
    return body + CRC.pack(crc32c.crc32c(body))


def begin(directory: Path) -> Incarnation:
    """Write a new incarnation, its start pending, in a directory just made again."""
    made = Incarnation(uuid.uuid4().hex, 0, True, int(time.time() * 1000))
    write_atomically(directory / INCARNATION_FILE, encode(made))
    return made


def settle(directory: Path, incarnation: Incarnation, start_offset: int) -> Incarnation:
    """Record the start offset of a pending incarnation; the incarnation as now on disk."""
    settled = Incarnation(incarnation.id, start_offset, False, incarnation.made_at_ms)
    write_atomically(directory / INCARNATION_FILE, encode(settled))
    return settled

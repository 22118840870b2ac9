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
                                 directory, cleared once it knows the start offset);
                                 other bits 0 (a set one: a newer format, refused)
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
the operator's next recreate) sets the start offset once the checkpoint told where the
partition goes on (channel_recovery.py step 5), before any put: the log end then, or the
operator's next offset when higher. A directory whose incarnation is still pending
(cut_short) counts as missing, like an empty one (below): no other open settles
it, so the next offsets the operator gives the recreate that finishes it are not lost.

A file that fails its checks (size, magic, version, CRC), or anything but a regular file
under its name (a directory, say: never moved aside as a stray, which would turn the
partition into its original storage), is CorruptStateError naming it: the open fails
rather than take the partition for another incarnation; `recover` (tools/recover.py)
keeps it aside as `incarnation.damaged` and starts a new incarnation at the partition's
log start. An engine older than this file moves it aside as `incarnation.stray`: a
directory holding such a copy (or recover's `incarnation.damaged`, from a recover cut
short) and no `incarnation` is CorruptStateError too, never the original storage;
`recover` puts an older engine's intact copy back, or starts a new incarnation.

An empty directory in place of a vanished one (`mkdir` by someone, provisioning that
makes the tree again, the mount point of a volume not mounted: made_again(), no
log.state, segment or incarnation file in it) is the vanished directory still missing,
not the original storage going on at its checkpoint's end: home_files.missing_places
lists it, so the channel answers storage-missing (503 in the appliance) and nothing is
written into it, until the operator's recreate makes it a new incarnation there (begin()
in place). Why not a new incarnation at the first open, without the operator: an empty
mount point would get a channel written under the volume and hidden once it is mounted,
and the events the directory held would be lost without anyone's word — the operator
is asked exactly as for a directory that is gone, which is what it is. Only a partition
a checkpoint copy records (or one the operator's recreate names: existed=True) can have
vanished: a checkpoint is written once every partition directory of the open has its
files, so an empty directory of a partition no checkpoint records is one a first open, a
create or a raise of the partition count was killed while making, used as it is
(home_files.existed_partitions).

Concurrency: written only by the partition's owner at its open; read by anyone.
"""
from __future__ import annotations

import os
import re
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import crc32c

from channel_engine.atomic_file import write_atomically
from channel_engine.errors import CorruptStateError
from channel_engine.filenames import (
    DAMAGED_SUFFIX,
    INCARNATION_FILE,
    LOG_STATE_FILE,
    STRAY_SUFFIX,
    parse_segment_file,
)
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
    CorruptStateError naming the file when it fails its checks, is no regular file, or
    is missing while an older engine's `incarnation.stray` is there (module doc)."""
    path = directory / INCARNATION_FILE
    if os.path.lexists(path) and not path.is_file():
        raise CorruptStateError(path, f"not a regular file{_CANNOT_TELL}", 0)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        kept = kept_copies(directory)
        if kept:
            raise CorruptStateError(kept[0], "a copy of the partition's incarnation file kept "
                                    "aside (by an older Weir, which did not know it, or by a "
                                    "recover cut short), and none in its place: without it "
                                    "the partition would count as its original storage. Run "
                                    "`python -m channel_engine recover` on the channel (it "
                                    "puts an older Weir's copy back, or starts a new "
                                    "incarnation)", 0) from None
        return ORIGINAL_INCARNATION
    try:
        return decode(data, path)
    except CorruptStateError as exc:
        raise CorruptStateError(path, f"{exc.reason}{_CANNOT_TELL}", exc.position) from exc


_CANNOT_TELL = (": which storage the partition's offsets belong to cannot be told. Run "
                "`python -m channel_engine recover` on the channel: it keeps the file aside "
                f"as {INCARNATION_FILE}{DAMAGED_SUFFIX} and starts a new incarnation at the "
                "partition's log start (a drain that sent offsets above it then refuses, "
                "naming the way out)")


def made_again(directory: Path) -> bool:
    """True for a directory that holds nothing of a partition: no log.state, no segment
    file, no incarnation file (nor a copy of one kept aside) — made again by someone
    else than the engine, or the mount point of a volume not mounted (module doc)."""
    try:
        names = os.listdir(directory)
    except OSError:  # missing, no directory, unreadable: the open reports what it is
        return False
    return not any(name in (LOG_STATE_FILE, INCARNATION_FILE) or _KEPT.fullmatch(name)
                   or parse_segment_file(name) is not None for name in names)


def cut_short(directory: Path) -> bool:
    """True for a partition directory whose incarnation is still pending: a recreate cut
    short before it recorded its start (only the operator's recreate finishes it)."""
    try:
        return read(directory).pending
    except (CorruptStateError, OSError):
        return False  # the open reports it


def kept_copies(directory: Path) -> list[Path]:
    """Entries `incarnation[.<n>].stray` (an older engine, which did not know the name,
    moved it aside) and `incarnation[.<n>].damaged` (recover kept it), in name order; a
    directory among them too (what was in the file's place, moved aside)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(directory / name for name in names if _KEPT.fullmatch(name))


def restart(directory: Path, start_offset: int) -> Incarnation:
    """Write a new incarnation, settled at `start_offset`, in place of a damaged file
    (tools/recover.py)."""
    made = Incarnation(uuid.uuid4().hex, start_offset, False, int(time.time() * 1000))
    write_atomically(directory / INCARNATION_FILE, encode(made))
    return made


_KEPT = re.compile(re.escape(INCARNATION_FILE) + r"(\.\d+)?("
                   + re.escape(STRAY_SUFFIX) + "|" + re.escape(DAMAGED_SUFFIX) + ")")


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
    if flags & ~FLAG_PENDING:
        raise CorruptStateError(path, f"unknown flags 0x{flags:02x} (a newer Weir's?)", 5)
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

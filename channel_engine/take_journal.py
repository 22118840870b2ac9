"""TakeJournal: the durable record of committed takes between two checkpoints.

A take commit must survive a crash in fsync durability, but rewriting the queue
checkpoint on every commit would cost a rename and two directory fsyncs. So a
commit appends one small record to the journal of the current checkpoint
generation and fsyncs it; the next checkpoint snapshots the queue and starts a
new journal, and journals older than the newest valid checkpoint are deleted.

Files, in the checkpoint dir: `takes-<G>.journal`, G = the sequence of the
checkpoint the journal follows (20 digits). Opening a channel reads checkpoint
S and replays every journal with G >= S, in order (a journal newer than the
checkpoint exists when the process died between rotating the journal and
writing the checkpoint). Replaying a commit twice is harmless.

    file    := header record*
    header  := magic "WTKJ" (4) | version 1 (1) | reserved (3) | generation i64
    record  := length i32 (bytes after crc) | crc u32 (CRC-32C of the bytes after it)
               | take id i64 | count i32 | count x (partition i32, start i64, end i64)

A record is valid when its length fits the file and its CRC matches; replay
stops at the first invalid record (a torn append of a commit that never
returned) and reports the bytes it ignored. Not thread-safe: the channel
serialises appends (a lock in process, flock across processes).
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import CorruptStateError

MAGIC = b"WTKJ"
VERSION = 1
HEADER = struct.Struct(">4sB3xq")
RECORD_HEAD = struct.Struct(">iI")
RECORD_BODY = struct.Struct(">qi")
ENTRY = struct.Struct(">iqq")
assert HEADER.size == 16 and RECORD_HEAD.size == 8 and ENTRY.size == 20

Entry = tuple[int, int, int]  # partition, start, end


@dataclass(frozen=True)
class CommittedTake:
    """One replayed take commit."""

    generation: int
    take_id: int
    entries: tuple[Entry, ...]


def journal_path(directory: Path, generation: int) -> Path:
    """Path of the journal that follows checkpoint `generation`."""
    return directory / f"takes-{generation:020d}.journal"


def generations(directory: Path) -> list[int]:
    """Generations of the journals present, ascending."""
    found = []
    for name in os.listdir(directory):
        if name.startswith("takes-") and name.endswith(".journal"):
            digits = name[len("takes-"):-len(".journal")]
            if digits.isdigit() and len(digits) == 20:
                found.append(int(digits))
    return sorted(found)


class TakeJournal:
    """An open journal file for appending take commits."""

    def __init__(self, directory: Path, generation: int) -> None:
        self.directory = directory
        self.generation = generation
        self.path = journal_path(directory, generation)
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if created or os.fstat(self._fd).st_size == 0:
            os.write(self._fd, HEADER.pack(MAGIC, VERSION, generation))
            os.fsync(self._fd)
            fsync_directory(directory)

    def append(self, take_id: int, entries: Sequence[Entry], sync: bool = True) -> None:
        """Record a committed take; with sync, durable on return."""
        body = RECORD_BODY.pack(take_id, len(entries)) + b"".join(
            ENTRY.pack(*entry) for entry in entries)
        os.write(self._fd, RECORD_HEAD.pack(len(body), crc32c.crc32c(body)) + body)
        if sync:
            os.fdatasync(self._fd)

    def sync(self) -> None:
        """Make every appended record durable."""
        os.fdatasync(self._fd)

    def close(self) -> None:
        """Close the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def replay(path: Path) -> tuple[list[CommittedTake], int]:
    """Read one journal: its valid records, and how many bytes after them were ignored."""
    data = path.read_bytes()
    if len(data) < HEADER.size:
        return [], len(data)  # a crash right after creating it: nothing was committed in it
    magic, version, generation = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptStateError(path, f"magic {magic!r} version {version}, expected "
                                      f"{MAGIC!r} version {VERSION}")
    takes, position = [], HEADER.size
    while position + RECORD_HEAD.size <= len(data):
        length, crc = RECORD_HEAD.unpack_from(data, position)
        start = position + RECORD_HEAD.size
        body = data[start:start + length]
        if length < RECORD_BODY.size or len(body) != length or crc32c.crc32c(body) != crc:
            break
        take_id, count = RECORD_BODY.unpack_from(body)
        if RECORD_BODY.size + count * ENTRY.size != length:
            break
        entries = tuple(ENTRY.unpack_from(body, RECORD_BODY.size + i * ENTRY.size)
                        for i in range(count))
        takes.append(CommittedTake(generation, take_id, entries))
        position = start + length
    return takes, len(data) - position


def replay_from(directory: Path, generation: int) -> Iterator[tuple[Path, list[CommittedTake],
                                                                    int]]:
    """Replay every journal with generation >= `generation`, oldest first."""
    for found in generations(directory):
        if found >= generation:
            path = journal_path(directory, found)
            takes, ignored = replay(path)
            yield path, takes, ignored


def remove_before(directory: Path, generation: int) -> int:
    """Delete journals older than `generation` (a valid checkpoint covers them)."""
    removed = 0
    for found in generations(directory):
        if found < generation:
            journal_path(directory, found).unlink(missing_ok=True)
            removed += 1
    if removed:
        fsync_directory(directory)
    return removed

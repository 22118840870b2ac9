"""CommitJournal: the durable record of commits between two checkpoints.

Two kinds of commit are journalled:
  * a take commit (Flume's take, committed): the offset ranges it took for good.
    Rewriting the queue checkpoint on every take commit would cost a rename and
    two directory fsyncs; one appended record and a shared fdatasync cost less.
  * a multi-partition put commit: a put that touches several partitions writes
    one transactional batch per partition (Kafka's isTransactional bit, Weir's
    transaction id as producerId); its commit record here is the one point at
    which the whole put becomes committed, like Kafka's transaction log. A put
    touching one partition needs no record: its batch is atomic by itself.

Files, in the checkpoint dir: `commits-<G>.journal`, G = the sequence of the
checkpoint the journal follows (20 digits). Opening a channel reads checkpoint
S and replays every journal with G >= S, in order (a journal newer than the
checkpoint exists when the process died between rotating the journal and
writing the checkpoint). Replaying a commit twice is harmless.

    file    := header record*
    header  := magic "WCJN" (4) | version 1 (1) | reserved (3) | generation i64
    record  := length i32 (bytes after crc) | crc u32 (CRC-32C of the bytes after it)
               | kind u8 (1 take commit, 2 put commit) | id i64 (take or txn id)
               | count i32 | count x (partition i32, start i64, end i64)

A record is valid when its length fits the file and its CRC matches; replay
stops at the first invalid record (a torn append of a commit that never
returned) and reports the bytes it ignored.

Group commit: append() writes the record (one write(2), serialised by the
caller's lock) and returns a ticket; sync(ticket) returns once that record is
on disk, and one fdatasync serves every record appended before it started.
"""
from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c

from channel_engine.atomic_file import fsync_directory
from channel_engine.checkpoint import MAX_SEQUENCE
from channel_engine.errors import CorruptStateError

MAGIC = b"WCJN"
VERSION = 1
TAKE = 1
PUT = 2
HEADER = struct.Struct(">4sB3xq")
RECORD_HEAD = struct.Struct(">iI")
RECORD_BODY = struct.Struct(">Bqi")
ENTRY = struct.Struct(">iqq")
assert HEADER.size == 16 and RECORD_HEAD.size == 8 and RECORD_BODY.size == 13
assert ENTRY.size == 20

Entry = tuple[int, int, int]  # partition, start, end


@dataclass(frozen=True)
class Commit:
    """One replayed commit: kind TAKE or PUT, the take or transaction id, its ranges."""

    generation: int
    kind: int
    commit_id: int
    entries: tuple[Entry, ...]


def journal_path(directory: Path, generation: int) -> Path:
    """Path of the journal that follows checkpoint `generation`."""
    return directory / f"commits-{generation:020d}.journal"


def generations(directory: Path) -> list[int]:
    """Generations of the journals present, ascending."""
    found = []
    for name in os.listdir(directory):
        if name.startswith("commits-") and name.endswith(".journal"):
            digits = name[len("commits-"):-len(".journal")]
            if digits.isdigit() and len(digits) == 20:
                if int(digits) > MAX_SEQUENCE:  # no checkpoint gets there: not ours
                    raise CorruptStateError(directory / name, f"generation {int(digits)} is "
                                                              f"beyond {MAX_SEQUENCE}")
                found.append(int(digits))
    return sorted(found)


class CommitJournal:
    """An open journal file for appending commits, with group fdatasync."""

    def __init__(self, directory: Path, generation: int) -> None:
        self.directory = directory
        self.generation = generation
        self.path = journal_path(directory, generation)
        self._sync_cond = threading.Condition()
        self._appended = 0  # tickets handed out
        self._synced = 0  # tickets known to be on disk
        self._syncing = False
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if created or os.fstat(self._fd).st_size == 0:
            os.write(self._fd, HEADER.pack(MAGIC, VERSION, generation))
            os.fsync(self._fd)
            fsync_directory(directory)

    def append(self, kind: int, commit_id: int, entries: Sequence[Entry]) -> int:
        """Write one commit record (not yet synced); return its ticket for sync()."""
        body = RECORD_BODY.pack(kind, commit_id, len(entries)) + b"".join(
            ENTRY.pack(*entry) for entry in entries)
        os.write(self._fd, RECORD_HEAD.pack(len(body), crc32c.crc32c(body)) + body)
        with self._sync_cond:
            self._appended += 1
            return self._appended

    def sync(self, ticket: int | None = None) -> None:
        """Return once the record with `ticket` (default: every record) is on disk."""
        with self._sync_cond:
            target = self._appended if ticket is None else ticket
            while self._synced < target:
                if not self._syncing:
                    self._syncing = True
                    break
                self._sync_cond.wait()
            else:
                return
            upto = self._appended
        try:
            os.fdatasync(self._fd)
        finally:
            with self._sync_cond:
                self._syncing = False
                self._synced = max(self._synced, upto) if self._fd >= 0 else self._synced
                self._sync_cond.notify_all()
        if self._synced < target:
            self.sync(ticket)

    def close(self) -> None:
        """Sync and close the file."""
        with self._sync_cond:
            while self._syncing:
                self._sync_cond.wait()
            if self._fd >= 0:
                os.fdatasync(self._fd)
                self._synced = self._appended
                os.close(self._fd)
                self._fd = -1


def replay(path: Path) -> tuple[list[Commit], int]:
    """Read one journal: its valid records, and how many bytes after them were ignored."""
    data = path.read_bytes()
    if len(data) < HEADER.size:
        return [], len(data)  # a crash right after creating it: nothing was committed in it
    magic, version, generation = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptStateError(path, f"magic {magic!r} version {version}, expected "
                                      f"{MAGIC!r} version {VERSION}")
    commits, position = [], HEADER.size
    while position + RECORD_HEAD.size <= len(data):
        length, crc = RECORD_HEAD.unpack_from(data, position)
        start = position + RECORD_HEAD.size
        body = data[start:start + length]
        if length < RECORD_BODY.size or len(body) != length or crc32c.crc32c(body) != crc:
            break
        kind, commit_id, count = RECORD_BODY.unpack_from(body)
        if RECORD_BODY.size + count * ENTRY.size != length or kind not in (TAKE, PUT):
            break
        entries = tuple(ENTRY.unpack_from(body, RECORD_BODY.size + i * ENTRY.size)
                        for i in range(count))
        commits.append(Commit(generation, kind, commit_id, entries))
        position = start + length
    return commits, len(data) - position


def replay_from(directory: Path, generation: int) -> Iterator[tuple[Path, list[Commit], int]]:
    """Replay every journal with generation >= `generation`, oldest first."""
    for found in generations(directory):
        if found >= generation:
            path = journal_path(directory, found)
            commits, ignored = replay(path)
            yield path, commits, ignored


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

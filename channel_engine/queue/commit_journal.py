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

    file    := header record* zero*
    header  := magic "WCJN" (4) | version 2 (1; 1 is still read) | flags u8 (1)
               | reserved (2, zeros) | generation i64
    flags   := bit 0 ZEROS_AHEAD: the writer keeps zeros written ahead of its records
               (below); other bits 0. Bytes 5..7 were reserved (zeros) before: every
               reader since version 1 skips them, so a flagged file reads the same there
    record  := length i32 (bytes after crc) | crc u32 (CRC-32C of the bytes after it)
               | kind u8 | id i64 (take or txn id) | count i32
               | [subscription i32: kind 3 only]
               | count x (partition i32, start i64, end i64)
    kind    := 1 a take commit of subscription `default` (id 0), or, with take id 0,
               offsets taken out of every subscription's queue as lost (losses.py)
             | 2 a put commit
             | 3 a take commit of the subscription whose id follows (checkpoint.py
               gives ids; a record of an id no checkpoint knows is of a subscription
               removed since, or never saved: replay ignores it) [version 2]

Zero tail (preallocation, version 2 as before: a reader that predates it took
those zeros for a torn tail, and reported them). A journal created with zero_fill
(the owner's, in fsync durability) has ZEROS_AHEAD set in its header, written and
synced with it before any record, and keeps up to that many zero bytes written
ahead of its last record (at most zero_fill + 4 KiB), so that the fdatasync of each
take commit overwrites blocks already written instead of growing the file (its
size and extents need no journal commit of the filesystem: see
log/segment_file.py's zero-fill ahead). close() trims them. Reading a flagged
journal takes an all-zero rest of the file after the last valid record for that
space: no record, nothing ignored (scan's zero_tail). A power loss that dropped
appends wholly within it looks the same; every commit there was appended after
the last fdatasync that returned, as for a torn tail below. In a journal without
the flag (policy durability, where a take commit returns before its fdatasync; a
journal written before the flag) zeros at the end are appends a power loss
dropped, which may have returned: a torn tail, ignored and counted as before.
An existing journal opened again keeps its flag, and gets zeros ahead only if set.

A record is valid when its length fits the file, its CRC matches, its kind is
1, 2 or 3 and its count agrees with its length. The header has no CRC: a magic,
version or generation (against the file name) that is wrong makes the file
unreadable, except a file of zeros or a prefix of its header: a crash while
creating it, before the header was synced, so no commit is in it. Reading
(scan) stops at the first invalid record, then searches the rest byte by byte
for intact records, to tell two cases apart:
  * a torn tail: nothing intact follows, or only after bytes that look like
    appends that never wholly reached the disk (power loss can keep a later
    sector and drop an earlier one, or keep a prefix of a write): zeros,
    records whose tails are zeros up to where their length says they end, or
    bytes holding a piece that ends at a 512-byte sector boundary, is at least
    4 bytes long (a record's length field) and is all zeros (that sector reached
    the disk before the append did; the later ones after it). Damage that
    zeroes such a piece is taken for a tear too, as damage.py takes a batch
    with a zero sector for a torn write: the bytes alone cannot tell them apart.
    Every commit there was appended after the last fsync that returned, so
    none of them returned (in fsync durability; in policy durability they may
    have: the takes come back, the puts are aborted, within the flush window):
    replay ignores these bytes, reports how many, and open goes on;
  * damage in the middle: intact records follow other bad bytes, so commits
    that returned are unreadable. replay raises CorruptRecordError naming the
    file and byte, and open refuses the channel. `python -m channel_engine
    recover HOME` repairs it: the journal is cut at its first bad record (the
    original kept as `commits-<G>.journal.damaged`), and the take commits cut
    off come back at least once (their events are delivered again), the put
    commits cut off are aborted (unless their batches were already stamped
    committed); both are counted, with their offsets when the
    records after the damage are intact.
Every problem is raised as an engine error naming the file and byte.

Every checkpoint S has its journal S: the owner creates it and fsyncs its header
(and the directory) before it writes checkpoint S, and removes a journal only
once a newer checkpoint (both copies) covers it. So a journal S that is missing,
not a regular file, or holds no whole header while checkpoint S is the newest
valid one is damage, not a crash (checkpoint_journal_problem): the take commits
made since that checkpoint are unknown. Open and recover then report it (the
recovery report's journals_unknown) and say how many events may come back at
most (every event untaken in the restored queue: any of them may have been taken
since); open also records it in the loss ledger. A torn tail after a whole
header (above) is reported the same way but is no loss record: after a power
loss it is a commit that never returned, and the bytes alone cannot tell it
from a cut. A journal newer than the checkpoint with no whole header is a crash
while creating it: no commit is in it.

Group commit: append() writes the record (one pwrite(2) at the end of the
records, serialised by the caller's lock) and returns a ticket; sync(ticket)
returns once that record is on disk, and one fdatasync serves every record
appended before it started.
"""
from __future__ import annotations

import os
import stat
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import CorruptRecordError, CorruptStateError, JournalOfflineError
from channel_engine.filenames import DAMAGED_SUFFIX
from channel_engine.log.zero_fill import ZeroFill
from channel_engine.queue.checkpoint import MAX_SEQUENCE

MAGIC = b"WCJN"
VERSION = 2
READABLE_VERSIONS = (1, 2)
TAKE = 1
PUT = 2
TAKE_OF = 3  # a take commit of a subscription other than `default`
KINDS = (TAKE, PUT, TAKE_OF)
HEADER = struct.Struct(">4sBB2xq")
ZEROS_AHEAD = 0x01  # header flag: an all-zero tail is preallocated space (module doc)
RECORD_HEAD = struct.Struct(">iI")
RECORD_BODY = struct.Struct(">Bqi")
SUBSCRIPTION = struct.Struct(">i")
ENTRY = struct.Struct(">iqq")
SECTOR = 512  # the unit power loss tears writes at (as log/damage.py)
PAGE = 4096
ZERO_FILL_BYTES = 256 * 1024  # zeros the owner keeps ahead in fsync durability (~6,000 takes)
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
    subscription: int = 0  # the subscription id of a take commit (kind TAKE_OF)


def journal_path(directory: Path, generation: int) -> Path:
    """Path of the journal that follows checkpoint `generation`."""
    return directory / f"commits-{generation:020d}.journal"


def generations(directory: Path) -> list[int]:
    """Generations of the journals present, ascending."""
    found = sorted(g for g in map(_named_generation, map(Path, os.listdir(directory)))
                   if g is not None)
    if found and found[-1] > MAX_SEQUENCE:  # no checkpoint gets there: not ours
        raise CorruptStateError(journal_path(directory, found[-1]),
                                f"generation {found[-1]} is beyond {MAX_SEQUENCE}", 0)
    return found


def checkpoint_journal_problem(directory: Path, sequence: int) -> str | None:
    """Why journal `sequence` cannot hold the commits made since checkpoint `sequence`
    (missing, not a regular file, no whole header), or None; see the module doc."""
    path = journal_path(directory, sequence)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if len(head) < HEADER.size:
        return f"{len(head)} bytes, shorter than its {HEADER.size}-byte header"
    if not head.strip(b"\0"):
        return "its header is zeros"
    return None


def journal_generation(path: Path) -> int:
    """The generation a journal's file name gives; ValueError for another name."""
    generation = _named_generation(path)
    if generation is None:
        raise ValueError(f"{path}: not a commit journal name")
    return generation


def is_journal_name(name: str) -> bool:
    """Is `name` the name of a commit journal (commits-<20 digits>.journal)?"""
    return _named_generation(Path(name)) is not None


class CommitJournal:
    """An open journal file for appending commits, with group fdatasync; with zero_fill,
    that many zero bytes kept written ahead of the records (see the module doc)."""

    def __init__(self, directory: Path, generation: int, zero_fill: int = 0) -> None:
        self.directory = directory
        self.generation = generation
        self.path = journal_path(directory, generation)
        self._sync_cond = threading.Condition()
        self._appended = 0  # tickets handed out
        self._synced = 0  # tickets known to be on disk
        self._syncing = False
        self._failed: OSError | None = None  # a failed fdatasync: nothing after it is durable
        self._filler = ZeroFill()
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._zeroed_to = os.fstat(self._fd).st_size  # bytes written: records or zeros
        if created or self._zeroed_to == 0:
            self._zero_fill = zero_fill
            flags = ZEROS_AHEAD if zero_fill else 0
            os.pwrite(self._fd, HEADER.pack(MAGIC, VERSION, flags, generation), 0)
            self._end = self._zeroed_to = HEADER.size
            self._fill_ahead(HEADER.size)
            os.fsync(self._fd)
            fsync_directory(directory)
        else:  # appended to again (a refused checkpoint; an upgrade): after its records
            found = scan(self.path)  # and after any bytes that are no record, as before
            self._end = self._zeroed_to if found.problem else found.valid_bytes
            self._zero_fill = zero_fill if found.zeros_ahead else 0  # its flag decides

    def append(self, kind: int, commit_id: int, entries: Sequence[Entry],
               subscription: int = 0) -> int:
        """Write one commit record (not yet synced); return its ticket for sync(). A take
        commit of a subscription other than `default` (id 0) is written as kind TAKE_OF."""
        if kind == TAKE and subscription:
            kind = TAKE_OF
        extra = SUBSCRIPTION.pack(subscription) if kind == TAKE_OF else b""
        body = RECORD_BODY.pack(kind, commit_id, len(entries)) + extra + b"".join(
            ENTRY.pack(*entry) for entry in entries)
        record = RECORD_HEAD.pack(len(body), crc32c.crc32c(body)) + body
        end = self._end + len(record)
        self._fill_ahead(end)
        if os.pwrite(self._fd, record, self._end) != len(record):
            raise OSError(f"{self.path}: short write of a commit record at byte {self._end}")
        self._end = end
        self._zeroed_to = max(self._zeroed_to, end)
        with self._sync_cond:
            self._appended += 1
            return self._appended

    @property
    def preallocated_bytes(self) -> int:
        """Zero bytes written ahead of the records (see the module doc)."""
        return max(self._zeroed_to - self._end, 0)

    def _fill_ahead(self, end: int) -> None:
        """Keep zeros written ahead of a record ending at `end` (best effort: a disk too
        full for them cuts them off and the record is written without; after that none
        are tried until it has room: log/zero_fill.py)."""
        chunk = self._zero_fill
        if not chunk or end + chunk // 2 <= self._zeroed_to:
            return
        start = max(self._zeroed_to, end)
        target = -(-(end + chunk) // PAGE) * PAGE
        if not self._filler.allows(self._fd, target - start):
            return
        written = self._filler.write(self._fd, start, target)
        if written < target:
            try:
                os.ftruncate(self._fd, max(self._end, self._zeroed_to))
                return
            except OSError:
                pass  # zeros after the records (a flagged journal): preallocated space
        self._zeroed_to = max(self._zeroed_to, written)

    def sync(self, ticket: int | None = None) -> None:
        """Return once the record with `ticket` (default: every record) is on disk;
        JournalOfflineError once an fdatasync failed, for every record not known to be on
        disk before it (this one's callers and every later one: fsync errors are sticky)."""
        with self._sync_cond:
            target = self._appended if ticket is None else ticket
            while self._synced < target:
                if self._failed is not None:
                    raise JournalOfflineError(self.path, self._failed)
                if not self._syncing:
                    self._syncing = True
                    break
                self._sync_cond.wait()
            else:
                return
            upto = self._appended
        failed, done = None, False
        try:
            os.fdatasync(self._fd)
            done = True
        except OSError as exc:
            failed = exc
        finally:  # only an fdatasync that returned makes records durable
            with self._sync_cond:
                self._syncing = False
                if failed is not None:
                    self._failed = failed
                elif done and self._fd >= 0:
                    self._synced = max(self._synced, upto)
                self._sync_cond.notify_all()
        if failed is not None:
            raise JournalOfflineError(self.path, failed) from failed
        if self._synced < target:
            self.sync(ticket)

    def synced(self, ticket: int) -> bool:
        """True once the record with `ticket` is known to be on disk (also after close)."""
        return self._synced >= ticket

    def close(self) -> None:
        """Sync and close the file."""
        with self._sync_cond:
            while self._syncing:
                self._sync_cond.wait()
            if self._fd >= 0:
                if self._zeroed_to > self._end:  # the zeros ahead: no longer needed
                    os.ftruncate(self._fd, self._end)
                os.fdatasync(self._fd)
                self._synced = self._appended
                os.close(self._fd)
                self._fd = -1


@dataclass
class JournalScan:
    """What reading one journal found: the valid prefix, and what follows it."""

    path: Path
    file_size: int
    commits: list[Commit] = field(default_factory=list)  # the valid prefix, replayed
    valid_bytes: int = 0  # where the valid prefix ends: the cut point
    problem: str = ""  # why the bytes at valid_bytes are not a valid record ("" if none)
    header_damaged: bool = False  # the file is unreadable from byte 0
    after: list[Commit] = field(default_factory=list)  # intact records after the damage
    unreadable_bytes: int = 0  # bytes after the cut that are no intact record
    zero_tail: int = 0  # zeros after the valid records: preallocated space, no record
    zeros_ahead: bool = False  # the header's ZEROS_AHEAD flag: zero_tail may be non-zero

    @property
    def ignored(self) -> int:
        """Bytes after the valid prefix (not replayed), the zero tail excepted."""
        return self.file_size - self.valid_bytes - self.zero_tail

    @property
    def torn_tail(self) -> bool:
        """True when the ignored bytes are a torn append (see the module doc)."""
        return not self.header_damaged and not self.after

    @property
    def damaged(self) -> bool:
        """True when commits that may have returned are unreadable (damage, not a tear)."""
        return bool(self.ignored) and not self.torn_tail


def scan(path: Path) -> JournalScan:
    """Read one journal without raising for its content; see the module doc."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CorruptStateError(path, f"cannot be read ({exc.strerror or exc})", 0) from exc
    found = JournalScan(path, len(data))
    headers = [HEADER.pack(MAGIC, v, flags, _named_generation(path) or 0)
               for v in READABLE_VERSIONS for flags in (0, ZEROS_AHEAD)]
    if not data.strip(b"\0") or (len(data) < HEADER.size
                                  and any(h.startswith(data) for h in headers)):
        if data:  # a crash while creating it, before its header was synced: no commit in it
            found.problem = f"{len(data)} bytes of a header never written whole"
        return found
    if len(data) < HEADER.size:
        found.problem, found.header_damaged = f"a header of {len(data)} bytes", True
        found.unreadable_bytes = len(data)
        return found
    magic, version, flags, generation = HEADER.unpack_from(data)
    # the flag is believed only under an intact magic: damage there may have set it
    found.zeros_ahead = magic == MAGIC and bool(flags & ZEROS_AHEAD)
    problem = _header_problem(path, magic, version, generation)
    if problem:
        found.problem, found.header_damaged = problem, True
        generation = _named_generation(path) or generation
        found.after, found.unreadable_bytes, found.zero_tail = _salvage(
            data, HEADER.size, generation, found.zeros_ahead)
        found.unreadable_bytes += HEADER.size
        return found
    found.commits, found.valid_bytes, found.problem = _records(data, HEADER.size, generation)
    if found.problem and found.zeros_ahead and not data[found.valid_bytes:].strip(b"\0"):
        found.problem, found.zero_tail = "", len(data) - found.valid_bytes  # preallocated
    if found.problem:
        first = _next_intact(data, found.valid_bytes, generation)
        if first >= 0 and _unsynced(data, found.valid_bytes, first):
            end = _records(data, first, generation)[1]
            if found.zeros_ahead and not data[end:].strip(b"\0"):
                found.zero_tail = len(data) - end  # preallocated space after them
            found.unreadable_bytes = found.ignored  # unsynced appends: nothing after returned
        else:
            found.after, found.unreadable_bytes, found.zero_tail = _salvage(
                data, found.valid_bytes, generation, found.zeros_ahead)
    return found


def _header_problem(path: Path, magic: bytes, version: int, generation: int) -> str:
    if magic != MAGIC or version not in READABLE_VERSIONS:
        return (f"magic {magic!r} version {version}, expected {MAGIC!r} version "
                f"{' or '.join(map(str, READABLE_VERSIONS))}")
    named = _named_generation(path)
    if named is not None and named != generation:
        return f"header generation {generation} but the file is named for {named}"
    return ""


def _named_generation(path: Path) -> int | None:
    digits = path.name[len("commits-"):-len(".journal")]
    if path.name.startswith("commits-") and path.name.endswith(".journal") \
            and digits.isdigit() and len(digits) == 20:
        return int(digits)
    return None


def _record_at(data: bytes, position: int, generation: int) -> tuple[Commit | None, str]:
    """The record at `position`, or None and why it is not valid."""
    if position + RECORD_HEAD.size > len(data):
        return None, f"{len(data) - position} bytes, too few for a record header"
    length, crc = RECORD_HEAD.unpack_from(data, position)
    start = position + RECORD_HEAD.size
    if length < RECORD_BODY.size or start + length > len(data):
        return None, f"record length {length} does not fit the file"
    body = data[start:start + length]
    if crc32c.crc32c(body) != crc:
        return None, "record CRC-32C mismatch"
    kind, commit_id, count = RECORD_BODY.unpack_from(body)
    head = RECORD_BODY.size + (SUBSCRIPTION.size if kind == TAKE_OF else 0)
    if kind not in KINDS or count < 0 or head + count * ENTRY.size != length:
        return None, f"record kind {kind} count {count} do not fit its length {length}"
    subscription = SUBSCRIPTION.unpack_from(body, RECORD_BODY.size)[0] if kind == TAKE_OF else 0
    if kind == TAKE_OF and subscription < 1:
        return None, f"a take commit of subscription id {subscription}"
    entries = tuple(ENTRY.unpack_from(body, head + i * ENTRY.size) for i in range(count))
    return Commit(generation, kind, commit_id, entries, subscription), ""


def _size(commit: Commit) -> int:
    extra = SUBSCRIPTION.size if commit.kind == TAKE_OF else 0
    return RECORD_HEAD.size + RECORD_BODY.size + extra + len(commit.entries) * ENTRY.size


def _records(data: bytes, position: int, generation: int) -> tuple[list[Commit], int, str]:
    """The valid records from `position` on: (records, where they end, why they end)."""
    commits: list[Commit] = []
    while position < len(data):
        commit, why = _record_at(data, position, generation)
        if commit is None:
            return commits, position, why
        commits.append(commit)
        position += _size(commit)
    return commits, position, ""


def _next_intact(data: bytes, position: int, generation: int) -> int:
    """The position of the next intact record at or after `position`, or -1."""
    limit = len(data) - RECORD_HEAD.size - RECORD_BODY.size
    while position <= limit:
        kind = data[position + RECORD_HEAD.size]
        if kind in KINDS and _record_at(data, position, generation)[0] is not None:
            return position
        position += 1
    return -1


def _salvage(data: bytes, position: int, generation: int,
             zeros_ahead: bool) -> tuple[list[Commit], int, int]:
    """Intact records from `position` on, searched byte by byte past damage, how many
    bytes are no intact record, and how many zeros end the file after the last of them
    (preallocated space, neither: only in a journal flagged ZEROS_AHEAD)."""
    found: list[Commit] = []
    unreadable = 0
    while position < len(data):
        intact = _next_intact(data, position, generation)
        if intact < 0:
            zeros = _zero_tail(data, position) if zeros_ahead else 0
            return found, unreadable + len(data) - position - zeros, zeros
        unreadable += intact - position
        commits, position, _ = _records(data, intact, generation)
        found += commits
    return found, unreadable, 0


def _zero_tail(data: bytes, position: int) -> int:
    """How many zeros end the file after the bytes from `position`, a torn or damaged
    record's there up to where its length says it ends included: preallocated space."""
    end = position + len(data[position:].rstrip(b"\0"))
    if end > position and position + RECORD_HEAD.size <= len(data):
        length = RECORD_HEAD.unpack_from(data, position)[0]
        end = max(end, min(len(data), position + RECORD_HEAD.size + max(length, 0)))
    return len(data) - end


def _unsynced(data: bytes, position: int, intact: int) -> bool:
    """Are the bytes [position, intact) appends that never wholly reached the disk: records
    each cut short (its tail zeros, where its length says it ends), then zeros; or bytes
    with a dropped sector in them?"""
    if _dropped_sector(data, position, intact):
        return True
    while position < intact:
        if not data[position:intact].strip(b"\0"):
            return True
        if intact - position < RECORD_HEAD.size:
            return False
        length, _ = RECORD_HEAD.unpack_from(data, position)
        end = position + RECORD_HEAD.size + length
        if length < RECORD_BODY.size or end > intact or data[end - 1] != 0:
            return False
        position = end
    return True


def _dropped_sector(data: bytes, start: int, end: int) -> bool:
    """Does [start, end) hold a piece that ends at a sector boundary, is at least 4 bytes
    long and is all zeros: a sector written back before the append reached it, kept by a
    power loss that dropped its newer version and kept a later sector?"""
    boundary = (start // SECTOR + 1) * SECTOR
    while boundary <= end:
        piece = data[max(start, boundary - SECTOR):boundary]
        if len(piece) >= 4 and not piece.strip(b"\0"):
            return True
        boundary += SECTOR
    return False


def replay(path: Path) -> tuple[list[Commit], int]:
    """Read one journal: its valid records, and how many bytes of a torn tail were ignored.
    Damage that is no torn tail raises CorruptStateError (header) or CorruptRecordError."""
    found = scan(path)
    if found.header_damaged:
        raise CorruptStateError(path, f"{found.problem}; `python -m channel_engine recover` "
                                      "on the channel's home repairs it", 0)
    if found.damaged:
        raise CorruptRecordError(
            path, found.valid_bytes,
            f"{found.problem}, and {len(found.after)} intact record(s) follow: commits that "
            "returned are unreadable; `python -m channel_engine recover` on the channel's "
            f"home cuts the journal here (the original is kept as {path.name}{DAMAGED_SUFFIX})")
    return found.commits, found.ignored


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

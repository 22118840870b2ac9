"""SegmentFile: a segment's `.log` file with its two indexes, and the bookkeeping of its batches.

The state a segment's parts share (LogSegment in segment.py is the whole, and
owns one of these): the open descriptor, the counters a walk over the batches
keeps (valid size, next offset, largest timestamp, the sparse index rule of
Kafka's LogSegment), the file's length and durability (trim, cut, fdatasync), and
deleting and closing. Its collaborators work on it: SegmentReader
(segment_reader.py: lookups, reads, the repair at use of the indexes) and
SegmentRecovery (segment_recovery.py: opening, recovery, repairs); their fields
`fd`, `length_dirty`, `index_lock` and `index_generation` are shared with them.
The bytes of a batch are record_batch.py's; the file is batches back to back from
byte 0 (segment.py has the layout of the three files). This module writes no
format of its own: only a transactional batch's commit stamp (mark_committed: the
4-byte partitionLeaderEpoch field, outside the CRC, set to record_batch's
COMMITTED_EPOCH) and the file's length. File names: filenames.segment_file.

Zero-fill ahead (fsync durability). An fdatasync that extends a file, or that first
writes into fallocate'd (unwritten) extents, must commit the file's size and extents
to the filesystem journal as well as the data; one that overwrites blocks already
written only flushes the data (on this project's ext4 disk, 20 KB: ~270 us against
~160 us; SQLite's reused WAL wins this way). So in fsync durability an append that
comes within ZERO_FILL_BYTES / 2 of `zeroed_to` (the end of the bytes known written,
batches or zeros) first writes real zero bytes from there up to ZERO_FILL_BYTES past
the batch's end (4 KiB aligned, never past segment_bytes): the commit's fdatasync
that follows carries them once, and the commits after it overwrite zeros. The zeros
are the same zero tail as Kafka's preallocation (segment.py's layout): recovery cuts
them after a crash (ZERO_TAIL_CUT, no loss), roll and clean close trim them, and the
space they hold is visible as file_size - size (SegmentInfo.preallocated,
LogStatus's preallocated_bytes): at most ZERO_FILL_BYTES + 4 KiB per active segment,
bounded and already counted by statvfs, so the disk guard sees it. If the zeros
cannot be written (a full disk) the file is cut back and the batch is appended
without them: preallocation never refuses a put; after a full disk no zeros are
tried until statvfs shows room for them, looked at once a second at most
(log/zero_fill.py, which writes them for the commit journal too).

SegmentConfig is the part of LogConfig a segment needs, passed whole
(SegmentConfig.of(log_config)), so no caller spells out its fields.

Concurrency: not thread-safe for writers; the partition log holds its lock around
every call that changes the file or the counters. `index_lock` is taken around
index work (append's tracking, seal, truncate_file, flush_indexes) so a repair at
use in a reader's thread (segment_reader.py) sees the indexes whole.

Failures: OSError from the file calls propagates unchanged; the caller (the
partition log) decides whether it takes the log offline. create() leaves no
half-made segment behind.
"""
from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from channel_engine.errors import InvalidBatch
from channel_engine.filenames import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    segment_file,
)
from channel_engine.log.config import LogConfig
from channel_engine.log.file_identity import path_identity
from channel_engine.log.offset_index import OffsetIndex
from channel_engine.log.record_batch import (
    COMMITTED_EPOCH,
    HEADER_SIZE,
    LEADER_EPOCH_AT,
    BatchHeader,
    check_batch,
    check_crc,
    check_header,
)
from channel_engine.log.time_index import TimeIndex
from channel_engine.log.zero_fill import ZeroFill

READ_CHUNK = 1 << 20
FIRST_READ_CHUNK = 64 * 1024  # a read's first chunk: a small take must not copy a whole MiB
ZERO_FILL_BYTES = 1 << 20  # zeros kept ahead of the append point in fsync durability
PAGE = 4096
COMMITTED_EPOCH_BYTES = COMMITTED_EPOCH.to_bytes(4, "big", signed=True)
NO_TIMESTAMP = -1


@dataclass(frozen=True)
class SegmentConfig:
    """The settings a segment uses, taken from the log's LogConfig (see there for each)."""

    index_max_bytes: int  # LogConfig.segment_index_bytes
    index_interval_bytes: int  # LogConfig.index_interval_bytes
    preallocate_bytes: int = 0  # LogConfig.segment_bytes when LogConfig.preallocate, else 0
    zero_fill_bytes: int = 0  # ZERO_FILL_BYTES in fsync durability, else 0 (module doc)
    zero_fill_limit: int = 0  # LogConfig.segment_bytes: zeros never go past it

    @classmethod
    def of(cls, config: LogConfig) -> SegmentConfig:
        """The segment settings of a log's config."""
        return cls(config.segment_index_bytes, config.index_interval_bytes,
                   config.segment_bytes if config.preallocate else 0,
                   ZERO_FILL_BYTES if config.durability == "fsync" else 0, config.segment_bytes)


@dataclass(frozen=True)
class ScanResult:
    """How a walk over a segment's batches ended, and where intact batches resume after
    damage (recover only): the next valid batch's position and header, and the end of the
    file's non-zero bytes."""

    valid_bytes: int
    batches: int
    problem: InvalidBatch | None
    resume_at: int | None = None
    resume_header: BatchHeader | None = None
    data_end: int = 0
    base_offsets_fixed: tuple[tuple[int, int, int], ...] = ()  # (position, was, now)


class SegmentFile:
    """A segment's files and the bookkeeping of its valid batches: the state its reader and
    recovery share (see the module doc)."""

    def __init__(self, directory: Path, base_offset: int, config: SegmentConfig, *,
                 writable: bool) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.index_interval_bytes = config.index_interval_bytes
        self.writable = writable
        self.log_path = segment_file(directory, base_offset, LOG_SUFFIX)
        self.offset_index = OffsetIndex(
            segment_file(directory, base_offset, INDEX_SUFFIX), base_offset,
            config.index_max_bytes, writable,
        )
        self.time_index = TimeIndex(
            segment_file(directory, base_offset, TIME_INDEX_SUFFIX), base_offset,
            config.index_max_bytes, writable,
        )
        self.fd = -1  # the .log, open for the segment's life
        self.identity = (0, 0)  # (st_dev, st_ino) of the .log we hold open
        self._log_name: tuple[Path | None, bytes] = (None, b"")  # log_path, encoded (gone)
        self.size = 0
        self.file_size = 0
        self.zeroed_to = 0  # bytes from 0 known written, batches or zeros (zero-fill ahead)
        self.zero_fill = ZeroFill()  # writes them; holds off while the disk is full
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset - 1
        self.first_batch_timestamp: int | None = None
        self.bytes_since_last_index_entry = 0
        self.durable_size = 0  # valid bytes known to be on disk (fdatasync returned)
        self.length_dirty = False  # the file was created, trimmed or cut since the last sync
        self.deleted = False
        self.delete_after_ms = 0
        self.sealed = False  # rolled: its time index ends with the final entry
        self.index_rebuilds = 0  # repairs at use after an index entry failed its check
        self.index_generation = 0  # bumped by each repair: a stale finding repairs nothing
        self.index_lock = threading.RLock()  # repair at use vs. append, roll, truncate
        self.misplaced_bases: set[int] = set()  # batches reads met with a damaged base field

    # -- creating and opening ---------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, base_offset: int, config: SegmentConfig) -> Self:
        """Create an empty segment, its file preallocated to config.preallocate_bytes if > 0."""
        seg = cls(directory, base_offset, config, writable=True)
        seg.fd = os.open(seg.log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        seg._note_identity(os.fstat(seg.fd))
        try:
            if config.preallocate_bytes > 0:
                os.posix_fallocate(seg.fd, 0, config.preallocate_bytes)
                seg.file_size = config.preallocate_bytes
            seg.offset_index.create_empty()
            seg.time_index.create_empty()
        except OSError:
            seg.delete_files()  # leave no half-made segment behind to block the next try
            raise
        seg.length_dirty = True  # the new file itself must reach the disk on the next flush
        return seg

    @classmethod
    def open(cls, directory: Path, base_offset: int, config: SegmentConfig, *,
             writable: bool) -> Self:
        """Open an existing segment file; call load_clean, rebuild_indexes or recover next."""
        seg = cls(directory, base_offset, config, writable=writable)
        seg.fd = os.open(seg.log_path, os.O_RDWR if writable else os.O_RDONLY)
        found = os.fstat(seg.fd)
        seg.file_size = seg.zeroed_to = found.st_size
        seg._note_identity(found)
        return seg

    def _note_identity(self, found: os.stat_result) -> None:
        self.identity = (found.st_dev, found.st_ino)

    # -- walking the batches --------------------------------------------------------
    def scan(self, limit: int, verify_from: int | None) -> ScanResult:
        """Walk batches from byte 0 to `limit`, rebuilding the indexes, up to the first invalid."""
        self._reset()
        result = self.walk(limit, verify_from)
        self.durable_size = min(self.durable_size, self.size)
        return result

    def walk(self, limit: int, verify_from: int | None) -> ScanResult:
        """Track the valid batches from self.size to `limit`; CRC-check from verify_from on."""
        problem = None
        batches = 0
        if limit > self.size:
            with mmap.mmap(self.fd, limit, access=mmap.ACCESS_READ) as buf:
                position = self.size
                while position < limit:
                    try:
                        header = check_batch(buf, position, limit, self.next_offset, False)
                        if verify_from is not None and header.last_offset >= verify_from:
                            check_crc(buf, position, header)
                    except InvalidBatch as exc:
                        # a fresh exception: the caught one's traceback pins views of the mmap
                        problem = InvalidBatch(exc.kind, exc.reason)
                        break
                    self.track(header, position)
                    position += header.size
                    batches += 1
        return ScanResult(self.size, batches, problem)

    def _reset(self) -> None:
        self.offset_index.reset()
        self.time_index.reset()
        self.size = 0
        self.next_offset = self.base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset - 1
        self.first_batch_timestamp = None
        self.bytes_since_last_index_entry = 0

    def track(self, header: BatchHeader, position: int) -> None:
        """Account for a valid batch at `position`: counters and the sparse index rule."""
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = header.max_timestamp
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset
        if self.bytes_since_last_index_entry > self.index_interval_bytes and not self.index_full:
            self.offset_index.append(header.last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += header.size
        self.size = position + header.size
        self.next_offset = header.next_offset

    # -- appending: the index rule, sealing -----------------------------------------
    @property
    def index_full(self) -> bool:
        """True when an index has only the slot left that roll and close need."""
        return self.offset_index.is_full or self.time_index.is_full

    def gone(self) -> bool:
        """True unless the .log's path still names the file we hold open (one statx that
        reads no timestamp: file_identity.py says why): the file or its directory was
        deleted, replaced or unmounted under us."""
        path = self.log_path
        if self._log_name[0] is not path:  # encoded once per path, not once per append
            self._log_name = (path, os.fsencode(path))
        try:
            return path_identity(self._log_name[1]) != self.identity
        except FileNotFoundError:
            return True

    def mark_committed(self, position: int) -> None:
        """Stamp the transactional batch at `position` committed: 4 bytes outside its CRC
        (partitionLeaderEpoch), made durable by the next fdatasync of this file."""
        os.pwrite(self.fd, COMMITTED_EPOCH_BYTES, position + LEADER_EPOCH_AT)

    def zero_fill_ahead(self, end: int) -> None:
        """Before a batch that ends at byte `end` is written: keep zeros written ahead of it
        (see the module doc). Best effort: a failure cuts the zeros off again, and after a
        full disk none are tried until it has room (zero_fill.py)."""
        chunk = self.config.zero_fill_bytes
        if not chunk or end + chunk // 2 <= self.zeroed_to:
            return
        start = max(self.zeroed_to, end)
        target = min(-(-(end + chunk) // PAGE) * PAGE, self.config.zero_fill_limit)
        if target <= start or not self.zero_fill.allows(self.fd, target - start):
            return  # the segment rolls before it could use them, or the disk is full
        written = self.zero_fill.write(self.fd, start, target)
        if written < target:
            try:
                os.ftruncate(self.fd, max(self.file_size, self.size))
                return
            except OSError:
                pass  # the zeros past the valid bytes are a zero tail: recovery cuts it
        self.zeroed_to = max(self.zeroed_to, written)
        self.file_size = max(self.file_size, written)

    def sync(self) -> None:
        """fdatasync the log file whatever changed (stamps do not change its size)."""
        os.fdatasync(self.fd)

    def on_become_inactive(self) -> None:
        """On roll: add the final time index entry, trim the preallocated tail, and make the
        indexes durable and close them (a sealed segment keeps one descriptor, its .log)."""
        with self.index_lock:
            self.add_final_time_entry()
            self.trim()
            for index in (self.offset_index, self.time_index):
                index.flush()
                index.close()
            self.sealed = True

    def add_final_time_entry(self) -> None:
        """Make the last time index entry hold the segment's largest timestamp (the slot kept
        for it: Kafka's skipFullCheck on roll, close and recovery)."""
        if self.size:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp,
                                         skip_full_check=True)

    def trim(self) -> None:
        """Cut the preallocated zero tail so the file length is the valid length."""
        if self.writable and self.file_size > self.size:
            os.ftruncate(self.fd, self.size)
            self.file_size = self.zeroed_to = self.size
            self.length_dirty = True

    def cut(self, position: int) -> None:
        """Writable: truncate the file at `position` (after its valid bytes) if longer."""
        if self.file_size != position and self.writable:
            os.ftruncate(self.fd, position)
            self.file_size = position
            self.zeroed_to = min(self.zeroed_to, position)
            self.length_dirty = True

    # -- length and durability ------------------------------------------------------
    @property
    def dirty(self) -> bool:
        """True if bytes or file length changed since the last flush."""
        return self.length_dirty or self.durable_size != self.size

    def flush_data(self) -> None:
        """fdatasync the log file if its bytes or length changed (the commit path)."""
        size, length_dirty = self.size, self.length_dirty
        if length_dirty or self.durable_size != size:
            self.length_dirty = False  # before the sync: a trim during it marks it again
            try:
                os.fdatasync(self.fd)
            except BaseException:
                self.length_dirty = self.length_dirty or length_dirty
                raise
            self.durable_size = size

    def flush(self) -> None:
        """fdatasync the log and fsync the indexes if anything changed.

        The commit path flushes data only: indexes are derived, and the ones a
        reopen trusts (segments below the persisted recovery point) are fsynced
        before that recovery point is written (PartitionLog.checkpoint_recovery_point)."""
        self.flush_data()
        self.flush_indexes()

    def flush_indexes(self) -> None:
        """fsync both index files if they changed (under the index lock: a repair at use may
        be reopening or closing them)."""
        with self.index_lock:
            self.offset_index.flush()
            self.time_index.flush()

    # -- reading one header ---------------------------------------------------------
    def header_at(self, position: int, expected_base: int | None) -> BatchHeader:
        """The checked header of the batch at `position`, which must end within the valid
        size (InvalidBatch otherwise)."""
        header = check_header(os.pread(self.fd, HEADER_SIZE, position), 0, expected_base)
        if position + header.size > self.size:
            raise InvalidBatch("partial", f"batch at byte {position} runs past byte {self.size}")
        return header

    def read_at(self, position: int, at_least: int, size_bound: int,
                chunk: int = READ_CHUNK) -> bytes:
        """At least `at_least` bytes from `position`, up to `chunk` within size_bound."""
        return os.pread(self.fd, max(at_least, min(chunk, size_bound - position)), position)

    # -- deleting and closing -------------------------------------------------------
    def paths(self) -> list[Path]:
        """The segment's three files."""
        return [self.log_path, self.offset_index.path, self.time_index.path]

    def rename_to_deleted(self) -> None:
        """Rename all three files to *.deleted; open descriptors keep reads working."""
        if self.log_path.exists():
            new = self.log_path.with_name(self.log_path.name + DELETED_SUFFIX)
            os.rename(self.log_path, new)
            self.log_path = new
        for index in (self.offset_index, self.time_index):
            index.rename(index.path.with_name(index.path.name + DELETED_SUFFIX))
        self.deleted = True

    def delete_files(self) -> None:
        """Close and unlink the segment's files."""
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.offset_index.delete()
        self.time_index.delete()

    def close(self) -> None:
        """Close the file descriptors."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.offset_index.close()
        self.time_index.close()

    def cut_to_durable(self) -> None:
        """After a failed fsync: cut the file back to its durable bytes and fsync it, so a
        batch whose commit failed does not come back after a reopen. Raises OSError."""
        os.ftruncate(self.fd, self.durable_size)
        self.file_size = self.zeroed_to = self.durable_size
        os.fsync(self.fd)

    def truncate_file(self, position: int) -> None:
        """Cut the data file at `position` (a batch boundary); rescan to rebuild the rest."""
        with self.index_lock:
            os.ftruncate(self.fd, position)
            self.file_size = position
            self.zeroed_to = min(self.zeroed_to, position)
            self.length_dirty = True
            self.scan(position, verify_from=None)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.log_path}, next_offset={self.next_offset}, "
                f"size={self.size})")


def same_bytes(path: Path, fd: int, start: int, end: int) -> bool:
    """True if `path` holds exactly bytes [start, end) of the file open as `fd`."""
    if path.stat().st_size != end - start:
        return False
    with open(path, "rb") as f:
        for chunk_start in range(start, end, READ_CHUNK):
            length = min(READ_CHUNK, end - chunk_start)
            if f.read(length) != os.pread(fd, length, chunk_start):
                return False
    return True


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    """pwrite all of `data` at `position` (pwrite may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written

"""LogSegment: one `<base>.log` of Kafka record batches with its `.index` and `.timeindex`.

The `.log` file is batches back to back (record_batch.py has the layout), the
first with base offset == the segment's base offset (its file name), each next
one starting at the offset after the previous. With preallocation the file is
longer than its valid bytes; the rest is zeros until a roll or a clean close
trims it.

Three ways to open a segment (loader.py picks):
  * load_clean(): after a clean shutdown, trust the file length, load the
    indexes, check them against the log (last entries point at real batches,
    the tail ends on a batch boundary) and say what is wrong, if anything;
    check_crcs() then CRC-checks every batch below that length;
  * rebuild_indexes(): walk the batch headers (no CRC) and rewrite both indexes;
  * recover(verify_from): walk every batch, checking CRC-32C from the given
    offset on, and rebuild the indexes up to the first invalid batch. A zero
    tail after the last batch is cut (preallocation: no data). Other damage is
    left in place and described: where it starts, and where intact batches
    resume after it (find_next_batch), so the loader can keep them.

Damage or a torn write (damaged_tail_end, for the loader's end of an unclean
log): a complete batch (its length fits the file, or, the length field being
outside the CRC, its CRC-32C holds over the bytes up to the end of the data)
none of whose pieces between 512-byte sector boundaries is all zeros was
written whole: damage, whose offsets its header (record count) gives. Power
loss loses whole sectors, so an unwritten part of a write reads as zeros (in a
preallocated file) or lies past the end of the file: a torn write.

A batch whose base offset field alone is damaged (the field lies outside the
CRC) keeps its offsets: recover rewrites the field in place in a writable
segment, and reads deliver it with the offsets its place holds
(fixable_base_offset: an intact batch where the batch with the expected base
offset belongs, not contradicted by an intact batch after it). Nothing is lost.

A read-only open repairs nothing: view_past_damage takes the intact batches
after a damaged region into its view of the file (reads skip the damage).

Damage (repair_damage, called by the loader of a writable log): the valid
prefix stays in this file; the intact batches after the damaged region move to a
new segment named by the first one's base offset; the damaged bytes are copied
aside into `<this .log>.damaged-<position>`, a file the engine never loads and
never deletes. Steps, each durable before the next (file fsync, rename,
directory fsync): (1) the damaged copy, (2) the new segment via a `.tmp` name,
(3) the cut of this file. A crash after any step leaves a state the next open
repairs the same way: after (1) the copy is made again (same name, same bytes);
after (2) the walk of this file meets, after the damage, a batch whose base
offset is at or above the next segment's base (its copy lives there), so only
the damaged region is copied aside and the file is cut; nothing is lost twice
and no batch is kept twice.

find_next_batch is the one resync rule (recovery, reads that meet damage, and
verify): the first byte position after the damage holding a header with magic
2, a length that fits, a base offset above the offset expected at the damage (the
damaged region held at least one batch; this also rejects a batch stored inside a
record that names an offset already passed), a CRC-32C that holds, and not
contradicted by the batch after it (a valid batch there must start at its next
offset; this rejects a batch whose base offset field is itself damaged when an
intact batch follows).

Indexes are never trusted at use either: find_position checks that the batch an
offset index entry points at has a valid header whose last offset is the entry's
(so its base offset is <= the target), and start_for_time checks a time index
entry against the batch it names. A wrong entry rebuilds both indexes from the
batch headers (repair_indexes, counted in index_rebuilds and logged) and the
lookup starts again; a lookup never skips a batch and never fails because of a
derived file.

Concurrency: not thread-safe for writers; the partition log holds its lock around
append, roll, truncate and recover. Readers may call find_position / read_batches
concurrently with one appender: they only look at bytes below a size and an
offset bound taken before they start, which cover complete batches only. A
repair at use runs in the reader's thread under the segment's index lock, which
append, roll and truncate_file also take around their index work; readers see
the old or the new entries whole (each is verified anyway).
"""
from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import (
    CorruptIndexError,
    CorruptRecordError,
    InvalidBatch,
    UndoFailedError,
)
from channel_engine.filenames import (
    DAMAGED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TMP_SUFFIX,
    segment_file,
)
from channel_engine.log.offset_index import OffsetIndex
from channel_engine.log.record_batch import (
    COMMITTED_EPOCH,
    HEADER_SIZE,
    LEADER_EPOCH_AT,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    BytesLike,
    check_batch,
    check_crc,
    check_header,
    is_zero,
    read_header,
)
from channel_engine.log.time_index import TimeIndex

logger = logging.getLogger(__name__)

READ_CHUNK = 1 << 20
COMMITTED_EPOCH_BYTES = COMMITTED_EPOCH.to_bytes(4, "big", signed=True)
NO_TIMESTAMP = -1
MAGIC_AT = 16  # byte of the magic in a batch header
MAGIC_BYTE = bytes([MAGIC])
SECTOR = 512  # the unit power loss tears writes at
TRAILING_ZEROS = 8  # zero bytes a batch may end with (empty headers, zero varints)


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


class LogSegment:
    """One segment of a partition log: data file plus offset and time indexes."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_max_bytes: int,
        index_interval_bytes: int,
        writable: bool,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.writable = writable
        self.log_path = segment_file(directory, base_offset, LOG_SUFFIX)
        self.offset_index = OffsetIndex(
            segment_file(directory, base_offset, INDEX_SUFFIX), base_offset, index_max_bytes,
            writable,
        )
        self.time_index = TimeIndex(
            segment_file(directory, base_offset, TIME_INDEX_SUFFIX), base_offset,
            index_max_bytes, writable,
        )
        self._fd = -1
        self.identity = (0, 0)  # (st_dev, st_ino) of the .log we hold open
        self.size = 0
        self.file_size = 0
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset - 1
        self.first_batch_timestamp: int | None = None
        self.bytes_since_last_index_entry = 0
        self.durable_size = 0  # valid bytes known to be on disk (fdatasync returned)
        self._length_dirty = False  # the file was created, trimmed or cut since the last sync
        self.deleted = False
        self.delete_after_ms = 0
        self.sealed = False  # rolled: its time index ends with the final entry
        self.index_rebuilds = 0  # repairs at use after an index entry failed its check
        self._index_generation = 0  # bumped by each repair: a stale finding repairs nothing
        self._index_lock = threading.RLock()  # repair at use vs. append, roll, truncate
        self.misplaced_bases: set[int] = set()  # batches reads met with a damaged base field

    # -- creating and opening ---------------------------------------------------------------
    @classmethod
    def create(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_max_bytes: int,
        index_interval_bytes: int,
        preallocate_bytes: int = 0,
    ) -> LogSegment:
        """Create an empty segment, its file preallocated to `preallocate_bytes` if > 0."""
        seg = cls(directory, base_offset, index_max_bytes=index_max_bytes,
                  index_interval_bytes=index_interval_bytes, writable=True)
        seg._fd = os.open(seg.log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        seg._note_identity(os.fstat(seg._fd))
        try:
            if preallocate_bytes > 0:
                os.posix_fallocate(seg._fd, 0, preallocate_bytes)
                seg.file_size = preallocate_bytes
            seg.offset_index._rewrite(b"")
            seg.time_index._rewrite(b"")
        except OSError:
            seg.delete_files()  # leave no half-made segment behind to block the next try
            raise
        seg._length_dirty = True  # the new file itself must reach the disk on the next flush
        return seg

    @classmethod
    def open(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_max_bytes: int,
        index_interval_bytes: int,
        writable: bool,
    ) -> LogSegment:
        """Open an existing segment file; call load_clean, rebuild_indexes or recover next."""
        seg = cls(directory, base_offset, index_max_bytes=index_max_bytes,
                  index_interval_bytes=index_interval_bytes, writable=writable)
        seg._fd = os.open(seg.log_path, os.O_RDWR if writable else os.O_RDONLY)
        found = os.fstat(seg._fd)
        seg.file_size = found.st_size
        seg._note_identity(found)
        return seg

    def _note_identity(self, found: os.stat_result) -> None:
        self.identity = (found.st_dev, found.st_ino)

    def load_clean(self) -> tuple[str, str] | None:
        """Open as left by a clean close; return (what, why) is wrong (index or log), or None."""
        self.size = self.durable_size = self.file_size
        try:
            self.offset_index.load()
            self.time_index.load()
        except CorruptIndexError as exc:
            return "index", exc.reason
        if self.size == 0:
            if len(self.offset_index) or len(self.time_index):
                return "index", "entries in the index of an empty segment"
            return None
        try:
            self._find_end_from_index()
            return self._check_time_index()
        except InvalidBatch as exc:
            return "log", exc.reason
        except CorruptRecordError as exc:  # a header walk from an index entry met damage
            return "log", exc.reason
        except CorruptIndexError as exc:
            return "index", exc.reason

    def check_crcs(self) -> str | None:
        """After load_clean: CRC-32C-check every batch below the valid size (headers are
        walked from byte 0); say where the first failing one is, or None."""
        if self.size == 0:
            return None
        position, expected = 0, self.base_offset
        with mmap.mmap(self._fd, self.size, access=mmap.ACCESS_READ) as buf:
            while position < self.size:
                try:
                    header = check_batch(buf, position, self.size, expected, True)
                except InvalidBatch as exc:
                    return f"byte {position}: {exc.kind}: {exc.reason}"
                position, expected = position + header.size, header.next_offset
        return None

    def _find_end_from_index(self) -> None:
        """Walk from the last offset index entry to the end of the file to find next_offset."""
        offset, position = self.offset_index.last_entry()
        if position >= self.size:
            raise CorruptIndexError(self.offset_index.path,
                                    f"last entry points at byte {position} >= log size {self.size}")
        header = self._header_at(position, None)
        if len(self.offset_index) and header.last_offset != offset:
            raise CorruptIndexError(
                self.offset_index.path,
                f"last entry says offset {offset} ends the batch at byte {position}, "
                f"the log says {header.last_offset}",
            )
        if not len(self.offset_index) and header.base_offset != self.base_offset:
            raise InvalidBatch("corrupt", f"first batch has base offset {header.base_offset}, "
                                          f"expected {self.base_offset}")
        self.first_batch_timestamp = self._header_at(0, self.base_offset).max_timestamp
        while True:
            position += header.size
            self.next_offset = header.next_offset
            if position == self.size:
                return
            header = self._header_at(position, self.next_offset)

    def _check_time_index(self) -> tuple[str, str] | None:
        last = self.time_index.last_entry()
        if last is None:
            return "index", "time index is empty for a non-empty segment"
        timestamp, offset = last
        if not self.base_offset <= offset < self.next_offset:
            return "index", f"time index points at offset {offset} outside the segment"
        position = self.find_position(offset, self.size)
        if position is None or self._header_at(position, None).max_timestamp != timestamp:
            return "index", f"time index entry ({timestamp}, {offset}) disagrees with the log"
        self.max_timestamp, self.offset_of_max_timestamp = timestamp, offset
        return None

    def rebuild_indexes(self) -> ScanResult:
        """Rewrite both indexes from the batch headers up to the current size (no CRC check)."""
        return self.scan(self.size or self.file_size, verify_from=None)

    def recover(self, verify_from: int) -> ScanResult:
        """Check every batch (CRC-32C from offset `verify_from` on) and rebuild the indexes up
        to the first invalid one; cut a zero tail (writable). On damage, say where intact
        batches resume (no cut: see repair_damage)."""
        result = self.scan(self.file_size, verify_from=verify_from)
        fixed: list[tuple[int, int, int]] = []
        while self.writable and result.problem is not None and self._fix_base_offset(fixed):
            more = self._walk(self.file_size, verify_from)  # on from the repaired batch
            result = replace(more, batches=result.batches + more.batches)
        return replace(self._describe_end(result), base_offsets_fixed=tuple(fixed))

    def _fix_base_offset(self, fixed: list[tuple[int, int, int]]) -> bool:
        """Writable: rewrite the base offset field of the batch at the valid end when only
        that field is wrong (fixable_base_offset); made durable by the next flush."""
        with mmap.mmap(self._fd, self.file_size, access=mmap.ACCESS_READ) as buf:
            was = fixable_base_offset(buf, self.size, self.file_size, self.next_offset)
        if was is None:
            return False
        os.pwrite(self._fd, self.next_offset.to_bytes(8, "big", signed=True), self.size)
        self._length_dirty = True  # bytes changed: the next flush_data must fdatasync
        fixed.append((self.size, was, self.next_offset))
        return True

    def true_base_offset(self, position: int, header: BatchHeader, expected: tuple[int, int],
                         size_bound: int) -> int | None:
        """For a read: the base offset the batch at `position` has when only its base offset
        field is damaged (fixable_base_offset, the exact offset taken from `expected` or
        from what follows the batch), else None. Notes the place in misplaced_bases."""
        after = position + header.size
        if after > size_bound:
            return None
        with mmap.mmap(self._fd, size_bound, access=mmap.ACCESS_READ) as buf:
            if expected[0] == expected[1]:
                exact = expected[0]
            elif after < size_bound:
                try:
                    exact = check_header(buf, after, None).base_offset - header.record_count
                except InvalidBatch:
                    return None
            elif after == self.size:
                exact = self.next_offset - header.record_count
            else:
                return None
            if not expected[0] <= exact <= expected[1] or \
                    fixable_base_offset(buf, position, size_bound, exact) is None:
                return None
        self.misplaced_bases.add(position)
        return exact

    def view_past_damage(self, result: ScanResult) -> ScanResult:
        """Read-only: take the intact batches after the damaged region `result` found into
        this view (the file is left as it is: reads skip the damage, log.read_batches),
        walking on from there; return how that walk ended, described as by recover."""
        assert result.resume_at is not None and result.resume_header is not None
        self.size, self.next_offset = result.resume_at, result.resume_header.base_offset
        self.bytes_since_last_index_entry = self.index_interval_bytes + 1  # index it
        more = self._walk(self.file_size, verify_from=self.next_offset)
        return self._describe_end(replace(more, batches=result.batches + more.batches))

    def _describe_end(self, result: ScanResult) -> ScanResult:
        """Cut a zero tail; for damage, find where intact batches resume (recover)."""
        problem = result.problem
        if problem is None or problem.kind == "zero_tail":
            self.cut(result.valid_bytes)
            return replace(result, data_end=result.valid_bytes)
        with mmap.mmap(self._fd, self.file_size, access=mmap.ACCESS_READ) as buf:
            found = find_next_batch(buf, result.valid_bytes + 1, self.file_size, self.next_offset)
            if found is None:
                return replace(result, data_end=data_end_of(buf, result.valid_bytes,
                                                            self.file_size))
            data_end = _end_of_batches(buf, found[0], self.file_size)
        return replace(result, resume_at=found[0], resume_header=found[1], data_end=data_end)

    def damaged_tail_end(self, data_end: int) -> int | None:
        """After damage at the valid end with no intact batch after it: one past the last
        offset of the complete, damaged batches found there (damaged_batches_end), or None
        when the bytes look like a torn write (see the module doc)."""
        if data_end <= self.size:
            return None
        with mmap.mmap(self._fd, self.file_size, access=mmap.ACCESS_READ) as buf:
            return damaged_batches_end(buf, self.size, data_end, self.next_offset)

    def cut(self, position: int) -> None:
        """Writable: truncate the file at `position` (after its valid bytes) if longer."""
        if self.file_size != position and self.writable:
            os.ftruncate(self._fd, position)
            self.file_size = position
            self._length_dirty = True

    def repair_damage(self, damaged_end: int, data_end: int, keep_damaged: bool,
                      split_base: int | None) -> list[Path]:
        """Repair the damage that starts at the valid end (self.size), crash-safely (see the
        module doc): copy bytes [size, damaged_end) aside when keep_damaged, move
        [damaged_end, data_end) into a new segment named split_base when given, then cut
        this file at its valid end. Returns the files written."""
        position = self.size
        written = []
        if keep_damaged and damaged_end > position:
            written.append(self._copy_out(position, damaged_end, damaged_file(self.log_path,
                                                                               position)))
        if split_base is not None and data_end > damaged_end:
            target = segment_file(self.directory, split_base, LOG_SUFFIX)
            written.append(self._copy_out(damaged_end, data_end, target))
        self.cut(position)
        os.fsync(self._fd)
        self._length_dirty = False
        return written

    def _copy_out(self, start: int, end: int, target: Path) -> Path:
        """Write bytes [start, end) of this file to `target` durably (temp name, fsync,
        rename, directory fsync); a damaged copy never replaces a different older one."""
        if target.name.startswith(f"{self.log_path.name}{DAMAGED_SUFFIX}-"):
            first, n = target, 1
            while target.exists():
                if _same_bytes(target, self._fd, start, end):
                    return target  # made by an earlier try of this repair that crashed
                target, n = first.with_name(f"{first.name}.{n}"), n + 1  # never replace one
        elif target.exists():  # the loader's bound rule keeps a split off existing segments
            raise FileExistsError(f"{target}: a split of {self.log_path} would replace it")
        tmp = target.with_name(target.name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for chunk_start in range(start, end, READ_CHUNK):
                data = os.pread(self._fd, min(READ_CHUNK, end - chunk_start), chunk_start)
                _pwrite_all(fd, data, chunk_start - start)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        fsync_directory(self.directory)
        return target

    def scan(self, limit: int, verify_from: int | None) -> ScanResult:
        """Walk batches from byte 0 to `limit`, rebuilding the indexes, up to the first invalid."""
        self._reset()
        result = self._walk(limit, verify_from)
        self.durable_size = min(self.durable_size, self.size)
        return result

    def catch_up(self) -> ScanResult:
        """Read-only: take in the batches another process appended after our valid end
        (CRC-checked; a batch still being written is left for the next call). A file that
        shrank (the writer truncated it) is walked again from the start."""
        file_size = os.fstat(self._fd).st_size
        if file_size < self.size:
            return self.scan(file_size, verify_from=None)
        self.file_size = file_size
        return self._walk(file_size, verify_from=self.next_offset)

    def _walk(self, limit: int, verify_from: int | None) -> ScanResult:
        """Track the valid batches from self.size to `limit`; CRC-check from verify_from on."""
        problem = None
        batches = 0
        if limit > self.size:
            with mmap.mmap(self._fd, limit, access=mmap.ACCESS_READ) as buf:
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
                    self._track(header, position)
                    position += header.size
                    batches += 1
        return ScanResult(self.size, batches, problem)

    def resume_after(self, position: int, size_bound: int,
                     expected: int) -> tuple[int, BatchHeader] | None:
        """The next intact batch after damage at `position`, below size_bound, whose base
        offset is above `expected` (find_next_batch), or None."""
        if size_bound <= position + 1:
            return None
        with mmap.mmap(self._fd, size_bound, access=mmap.ACCESS_READ) as buf:
            return find_next_batch(buf, position + 1, size_bound, expected)

    def _reset(self) -> None:
        self.offset_index.reset()
        self.time_index.reset()
        self.size = 0
        self.next_offset = self.base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset - 1
        self.first_batch_timestamp = None
        self.bytes_since_last_index_entry = 0

    # -- appending --------------------------------------------------------------------------
    def append(self, batch: bytes | bytearray, header: BatchHeader) -> int:
        """Write a batch at the end of the valid bytes; return its position. On an OSError the
        segment is unchanged (the partial write is undone) and the error is raised."""
        position = self.size
        try:
            _pwrite_all(self._fd, batch, position)
        except OSError as exc:
            try:
                self._undo_write(position, len(batch))
            except OSError as undo:
                raise UndoFailedError(f"{self.log_path}: cannot undo a failed write at byte "
                                      f"{position} ({undo}) after: {exc}") from exc
            raise
        with self._index_lock:
            self._track(header, position)
        self.file_size = max(self.file_size, self.size)
        return position

    def _track(self, header: BatchHeader, position: int) -> None:
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

    def _undo_write(self, position: int, length: int) -> None:
        if self.file_size > position:  # preallocated: put the zeros back
            _pwrite_all(self._fd, bytes(min(length, self.file_size - position)), position)
        else:
            os.ftruncate(self._fd, position)

    @property
    def index_full(self) -> bool:
        """True when an index has only the slot left that roll and close need."""
        return self.offset_index.is_full or self.time_index.is_full

    def gone(self) -> bool:
        """True unless the .log's path still names the file we hold open (one stat): the file
        or its directory was deleted, replaced or unmounted under us."""
        try:
            found = os.stat(str(self.log_path))
        except FileNotFoundError:
            return True
        return (found.st_dev, found.st_ino) != self.identity

    def mark_committed(self, position: int) -> None:
        """Stamp the transactional batch at `position` committed: 4 bytes outside its CRC
        (partitionLeaderEpoch), made durable by the next fdatasync of this file."""
        os.pwrite(self._fd, COMMITTED_EPOCH_BYTES, position + LEADER_EPOCH_AT)

    def sync(self) -> None:
        """fdatasync the log file whatever changed (stamps do not change its size)."""
        os.fdatasync(self._fd)

    def on_become_inactive(self) -> None:
        """On roll: add the final time index entry, trim the preallocated tail, and make the
        indexes durable and close them (a sealed segment keeps one descriptor, its .log)."""
        with self._index_lock:
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
            os.ftruncate(self._fd, self.size)
            self.file_size = self.size
            self._length_dirty = True

    # -- durability -------------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        """True if bytes or file length changed since the last flush."""
        return self._length_dirty or self.durable_size != self.size

    def flush_data(self) -> None:
        """fdatasync the log file if its bytes or length changed (the commit path)."""
        size, length_dirty = self.size, self._length_dirty
        if length_dirty or self.durable_size != size:
            self._length_dirty = False  # before the sync: a trim during it marks it again
            try:
                os.fdatasync(self._fd)
            except BaseException:
                self._length_dirty = self._length_dirty or length_dirty
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
        with self._index_lock:
            self.offset_index.flush()
            self.time_index.flush()

    # -- reading ----------------------------------------------------------------------------
    def _header_at(self, position: int, expected_base: int | None) -> BatchHeader:
        header = check_header(os.pread(self._fd, HEADER_SIZE, position), 0, expected_base)
        if position + header.size > self.size:
            raise InvalidBatch("partial", f"batch at byte {position} runs past byte {self.size}")
        return header

    def find_position(self, offset: int, size_bound: int) -> int | None:
        """Byte position of the batch holding `offset` (below size_bound), or None if none.
        Starts from a verified offset index entry; a wrong one is repaired, never followed."""
        for _ in range(3):
            found = self._find_from_index(offset, size_bound)
            if found is not _REPAIRED:
                return found  # type: ignore[return-value]
        return self._walk_to(offset, 0, size_bound, None)  # still racing a rewrite: no index

    def _find_from_index(self, offset: int, size_bound: int) -> int | None | object:
        """find_position from the index entry for `offset`; _REPAIRED if that entry was wrong."""
        index, generation = self.offset_index, self._index_generation
        slot = index.lookup_slot(offset)
        try:
            entry = index.entry(slot) if slot >= 0 else None
            if entry is not None and entry[1] >= size_bound:
                if entry[1] > self.size:  # no batch starts past the valid end
                    return self._repair(generation, index.path, f"entry ({entry[0]}, "
                                        f"{entry[1]}) points past the valid end {self.size}")
                slot = min(slot, index.slot_below_position(size_bound))  # appended meanwhile
                entry = index.entry(slot) if slot >= 0 else None
        except IndexError:  # the arrays were swapped by a repair meanwhile: look again
            return _REPAIRED
        if entry is None:
            return self._walk_to(offset, 0, size_bound, None)
        entry_offset, position = entry
        try:
            if position < 0:
                raise InvalidBatch("corrupt", "a negative position")
            header = self._header_at(position, None)
        except InvalidBatch as exc:
            return self._repair(generation, index.path, f"entry ({entry_offset}, {position}) "
                                                        f"points at no batch: {exc.reason}")
        if header.last_offset != entry_offset or header.base_offset < self.base_offset:
            return self._repair(generation, index.path,
                                f"entry ({entry_offset}, {position}) points at the batch of "
                                f"offsets {header.base_offset}..{header.last_offset}")
        return self._walk_to(offset, position, size_bound, header)

    def _walk_to(self, offset: int, position: int, size_bound: int,
                 header: BatchHeader | None) -> int | None:
        """Walk batch headers from `position` to the one holding `offset`."""
        while position < size_bound:
            if header is None:
                try:
                    header = self._header_at(position, None)
                except InvalidBatch as exc:
                    raise CorruptRecordError(self.log_path, position, exc.reason) from exc
            if header.last_offset >= offset:
                return position
            position += header.size
            header = None
        return None

    def start_for_time(self, timestamp: int) -> int:
        """First offset that may hold a record with a timestamp >= `timestamp`: the one after
        the last time index entry older than it, once that entry is verified against its
        batch (it must end at the entry's offset and hold the entry's timestamp)."""
        index = self.time_index
        for _ in range(3):
            generation = self._index_generation
            slot = index.lookup_slot(timestamp)
            if slot < 0:
                return self.base_offset
            try:
                entry_timestamp, entry_offset = index.entry(slot)
            except IndexError:
                continue  # swapped by a repair meanwhile
            problem = self._time_entry_problem(entry_timestamp, entry_offset)
            if problem is None:
                return entry_offset + 1
            self._repair(generation, index.path, problem)
        return self.base_offset  # no trusted entry: scan the whole segment

    def _time_entry_problem(self, timestamp: int, offset: int) -> str | None:
        what = f"time index entry ({timestamp}, {offset})"
        if not self.base_offset <= offset < self.next_offset:
            return f"{what} points outside offsets {self.base_offset}..{self.next_offset - 1}"
        try:
            position = self.find_position(offset, self.size)
            header = self._header_at(position, None) if position is not None else None
        except (InvalidBatch, CorruptRecordError) as exc:
            return f"{what}: {exc}"
        if header is None or header.last_offset != offset or header.max_timestamp != timestamp:
            found = "no batch" if header is None else (
                f"the batch ending at {header.last_offset} with max timestamp "
                f"{header.max_timestamp}")
            return f"{what} disagrees with the log: {found}"
        return None

    def _repair(self, generation: int, path: Path, reason: str) -> object:
        self.repair_indexes(f"{path}: {reason}", generation)
        return _REPAIRED

    def repair_indexes(self, reason: str, generation: int | None = None) -> None:
        """Rebuild both indexes from the batch headers because `reason` showed an entry wrong
        at use: swapped whole in memory, rewritten and fsynced on disk when writable. Batches
        past a damaged one keep their old entries that still check out. With `generation`
        (the one the finding was made in), nothing is done if another repair came first."""
        with self._index_lock:
            if generation is not None and generation != self._index_generation:
                return
            logger.warning("%s: rebuilding the indexes of %s from the log", reason,
                           self.log_path)
            offsets, times = self._entries_from_headers()
            for index, entries in ((self.offset_index, offsets), (self.time_index, times)):
                was_open = index._fd is not None
                try:
                    index.replace_entries(entries)  # memory first: lookups are right from here
                    index.flush()
                except OSError as exc:  # the file stays wrong: checked again at use and open
                    logger.warning("%s: cannot rewrite the rebuilt index: %s", index.path, exc)
                finally:
                    if not was_open:
                        index.close()  # a sealed segment keeps one descriptor, its .log
            self.index_rebuilds += 1
            self._index_generation += 1

    def _entries_from_headers(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Index entries by the rule of _track, for the batches from byte 0 to the valid end
        (old entries kept past a batch that fails its header check)."""
        offsets: list[tuple[int, int]] = []
        times: list[tuple[int, int]] = []
        offset_room = self.offset_index.max_entries - 1
        time_room = self.time_index.max_entries - 1
        since, max_ts, offset_of_max = 0, NO_TIMESTAMP, self.base_offset - 1
        size = min(self.size, os.fstat(self._fd).st_size)  # mmap refuses to map past the end
        position, expected = 0, self.base_offset
        with mmap.mmap(self._fd, size, access=mmap.ACCESS_READ) if size else _NoMap() as buf:
            while position < size:
                try:
                    header = check_header(buf, position, expected)
                except InvalidBatch:
                    break
                if position + header.size > size:
                    break
                if header.max_timestamp > max_ts:
                    max_ts, offset_of_max = header.max_timestamp, header.last_offset
                if since > self.index_interval_bytes and len(offsets) < offset_room \
                        and len(times) < time_room:
                    offsets.append((header.last_offset, position))
                    if max_ts > (times[-1][0] if times else NO_TIMESTAMP):
                        times.append((max_ts, offset_of_max))
                    since = 0
                since += header.size
                position += header.size
                expected = header.next_offset
        if position < size:
            offsets += self._old_offset_entries_past(position, offsets)
            times += [e for e in self._old_time_entries() if e[1] >= expected
                      and e[0] > (times[-1][0] if times else NO_TIMESTAMP)]
        elif max_ts > (times[-1][0] if times else NO_TIMESTAMP) and (
                self.sealed or len(times) < time_room):
            times.append((max_ts, offset_of_max))  # the final entry, as roll and recovery add
        return offsets, times

    def _old_offset_entries_past(self, position: int,
                                 kept: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Old offset index entries past `position` whose batch still checks out."""
        out: list[tuple[int, int]] = []
        index = self.offset_index
        for i in range(len(index)):
            offset, at = index.entry(i)
            last = out[-1] if out else (kept[-1] if kept else (-1, -1))
            if at <= position or offset <= last[0] or at <= last[1]:
                continue
            try:
                if self._header_at(at, None).last_offset == offset:
                    out.append((offset, at))
            except InvalidBatch:
                continue
        return out

    def _old_time_entries(self) -> list[tuple[int, int]]:
        index = self.time_index
        return [index.entry(i) for i in range(len(index))]

    def headers(self, offset: int) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of the batches from the one holding `offset` to the valid end,
        without reading the records (for scans that open already checked)."""
        position = self.find_position(offset, self.size)
        if position is not None:
            yield from self.headers_at(position, self.size, None)

    def headers_at(self, position: int, size_bound: int, first_base: tuple[int, int] | None
                   ) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of the batches from `position` to size_bound, records unread;
        first_base checks offsets as in read_batches. Raises CorruptRecordError on damage."""
        expected = first_base
        while position < size_bound:
            try:
                header = self._header_at(position, None)
                if expected is not None:
                    header = self._checked_base(position, header, expected, size_bound)
            except InvalidBatch as exc:
                raise CorruptRecordError(self.log_path, position, exc.reason) from exc
            expected = (header.next_offset, header.next_offset)
            yield position, header
            position += header.size

    def read_batches(
        self, position: int, size_bound: int, offset_bound: int, max_bytes: int,
        first_base: tuple[int, int] | None = None,
    ) -> Iterator[tuple[int, BatchHeader, bytes]]:
        """Yield (position, header, bytes) of CRC-checked batches from `position` while their
        base offset is below offset_bound and they end within size_bound. The first batch is
        yielded whole; later ones only while the total stays within max_bytes. With
        first_base=(lo, hi) the offsets are checked too (their field lies outside the CRC):
        the first base offset within [lo, hi], each next one following the previous batch."""
        total = 0
        buf, buf_start = b"", position
        expected = first_base
        while position < size_bound:
            rel = position - buf_start
            if rel + HEADER_SIZE > len(buf):
                buf, buf_start, rel = self._read_at(position, HEADER_SIZE, size_bound), position, 0
            try:
                header = stored = check_header(buf, rel, None)
                if expected is not None:
                    header = self._checked_base(position, header, expected, size_bound)
                    expected = (header.next_offset, header.next_offset)
                if header.base_offset >= offset_bound:
                    return
                if position + header.size > size_bound:
                    raise InvalidBatch("partial", f"batch runs past byte {size_bound}")
                if rel + header.size > len(buf):
                    buf, buf_start = self._read_at(position, header.size, size_bound), position
                    rel = 0
                check_crc(buf, rel, header)
            except InvalidBatch as exc:
                raise CorruptRecordError(self.log_path, position, exc.reason) from exc
            if total and total + header.size > max_bytes:
                return
            total += header.size
            data = buf[rel:rel + header.size]
            if header is not stored:  # only its base offset field was damaged
                data = header.base_offset.to_bytes(8, "big", signed=True) + data[8:]
            yield position, header, data
            position += header.size

    def _checked_base(self, position: int, header: BatchHeader, expected: tuple[int, int],
                      size_bound: int) -> BatchHeader:
        """The header with the base offset its place holds; InvalidBatch when that is not
        its base offset and not only its base offset field is damaged."""
        if expected[0] <= header.base_offset <= expected[1]:
            return header
        exact = self.true_base_offset(position, header, expected, size_bound)
        if exact is None:
            raise InvalidBatch("corrupt", f"base offset {header.base_offset}, "
                                          f"expected {expected[0]}..{expected[1]}")
        return header._replace(base_offset=exact)

    def _read_at(self, position: int, at_least: int, size_bound: int) -> bytes:
        return os.pread(self._fd, max(at_least, min(READ_CHUNK, size_bound - position)), position)

    # -- deleting and closing ---------------------------------------------------------------
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
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.offset_index.close()
        self.time_index.close()

    def truncate_file(self, position: int) -> None:
        """Cut the data file at `position` (a batch boundary); rescan to rebuild the rest."""
        with self._index_lock:
            os.ftruncate(self._fd, position)
            self.file_size = position
            self._length_dirty = True
            self.scan(position, verify_from=None)

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path}, next_offset={self.next_offset}, size={self.size})"


_REPAIRED = object()  # find_position's marker: the entry was wrong, indexes rebuilt


class _NoMap:
    """Stands in for the mmap of an empty file (mmap refuses length 0)."""

    def __enter__(self) -> bytes:
        return b""

    def __exit__(self, *exc: object) -> None:
        return None

def find_next_batch(buf: bytes | bytearray | mmap.mmap, start: int, limit: int,
                    expected: int) -> tuple[int, BatchHeader] | None:
    """(position, header) of the first intact batch at or after byte `start` and within
    `limit` whose base offset is > `expected` (see the module doc for the rule)."""
    search = start + MAGIC_AT
    while True:
        at = buf.find(MAGIC_BYTE, search, limit)
        position, search = at - MAGIC_AT, at + 1
        if at < 0 or position + HEADER_SIZE > limit:
            return None
        try:
            header = check_batch(buf, position, limit, None, verify_crc=True)
        except InvalidBatch:
            continue
        if header.base_offset > expected and not _contradicted(buf, position, header, limit):
            return position, header


def damaged_batches_end(buf: BytesLike, position: int, data_end: int,
                        expected: int) -> int | None:
    """One past the last offset of the batches from `position` (where offset `expected`
    belongs) that are complete in `buf` and not torn (is_torn), read from their headers
    without their CRC-32C; None when the first one is not such a batch. Its base offset
    field may itself be damaged: the place says `expected`. `data_end`: where the file's
    non-zero bytes end."""
    end = None
    limit = len(buf)
    while position + HEADER_SIZE <= min(limit, data_end):
        header = _header_or_whole_rest(buf, position, data_end)
        if header is None:
            break
        if position + header.size > limit or is_torn(buf, position, header.size) or (
                end is not None and header.base_offset != expected) or \
                header.record_count > header.batch_length:
            break
        end = expected + header.record_count
        position, expected = position + header.size, end
    return end


def _header_or_whole_rest(buf: BytesLike, position: int, data_end: int) -> BatchHeader | None:
    """The header at `position` if its fields are sound and it fits; else, when the batch
    length field alone is wrong (it lies outside the CRC-32C), the header of a batch that ends where
    the non-zero bytes do (or a few zero bytes later) if its CRC-32C holds; else None."""
    try:
        header = check_header(buf, position, None)
        if position + header.size <= len(buf):
            return header
    except InvalidBatch:
        header = read_header(buf, position)
    if header.magic != MAGIC or header.record_count < 1 or \
            header.last_offset_delta != header.record_count - 1:
        return None
    for end in range(data_end, min(len(buf), data_end + TRAILING_ZEROS) + 1):
        whole = header._replace(batch_length=end - position - LOG_OVERHEAD)
        try:
            check_crc(buf, position, whole)
        except InvalidBatch:
            continue
        return whole
    return None


def is_torn(buf: BytesLike, position: int, size: int) -> bool:
    """True if a piece of the batch at `position` between sector boundaries is all zeros:
    a write the kernel never made durable (power loss loses whole sectors), not damage."""
    start = position
    while start < position + size:
        end = min(position + size, (start // SECTOR + 1) * SECTOR)
        if is_zero(buf, start, end):
            return True
        start = end
    return False


def fixable_base_offset(buf: BytesLike, position: int, limit: int,
                        expected: int) -> int | None:
    """The base offset stored in the batch at `position` when only that field is wrong: the
    batch is intact (CRC-32C, which does not cover the field), it sits where the batch
    with base offset `expected` belongs, and no intact batch after it contradicts that.
    None otherwise."""
    try:
        header = check_batch(buf, position, limit, None, verify_crc=True)
    except InvalidBatch:
        return None
    if header.base_offset == expected:
        return None
    if _contradicted(buf, position, header._replace(base_offset=expected), limit):
        return None
    return header.base_offset


def _contradicted(buf: BytesLike, position: int, header: BatchHeader, limit: int) -> bool:
    """True when a valid batch follows this one but does not start at its next offset."""
    after = position + header.size
    if after >= limit:
        return False
    try:
        following = check_batch(buf, after, limit, None, verify_crc=True)
    except InvalidBatch:
        return False
    return following.base_offset != header.next_offset


def _end_of_batches(buf: BytesLike, position: int, limit: int) -> int:
    """Where a zero tail starts after the valid batches from `position`, else `limit`
    (bytes after further damage are kept for the next repair)."""
    expected = None
    while position < limit:
        try:
            header = check_batch(buf, position, limit, expected, verify_crc=False)
        except InvalidBatch as exc:
            return position if exc.kind == "zero_tail" else limit
        position, expected = position + header.size, header.next_offset
    return limit


def data_end_of(buf: BytesLike, start: int, limit: int) -> int:
    """The end of the non-zero bytes in buf[start:limit] (a preallocated zero tail excluded)."""
    end = limit
    while end > start:
        chunk_start = max(start, end - READ_CHUNK)
        chunk = bytes(buf[chunk_start:end])
        stripped = chunk.rstrip(b"\0")
        if stripped:
            return chunk_start + len(stripped)
        end = chunk_start
    return start


def damaged_file(log_path: Path, position: int) -> Path:
    """Where the damaged bytes found at `position` of a .log are kept."""
    return log_path.with_name(f"{log_path.name}{DAMAGED_SUFFIX}-{position}")


def _same_bytes(path: Path, fd: int, start: int, end: int) -> bool:
    """True if `path` holds exactly bytes [start, end) of the file open as `fd`."""
    if path.stat().st_size != end - start:
        return False
    with open(path, "rb") as f:
        for chunk_start in range(start, end, READ_CHUNK):
            length = min(READ_CHUNK, end - chunk_start)
            if f.read(length) != os.pread(fd, length, chunk_start):
                return False
    return True


def _pwrite_all(fd: int, data: bytes | bytearray, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written

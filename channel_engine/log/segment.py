"""LogSegment: one `<base>.log` of Kafka record batches with its `.index` and `.timeindex`.

The three files of a segment whose base offset (its first offset) is B, named by
filenames.segment_file (20-digit zero-padded B):

| file            | content                                                  | spec            |
|-----------------|----------------------------------------------------------|-----------------|
| `<B>.log`       | record batches back to back from byte 0, magic byte 2 at | record_batch.py |
|                 | byte 16 of each; the first has base offset B, each next  |                 |
|                 | one starts at the offset after the previous              |                 |
| `<B>.index`     | sparse (relative offset, position) entries, 8 bytes each | offset_index.py |
| `<B>.timeindex` | sparse (timestamp, relative offset) entries, 12 bytes    | time_index.py   |

No header of its own: the version is each batch's magic byte, and the indexes are
derived data, rebuilt from the `.log` whenever they disagree with it. With
preallocation (Kafka's `preallocate`, or the zero-fill ahead of fsync durability:
segment_file.py) the `.log` is longer than its valid bytes; the rest is zeros until
a roll or a clean close trims it, or a recovery after a crash cuts it.

A LogSegment owns its parts, each in its module, and delegates to them:
  * segment_file.py: SegmentFile, the state they share: the files, the walk that
    tracks the batches and the sparse index rule, length and durability, delete
    and close (SegmentConfig, ScanResult);
  * segment_reader.py: SegmentReader, finding offsets and times, reading batches,
    the repair at use of an index entry found wrong;
  * segment_recovery.py: SegmentRecovery, opening after a clean close or a crash,
    repairing damage;
  * damage.py: the pure rules that tell damage from a torn write and find where
    intact batches resume;
  * here: appending, the one write path of new batches.

Concurrency: not thread-safe for writers; the partition log holds its lock around
append, roll, truncate and recover. Readers may read concurrently with one
appender (segment_reader.py says how).

Failures: append undoes a partial write and raises the OSError, leaving the segment
unchanged; if the undo fails too it raises UndoFailedError (the partition log then
goes offline).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from channel_engine.errors import UndoFailedError
from channel_engine.log.damage import find_next_batch, fixable_base_offset
from channel_engine.log.offset_index import OffsetIndex
from channel_engine.log.record_batch import BatchHeader
from channel_engine.log.segment_file import ScanResult, SegmentConfig, SegmentFile

# looked up here at each call: the crash tests wrap it (tests/engine/crash_writer.py)
from channel_engine.log.segment_file import pwrite_all as _pwrite_all
from channel_engine.log.segment_reader import SegmentReader
from channel_engine.log.segment_recovery import SegmentRecovery
from channel_engine.log.time_index import TimeIndex

__all__ = ["LogSegment", "ScanResult", "SegmentConfig", "find_next_batch",
           "fixable_base_offset"]


class LogSegment:
    """One segment of a partition log: data file plus offset and time indexes."""

    def __init__(self, file: SegmentFile) -> None:
        self.file = file
        self.reader = SegmentReader(file)
        self.recovery = SegmentRecovery(file, self.reader.find_position)

    # -- creating and opening ---------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, base_offset: int, config: SegmentConfig) -> LogSegment:
        """Create an empty segment, its file preallocated to config.preallocate_bytes if > 0."""
        return cls(SegmentFile.create(directory, base_offset, config))

    @classmethod
    def open(cls, directory: Path, base_offset: int, config: SegmentConfig, *,
             writable: bool) -> LogSegment:
        """Open an existing segment file; call load_clean, rebuild_indexes or recover next."""
        return cls(SegmentFile.open(directory, base_offset, config, writable=writable))

    # -- appending --------------------------------------------------------------------------
    def append(self, batch: bytes | bytearray, header: BatchHeader) -> int:
        """Write a batch at the end of the valid bytes; return its position. On an OSError the
        segment is unchanged (the partial write is undone) and the error is raised."""
        file = self.file
        position = file.size
        file.zero_fill_ahead(position + len(batch))
        try:
            _pwrite_all(file.fd, batch, position)
        except OSError as exc:
            try:
                self._undo_write(position, len(batch))
            except OSError as undo:
                raise UndoFailedError(f"{file.log_path}: cannot undo a failed write at byte "
                                      f"{position} ({undo}) after: {exc}") from exc
            raise
        with file.index_lock:
            file.track(header, position)
        file.file_size = max(file.file_size, file.size)
        file.zeroed_to = max(file.zeroed_to, file.size)
        return position

    def _undo_write(self, position: int, length: int) -> None:
        file = self.file
        if file.file_size > position:  # preallocated: put the zeros back
            _pwrite_all(file.fd, bytes(min(length, file.file_size - position)), position)
        else:
            os.ftruncate(file.fd, position)

    # -- what the rest of the log reads (SegmentFile's counters) -----------------------------
    @property
    def base_offset(self) -> int:
        """The segment's first offset (its name)."""
        return self.file.base_offset

    @property
    def next_offset(self) -> int:
        """The offset after the segment's last valid batch."""
        return self.file.next_offset

    @property
    def size(self) -> int:
        """Valid bytes: the batches from byte 0 up to the first invalid one."""
        return self.file.size

    @property
    def file_size(self) -> int:
        """The .log's length (longer than size when preallocated)."""
        return self.file.file_size

    @property
    def durable_size(self) -> int:
        """Valid bytes known to be on disk."""
        return self.file.durable_size

    @property
    def dirty(self) -> bool:
        """True if bytes or file length changed since the last flush."""
        return self.file.dirty

    @property
    def identity(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the .log the segment holds open."""
        return self.file.identity

    @property
    def log_path(self) -> Path:
        """The .log file (renamed to *.deleted by rename_to_deleted)."""
        return self.file.log_path

    @property
    def offset_index(self) -> OffsetIndex:
        """The sparse offset index."""
        return self.file.offset_index

    @property
    def time_index(self) -> TimeIndex:
        """The sparse time index."""
        return self.file.time_index

    @property
    def max_timestamp(self) -> int:
        """The largest timestamp of the valid batches (-1 when empty)."""
        return self.file.max_timestamp

    @property
    def offset_of_max_timestamp(self) -> int:
        """The last offset of the batch holding max_timestamp."""
        return self.file.offset_of_max_timestamp

    @property
    def first_batch_timestamp(self) -> int | None:
        """The first batch's max timestamp (segment_ms counts from it), None when empty."""
        return self.file.first_batch_timestamp

    @property
    def index_full(self) -> bool:
        """True when an index has only the slot left that roll and close need."""
        return self.file.index_full

    @property
    def index_rebuilds(self) -> int:
        """Repairs at use after an index entry failed its check."""
        return self.file.index_rebuilds

    @property
    def misplaced_bases(self) -> set[int]:
        """Positions of batches reads met with a damaged base offset field."""
        return self.file.misplaced_bases

    @property
    def writable(self) -> bool:
        """Opened for writing."""
        return self.file.writable

    @property
    def deleted(self) -> bool:
        """Renamed to *.deleted by retention."""
        return self.file.deleted

    @property
    def delete_after_ms(self) -> int:
        """When retention may unlink the renamed files."""
        return self.file.delete_after_ms

    @delete_after_ms.setter
    def delete_after_ms(self, when: int) -> None:
        self.file.delete_after_ms = when

    # -- the file: length, durability, deleting (segment_file.py) ---------------------------
    def scan(self, limit: int, verify_from: int | None) -> ScanResult:
        """Walk batches from byte 0 to `limit`, rebuilding the indexes, up to the first invalid."""
        return self.file.scan(limit, verify_from)

    def gone(self) -> bool:
        """True unless the .log's path still names the file we hold open (one statx)."""
        return self.file.gone()

    def mark_committed(self, position: int) -> None:
        """Stamp the transactional batch at `position` committed (4 bytes outside its CRC)."""
        self.file.mark_committed(position)

    def sync(self) -> None:
        """fdatasync the log file whatever changed (stamps do not change its size)."""
        self.file.sync()

    def on_become_inactive(self) -> None:
        """On roll: add the final time index entry, trim, make the indexes durable and close
        them."""
        self.file.on_become_inactive()

    def add_final_time_entry(self) -> None:
        """Make the last time index entry hold the segment's largest timestamp."""
        self.file.add_final_time_entry()

    def trim(self) -> None:
        """Cut the preallocated zero tail so the file length is the valid length."""
        self.file.trim()

    def flush_data(self) -> None:
        """fdatasync the log file if its bytes or length changed (the commit path)."""
        self.file.flush_data()

    def flush(self) -> None:
        """fdatasync the log and fsync the indexes if anything changed."""
        self.file.flush()

    def flush_indexes(self) -> None:
        """fsync both index files if they changed."""
        self.file.flush_indexes()

    def cut_to_durable(self) -> None:
        """After a failed fsync: cut the file back to its durable bytes and fsync it."""
        self.file.cut_to_durable()

    def truncate_file(self, position: int) -> None:
        """Cut the data file at `position` (a batch boundary); rescan to rebuild the rest."""
        self.file.truncate_file(position)

    def paths(self) -> list[Path]:
        """The segment's three files."""
        return self.file.paths()

    def rename_to_deleted(self) -> None:
        """Rename all three files to *.deleted; open descriptors keep reads working."""
        self.file.rename_to_deleted()

    def delete_files(self) -> None:
        """Close and unlink the segment's files."""
        self.file.delete_files()

    def close(self) -> None:
        """Close the file descriptors."""
        self.file.close()

    # -- reading (segment_reader.py) --------------------------------------------------------
    def find_position(self, offset: int, size_bound: int) -> int | None:
        """Byte position of the batch holding `offset` (below size_bound), or None if none."""
        return self.reader.find_position(offset, size_bound)

    def start_for_time(self, timestamp: int) -> int:
        """First offset that may hold a record with a timestamp >= `timestamp`."""
        return self.reader.start_for_time(timestamp)

    def headers(self, offset: int) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of the batches from the one holding `offset` to the valid end."""
        return self.reader.headers(offset)

    def headers_at(self, position: int, size_bound: int, first_base: tuple[int, int] | None
                   ) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of the batches from `position` to size_bound, records unread."""
        return self.reader.headers_at(position, size_bound, first_base)

    def read_batches(
        self, position: int, size_bound: int, offset_bound: int, max_bytes: int,
        first_base: tuple[int, int] | None = None,
    ) -> Iterator[tuple[int, BatchHeader, bytes]]:
        """(position, header, bytes) of CRC-checked batches from `position` (see
        SegmentReader.read_batches)."""
        return self.reader.read_batches(position, size_bound, offset_bound, max_bytes,
                                        first_base)

    def repair_indexes(self, reason: str, generation: int | None = None) -> None:
        """Rebuild both indexes from the batch headers because `reason` showed an entry wrong."""
        self.reader.repair_indexes(reason, generation)

    # -- opening and repairing (segment_recovery.py) ----------------------------------------
    def load_clean(self) -> tuple[str, str] | None:
        """Open as left by a clean close; return (what, why) is wrong (index or log), or None."""
        return self.recovery.load_clean()

    def check_crcs(self) -> str | None:
        """After load_clean: CRC-32C-check every batch; say where the first failing one is."""
        return self.recovery.check_crcs()

    def rebuild_indexes(self) -> ScanResult:
        """Rewrite both indexes from the batch headers up to the current size (no CRC check)."""
        return self.recovery.rebuild_indexes()

    def recover(self, verify_from: int) -> ScanResult:
        """Check every batch (CRC-32C from `verify_from` on) and rebuild the indexes up to the
        first invalid one; on damage, say where intact batches resume."""
        return self.recovery.recover(verify_from)

    def view_past_damage(self, result: ScanResult) -> ScanResult:
        """Read-only: take the intact batches after the damaged region into this view."""
        return self.recovery.view_past_damage(result)

    def damaged_tail_end(self, data_end: int) -> int | None:
        """One past the last offset of the complete, damaged batches at the valid end, or
        None when the bytes look like a torn write."""
        return self.recovery.damaged_tail_end(data_end)

    def repair_damage(self, damaged_end: int, data_end: int, keep_damaged: bool,
                      split_base: int | None) -> list[Path]:
        """Repair the damage that starts at the valid end, crash-safely; the files written."""
        return self.recovery.repair_damage(damaged_end, data_end, keep_damaged, split_base)

    def catch_up(self) -> ScanResult:
        """Read-only: take in the batches another process appended after our valid end."""
        return self.recovery.catch_up()

    def resume_after(self, position: int, size_bound: int,
                     expected: int) -> tuple[int, BatchHeader] | None:
        """The next intact batch after damage at `position` (find_next_batch), or None."""
        return self.recovery.resume_after(position, size_bound, expected)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.log_path}, next_offset={self.next_offset}, "
                f"size={self.size})")

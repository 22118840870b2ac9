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
preallocation the `.log` is longer than its valid bytes; the rest is zeros until a
roll or a clean close trims it.

The class is assembled from one part per phase, each in its module:
  * segment_file.py: the files, the walk that tracks the batches and the sparse
    index rule, length and durability, delete and close (SegmentConfig, ScanResult);
  * segment_reader.py: finding offsets and times, reading batches, the repair at
    use of an index entry found wrong;
  * segment_recovery.py: opening after a clean close or a crash, repairing damage;
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

from channel_engine.errors import UndoFailedError
from channel_engine.log.damage import find_next_batch, fixable_base_offset
from channel_engine.log.record_batch import BatchHeader
from channel_engine.log.segment_file import ScanResult, SegmentConfig

# looked up here at each call: the crash tests wrap it (tests/engine/crash_writer.py)
from channel_engine.log.segment_file import pwrite_all as _pwrite_all
from channel_engine.log.segment_recovery import SegmentRecovery

__all__ = ["LogSegment", "ScanResult", "SegmentConfig", "find_next_batch",
           "fixable_base_offset"]


class LogSegment(SegmentRecovery):
    """One segment of a partition log: data file plus offset and time indexes."""

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

    def _undo_write(self, position: int, length: int) -> None:
        if self.file_size > position:  # preallocated: put the zeros back
            _pwrite_all(self._fd, bytes(min(length, self.file_size - position)), position)
        else:
            os.ftruncate(self._fd, position)

"""PartitionLog: the log of one partition, a directory of segments (Kafka's UnifiedLog + LocalLog).

Offsets: the log start offset is the first offset readers may see; the log end
offset (LEO) is the offset the next batch gets; the recovery point is the
first offset not known to be on disk; the high watermark is what readers see:
the recovery point in 'fsync' durability (never an event whose commit has not
returned), the LEO in 'policy' durability (the flush policy bounds the loss).

Append path, written once: build and check the batch (outside the lock) ->
check the directory -> roll if due -> assign the base offset -> write -> make
durable per the policy -> record the committed end in log.state (one 12-byte
pwrite in place, never an fsync: after the write in 'policy' durability, after
the group fsync in 'fsync' durability; the evidence of the log's end that
outlives its active segment, state.py). In 'fsync' durability, appenders that
arrive while an fsync runs share the next one (group commit): one leader flushes
everything written so far while the others wait; commit fsyncs run outside the
append lock (rare metadata fsyncs of roll, retention and truncation run under it). A roll
in 'policy' durability fdatasyncs the sealed segment (and the directory if a
segment was created since the last flush) before moving on, so the recovery
point reaches the new base, as Kafka's roll flushes up to the new segment; a
flush right after a roll also fsyncs the new segment's three files and the
directory entry.

Never acknowledged unless on disk in our directory: every append first checks
with one stat (about 1 us) that the active segment's path still names the file
the log holds open (st_dev, st_ino, noted when the segment was opened); every
group fsync checks the same after it returns. A directory deleted, replaced or
unmounted under the log, or one that refuses writes (EROFS, EACCES, EPERM),
fails the call with LogDirectoryError naming it and takes the log offline.

Retention (Kafka's): the oldest segments while the log exceeds retention_bytes or
their largest timestamp is older than retention_ms; when every event of the active
segment is older than retention_ms it is rolled and deleted too, and the new
active segment starts empty at the same log end.

The class is assembled from one part per phase, each in its module, lowest first:
log_core.py (state, checks, log.state), log_flush.py (group commit, flush policy),
log_append.py (the append path, roll), log_retention.py (retention), log_read.py
(reads); here: open, truncation, status and close. loader.py opens the segments.

Concurrency: thread-safe. Appends, roll, retention, truncation and close take
one lock; fsync runs outside it. Readers take no lock: they work on a snapshot
of the segment list and stop at the high watermark. One writer process per
directory: the writer holds an OS lock on `.lock`; readers (read_only=True)
take none and never write.

A failed write is undone (the segment is cut back) and reported; a failed roll
changes nothing; a failed fsync, a vanished or read-only directory, or any
failure that leaves the files and the in-memory state in doubt, takes the log
offline (Linux may already have dropped the dirty pages,
so no later fsync can be trusted): it tries to cut the unflushed bytes, and
every later call raises LogOfflineError until the directory is opened again,
which recovers it.

A read that meets a damaged batch (CRC, header) never fails and never skips
silently: it resumes at the next intact batch (damage.find_next_batch), records the
lost offsets once in take_new_losses() and stats()["read_damage"], and (writer only)
leaves a `<base>.repair` marker so the next writable open repairs the segment
(loader.py).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import (
    ChannelGoneError,
    OffsetOutOfRangeError,
    UnusableFileError,
)
from channel_engine.filenames import (
    LOCK_FILE,
    parse_segment_file,
)
from channel_engine.log import loader as log_loader
from channel_engine.log import record_batch
from channel_engine.log.config import LogConfig
from channel_engine.log.log_append import AppendResult
from channel_engine.log.log_core import DEFAULT_READ_BYTES
from channel_engine.log.log_read import LogReader
from channel_engine.log.log_retention import LogRetention, RetentionResult
from channel_engine.log.recovery import STRAY_MOVED, RecoveryAction
from channel_engine.log.segment import LogSegment
from channel_engine.log.state import LogState

__all__ = ["DEFAULT_READ_BYTES", "AppendResult", "PartitionLog", "RetentionResult",
           "SegmentInfo"]


@dataclass(frozen=True)
class SegmentInfo:
    """What an operator wants to know about one segment (the stat tool and the UI)."""

    base_offset: int
    next_offset: int
    records: int
    size: int
    file_size: int
    first_batch_timestamp: int | None
    max_timestamp: int
    index_entries: int
    time_index_entries: int
    preallocated: bool
    flushed: bool
    active: bool
    deletable: str | None


class PartitionLog(LogRetention, LogReader):
    """The log of one partition; see the module doc for the offsets and the guarantees."""

    # -- opening --------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        partition: int = 0,
        read_only: bool = False,
        force_recovery: bool = False,
        clock: Callable[[], float] = time.time,
        sealer: record_batch.Sealer | None = None,
        create: bool = True,
    ) -> PartitionLog:
        """Open (and create, unless read_only or not `create`) the partition log in
        `directory`; with a sealer, new batches are encrypted and encrypted ones can be read.
        create=False: a missing directory raises ChannelGoneError (its channel was deleted)."""
        path = Path(directory)
        log = cls(path, config or LogConfig(), partition, read_only, clock, sealer)
        lock_moved = None
        if not read_only:
            if create:
                _make_directory_durably(path)
            elif not os.path.lexists(path):  # a file in its place fails below, as ever
                raise ChannelGoneError(f"{path}: partition directory missing, not recreated "
                                       "(its channel was deleted); nothing written")
            lock_moved = log._take_dir_lock()
            identity = os.stat(path)
            log._dir_identity = (identity.st_dev, identity.st_ino)
        elif not path.is_dir():
            raise FileNotFoundError(f"{path}: no such partition directory" if not
                                    os.path.lexists(path) else f"{path}: not a directory")
        try:
            loaded = log_loader.load(path, log.config, not read_only, force_recovery)
        except BaseException:
            log._release_dir_lock()
            raise
        log._set_segments(loaded.segments)
        log._log_start_offset = loaded.log_start_offset
        log._log_end_offset = loaded.segments[-1].next_offset if loaded.segments \
            else loaded.log_start_offset
        log._committed_end = log._log_end_offset  # the loader wrote log.state with it
        if not read_only:
            try:
                log._restore_final_time_entry()
                log._open_state_file()
            except BaseException:
                log.close(clean=False)
                raise
        log._recovery_point = loaded.recovery_point
        log._persisted_state = LogState(loaded.log_start_offset, loaded.recovery_point,
                                        log._log_end_offset)
        log._last_flush_ms = log._last_state_write_ms = log._now_ms()
        log.last_recovery = loaded.report
        if lock_moved is not None:
            loaded.report.add(RecoveryAction(STRAY_MOVED, str(path / LOCK_FILE),
                                             f"not a regular file; moved to {lock_moved.name}"))
        log._new_losses = list(loaded.report.lost_ranges)
        for loss in log._new_losses if read_only else ():  # a reader's view keeps the
            log._read_damage[(parse_segment_file(Path(loss.path).name) or (-1, ""))[0],
                             loss.position] = loss  # damage its reads will skip
        return log

    def _restore_final_time_entry(self) -> None:
        """Recovery rebuilt the active segment's time index without its final entry (the
        largest timestamp): put it back, as Kafka's LogSegment.recover does."""
        active = self._segments[-1]
        if not active.time_index.is_full:
            active.add_final_time_entry()
            active.flush_indexes()

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- truncation -----------------------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Remove every event at or after `offset`. As in Kafka, the cut falls at the start of
        the batch holding `offset`; an offset in a gap between segments (offsets lost
        earlier) starts a new empty segment there, so the log end is never below it and no
        offset is handed out twice. Returns the new log end offset. Not for use while
        readers are reading above `offset`."""
        with self._flush_slot(), self._lock:
            self._check_writable()
            if offset >= self._log_end_offset:
                return self._log_end_offset
            if offset < self._log_start_offset:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, self._log_end_offset)
            self._truncations += 1  # appenders still waiting for an fsync must not succeed
            try:
                self._truncate(offset)
            except OSError as exc:
                raise self._go_offline(exc) from exc
            return self._log_end_offset

    def _truncate(self, offset: int) -> None:
        """truncate_to's file work; the in-memory offsets follow the files at each step."""
        keep = [s for s in self._segments if s.base_offset < offset] or [self._segments[0]]
        doomed = self._segments[len(keep):]
        self._set_segments(keep)
        segment = keep[-1]
        position = segment.find_position(offset, segment.size)
        if position is not None:
            segment.truncate_file(position)
        elif segment.next_offset < offset:  # a gap: its offsets were handed out once
            for dropped in doomed:  # one of them may start at `offset`
                dropped.delete_files()
            doomed = ()
            segment = self._start_segment_at(offset, keep)
        self._log_end_offset = segment.next_offset
        self._recovery_point = min(self._recovery_point, self._log_end_offset)
        self._committed_end = min(self._committed_end, self._log_end_offset)  # handed out again
        self._log_start_offset = min(self._log_start_offset, self._log_end_offset)
        for dropped in doomed:
            dropped.delete_files()
        segment.flush()
        fsync_directory(self.directory)
        self._write_state(clean=False)

    def _start_segment_at(self, offset: int, keep: list[LogSegment]) -> LogSegment:
        """truncate_to into a gap: a new empty active segment at `offset`, so the log end
        never goes below the target (an empty last segment is replaced)."""
        if keep[-1].size == 0:
            keep.pop().delete_files()
        elif keep:
            keep[-1].on_become_inactive()
        segment = LogSegment.create(self.directory, offset, self._segment_config)
        self._set_segments(keep + [segment])
        return segment

    # -- status ---------------------------------------------------------------------
    def segment_infos(self) -> list[SegmentInfo]:
        """One SegmentInfo per live segment, oldest first."""
        segments = self._segments
        if not segments:  # a reader of a directory whose segments are all unusable
            return []
        deletable = dict((id(seg), why) for seg, why in
                         self._retention_candidates(self._now_ms(), self.high_watermark))
        return [
            SegmentInfo(
                base_offset=seg.base_offset, next_offset=seg.next_offset,
                records=seg.next_offset - seg.base_offset, size=seg.size,
                file_size=seg.file_size, first_batch_timestamp=seg.first_batch_timestamp,
                max_timestamp=seg.max_timestamp, index_entries=len(seg.offset_index),
                time_index_entries=len(seg.time_index),
                preallocated=seg.file_size > seg.size,
                flushed=seg.next_offset <= self._recovery_point and not seg.dirty,
                active=seg is segments[-1], deletable=deletable.get(id(seg)))
            for seg in segments
        ]

    def stats(self) -> dict[str, Any]:
        """Plain JSON-serialisable facts about the log."""
        return {
            "directory": str(self.directory),
            "partition": self.partition,
            "durability": self.config.durability,
            "log_start_offset": self._log_start_offset,
            "log_end_offset": self._log_end_offset,
            "high_watermark": self.high_watermark,
            "recovery_point": self._recovery_point,
            "unflushed_events": self.unflushed_events,
            "size_bytes": self.size_bytes,
            "segments": len(self._segments),
            "last_flush_ms": self._last_flush_ms,
            "offline": str(self._offline) if self._offline else None,
            "index_rebuilds": self._index_rebuilds_dropped + sum(
                s.index_rebuilds for s in self._segments),
            "last_recovery": self.last_recovery.to_dict(),
            "read_damage": self.read_damage_stats(),
        }

    def read_damage_stats(self) -> dict[str, int]:
        """Damaged batches reads met since open: places and the offsets they lost."""
        losses = list(self._read_damage.values())
        return {"places": len(losses), "offsets_lost": sum(r.offsets for r in losses)}

    # -- closing --------------------------------------------------------------------
    def close(self, clean: bool = True) -> None:
        """Flush, trim, fsync and mark the shutdown clean, in that order; release the lock.
        clean=False writes nothing (the directory is no longer this log's: the next open
        recovers as after a crash)."""
        if self._closed:
            return
        with self._flush_slot(), self._lock:  # no append, flush or retention runs meanwhile
            if self._closed:
                return
            try:
                if clean and not self.read_only and self._offline is None:
                    self._close_cleanly()
            except OSError as exc:
                raise self._go_offline(exc) from exc  # no clean flag: the next open recovers
            finally:
                self._closed = True
                for segment in self._segments + tuple(self._pending_deletes):
                    segment.close()
                if self._state_fd >= 0:
                    os.close(self._state_fd)
                    self._state_fd = -1
                self._release_dir_lock()

    def _close_cleanly(self) -> None:
        """Trim, fsync files and directory, then write the clean flag. Caller holds the flush
        slot and the lock."""
        active = self._segments[-1]
        active.add_final_time_entry()
        active.trim()
        for segment in self._segments:
            segment.flush()
        for segment in self._pending_deletes:
            segment.delete_files()
        self._pending_deletes.clear()
        fsync_directory(self.directory)
        self._recovery_point = self._committed_end = self._log_end_offset
        self._write_state(clean=True)


def _make_directory_durably(path: Path) -> None:
    """Create `path` and its missing parents, fsyncing each new entry's parent directory, so a
    power loss cannot take a partition directory whose commits already returned."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in its place, say
        raise UnusableFileError(path, "a partition directory", exc) from exc
    for created in reversed(missing):
        fsync_directory(created.parent)

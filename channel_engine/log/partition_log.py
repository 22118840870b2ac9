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

Never acknowledged unless on disk in our directory: one statx (a few us; it reads
no timestamp: file_identity.py says why) checks that the active segment's path
still names the file the log holds open (st_dev, st_ino, noted when the segment
was opened): before each append in 'policy' durability, after each group fsync
(and before a roll) in 'fsync' durability (log_append.py says why one suffices). A
directory deleted, replaced or unmounted under the log, or one that refuses writes
(EROFS, EACCES, EPERM), fails the call with LogDirectoryError naming it and takes the
log offline.

Retention (Kafka's): the oldest segments while the log exceeds retention_bytes or
their largest timestamp is older than retention_ms; when every event of the active
segment is older than retention_ms it is rolled and deleted too, and the new
active segment starts empty at the same log end.

PartitionLog owns one part per phase, each in its module, over one shared
PartitionState (partition_state.py: segments, offsets, config, locks, the checks,
log.state), as ChannelOwner does over ChannelState: LogAppender (log_append.py:
the append path, roll), LogFlusher (log_flush.py: group commit, flush policy,
commit stamps), LogRetention (log_retention.py: retention, DeleteRecords) and
LogReader (log_read.py: reads, damage met by reads), LogTruncation
(log_truncate.py: truncate_to) and LogStatus (log_status.py: stats, segment
infos). Its public methods delegate to them; here: open, the append path's last
step (make durable) and close. loader.py opens the segments.

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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import ChannelGoneError, UnusableFileError
from channel_engine.event import Event, PendingEvent
from channel_engine.filenames import (
    INCARNATION_FILE,
    LOCK_FILE,
    TMP_SUFFIX,
    parse_segment_file,
    recreate_temp_dir,
)
from channel_engine.log import incarnation as incarnation_file
from channel_engine.log import loader as log_loader
from channel_engine.log import record_batch
from channel_engine.log.config import LogConfig
from channel_engine.log.incarnation import Incarnation
from channel_engine.log.log_append import AppendResult, LogAppender
from channel_engine.log.log_flush import LogFlusher
from channel_engine.log.log_read import DEFAULT_READ_BYTES, LogReader
from channel_engine.log.log_retention import LogRetention, RetentionResult
from channel_engine.log.log_status import LogStatus, SegmentInfo
from channel_engine.log.log_truncate import LogTruncation
from channel_engine.log.partition_state import PartitionState
from channel_engine.log.record_batch import BatchHeader
from channel_engine.log.recovery import STRAY_MOVED, LostRange, RecoveryAction, RecoveryReport
from channel_engine.log.segment import LogSegment
from channel_engine.log.state import LogState

__all__ = ["DEFAULT_READ_BYTES", "AppendResult", "PartitionLog", "RetentionResult",
           "SegmentInfo"]


class PartitionLog:
    """The log of one partition; see the module doc for the offsets and the guarantees."""

    def __init__(self, directory: Path, config: LogConfig, partition: int, read_only: bool,
                 clock: Callable[[], float], sealer: record_batch.Sealer | None = None) -> None:
        self.directory = directory
        self.config = config
        self.partition = partition
        self.read_only = read_only
        self.sealer = sealer  # encrypts new batches' records and decrypts them when read
        self.state = PartitionState(directory, config, partition, read_only, clock, sealer)
        self.appender = LogAppender(self.state)
        self.flusher = LogFlusher(self.state)
        self.retention = LogRetention(self.state, self.appender.roll_locked)
        self.reader = LogReader(self.state)
        self.truncation = LogTruncation(self.state)
        self.status = LogStatus(self.state, self.retention.candidates)
        self.incarnation = incarnation_file.ORIGINAL_INCARNATION  # read by open()

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
        recreated: bool = False,
    ) -> PartitionLog:
        """Open (and create, unless read_only or not `create`) the partition log in
        `directory`; with a sealer, new batches are encrypted and encrypted ones can be read.
        create=False: a missing directory raises ChannelGoneError (its channel was deleted).
        recreated: the directory is of a partition its channel had, so one made here (or an
        empty one found: log/incarnation.made_again) is a new incarnation
        (log/incarnation.py; settle_incarnation() records its start); without `create`, an
        empty one, or one whose incarnation is pending, is ChannelGoneError like a missing
        one."""
        path = Path(directory)
        log = cls(path, config or LogConfig(), partition, read_only, clock, sealer)
        state = log.state
        lock_moved = None
        if not read_only:
            if create:
                if recreated and (not os.path.lexists(path) or incarnation_file.made_again(path)):
                    _make_recreated_directory(path)
                else:
                    _make_directory_durably(path)
            elif not os.path.lexists(path):  # a file in its place fails below, as ever
                raise ChannelGoneError(f"{path}: partition directory missing, not recreated "
                                       "(its channel was deleted); nothing written")
            elif recreated and incarnation_file.made_again(path):
                raise ChannelGoneError(f"{path}: partition directory empty (made again by "
                                       "someone, or a volume not mounted), not recreated; "
                                       "nothing written")
            elif incarnation_file.cut_short(path):  # whoever opens it: the recreate's
                raise ChannelGoneError(f"{path}: partition directory of a recreate cut "
                                       "short (its start not recorded), to be finished by "
                                       "the operator's recreate; nothing written")
            lock_moved = state.take_dir_lock()
            identity = os.stat(path)
            state.dir_identity = (identity.st_dev, identity.st_ino)
        elif not path.is_dir():
            raise FileNotFoundError(f"{path}: no such partition directory" if not
                                    os.path.lexists(path) else f"{path}: not a directory")
        try:
            log.incarnation = incarnation_file.read(path)
            loaded = log_loader.load(path, log.config, not read_only, force_recovery)
        except BaseException:
            state.release_dir_lock()
            raise
        state.set_segments(loaded.segments)
        state.log_start_offset = loaded.log_start_offset
        state.log_end_offset = loaded.segments[-1].next_offset if loaded.segments \
            else loaded.log_start_offset
        state.committed_end = state.log_end_offset  # the loader wrote log.state with it
        if not read_only:
            try:
                log._restore_final_time_entry()
                state.open_state_file()
            except BaseException:
                log.close(clean=False)
                raise
        state.recovery_point = loaded.recovery_point
        state.persisted_state = LogState(loaded.log_start_offset, loaded.recovery_point,
                                         state.log_end_offset)
        state.last_flush_ms = state.last_state_write_ms = state.now_ms()
        state.last_recovery = loaded.report
        if lock_moved is not None:
            loaded.report.add(RecoveryAction(STRAY_MOVED, str(path / LOCK_FILE),
                                             f"not a regular file; moved to {lock_moved.name}"))
        state.new_losses = list(loaded.report.lost_ranges)
        for loss in state.new_losses if read_only else ():  # a reader's view keeps the
            state.read_damage[(parse_segment_file(Path(loss.path).name) or (-1, ""))[0],
                              loss.position] = loss  # damage its reads will skip
        return log

    def _restore_final_time_entry(self) -> None:
        """Recovery rebuilt the active segment's time index without its final entry (the
        largest timestamp): put it back, as Kafka's LogSegment.recover does."""
        active = self.state.segments[-1]
        if not active.time_index.is_full:
            active.add_final_time_entry()
            active.flush_indexes()

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- offsets (partition_state.py) -----------------------------------------------
    @property
    def log_start_offset(self) -> int:
        """First offset readers may see."""
        return self.state.log_start_offset

    @property
    def log_end_offset(self) -> int:
        """Offset the next appended event gets."""
        return self.state.log_end_offset

    @property
    def recovery_point(self) -> int:
        """First offset not known to be on disk."""
        return self.state.recovery_point

    @property
    def high_watermark(self) -> int:
        """Readers see offsets below this: the recovery point in fsync durability, else the LEO."""
        return self.state.high_watermark

    @property
    def unflushed_events(self) -> int:
        """Events appended but not yet known to be on disk (the policy-mode loss window)."""
        return self.state.unflushed_events

    @property
    def size_bytes(self) -> int:
        """Valid bytes in all segments."""
        return self.state.size_bytes

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        """The live segments, oldest first (a snapshot)."""
        return self.state.segments

    def take_new_losses(self) -> list[LostRange]:
        """Offset ranges found lost since the last call (PartitionState.take_new_losses)."""
        return self.state.take_new_losses()

    def delete_expired_files(self, force: bool = False) -> int:
        """Unlink segments renamed to .deleted whose delay has passed; return how many."""
        return self.state.delete_expired_files(force)

    # -- appending (log_append.py, then log_flush.py) -------------------------------
    def append(self, events: Sequence[PendingEvent]) -> AppendResult:
        """Append events as one batch, atomically; durable on return in fsync durability."""
        self.state.check_writable()
        return self.append_batch(self.build_batch(events))

    def build_batch(self, events: Sequence[PendingEvent],
                    transaction_id: int | None = None) -> bytearray:
        """Encode and check events as a batch for this log (LogAppender.build_batch)."""
        return self.appender.build_batch(events, transaction_id)

    def prepare_batch(self, batch: bytearray) -> bytearray:
        """Seal and size-check an encoded batch (LogAppender.prepare_batch)."""
        return self.appender.prepare_batch(batch)

    def append_batch(self, batch: bytearray, defer_flush: bool = False) -> AppendResult:
        """Append a batch made by build_batch, atomically; durable on return in fsync
        durability. With defer_flush the caller flushes instead: it calls flush_to(result.
        next_offset, result.epoch) when result.flush_due (the channel registers the batch
        first)."""
        result = self.appender.write_batch(batch)
        if result.flush_due and not defer_flush:
            self.flusher.make_durable(result.next_offset, result.epoch)
        return result

    def roll(self) -> None:
        """Start a new segment now (if the active one is not empty)."""
        self.appender.roll()

    # -- durability (log_flush.py) ---------------------------------------------------
    def mark_committed(self, segment_base_offset: int, position: int) -> None:
        """Stamp a transactional batch committed (LogFlusher.mark_committed)."""
        self.flusher.mark_committed(segment_base_offset, position)

    def sync_marks(self) -> None:
        """Make every commit stamp so far durable."""
        self.flusher.sync_marks()

    def flush_to(self, offset: int, epoch: int | None = None) -> None:
        """Return once every offset below `offset` is on disk (a shared fsync); with the
        `epoch` a deferred append returned, StorageError if a truncation removed it since."""
        self.flusher.flush_to(offset, epoch)

    def flush(self) -> None:
        """Make everything appended so far durable, new segments' files too (Kafka's flush)."""
        self.flusher.flush()

    def flush_if_due(self) -> bool:
        """The scheduler's hook (LogFlusher.flush_if_due); True if it flushed."""
        return self.flusher.flush_if_due()

    def checkpoint_recovery_point(self) -> None:
        """Persist the log start offset and recovery point to log.state now."""
        self.flusher.checkpoint_recovery_point()

    # -- retention (log_retention.py) ------------------------------------------------
    def apply_retention(self, limit_offset: int | None = None) -> RetentionResult:
        """Delete the oldest segments retention allows (LogRetention.apply_retention)."""
        return self.retention.apply_retention(limit_offset)

    def delete_records_before(self, offset: int) -> RetentionResult:
        """Raise the log start offset to `offset` (Kafka DeleteRecords)."""
        return self.retention.delete_records_before(offset)

    # -- reading (log_read.py) -------------------------------------------------------
    def refresh(self) -> None:
        """Read-only: catch up with the writer process (LogReader.refresh)."""
        self.reader.refresh()

    def read(self, start_offset: int, max_events: int | None = None,
             max_bytes: int = DEFAULT_READ_BYTES, end_offset: int | None = None) -> list[Event]:
        """Events from start_offset up to the high watermark (LogReader.read)."""
        return self.reader.read(start_offset, max_events, max_bytes, end_offset)

    def iter_events(self, start_offset: int, end_offset: int | None = None) -> Iterator[Event]:
        """Every event from start_offset to end_offset (default: the high watermark)."""
        return self.reader.iter_events(start_offset, end_offset)

    def decode_batch(self, segment: LogSegment, header: BatchHeader, data: bytes) -> list[Event]:
        """Every event of one batch from read_batches (decrypted when sealed)."""
        return self.reader.decode_batch(segment, header, data)

    def read_batches(
        self, start_offset: int, end_offset: int | None = None, max_bytes: int = DEFAULT_READ_BYTES
    ) -> Iterator[tuple[LogSegment, BatchHeader, bytes]]:
        """(segment, header, raw bytes) of the CRC-checked batches (LogReader.read_batches)."""
        return self.reader.read_batches(start_offset, end_offset, max_bytes)

    def batch_headers(self, start_offset: int) -> Iterator[tuple[LogSegment, int, BatchHeader]]:
        """(segment, position, header) of the batches (LogReader.batch_headers)."""
        return self.reader.batch_headers(start_offset)

    def offsets_for_time(self, timestamp: int) -> int | None:
        """Earliest offset whose timestamp is >= `timestamp`, or None (Kafka offsetsForTimes)."""
        return self.reader.offsets_for_time(timestamp)

    def verify_directory(self) -> None:
        """LogDirectoryError (the log goes offline) if the partition directory was deleted,
        unmounted or replaced since open (PartitionState.verify_directory)."""
        self.state.verify_directory()

    # -- truncation (log_truncate.py) ------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Remove every event at or after `offset`; the new log end (LogTruncation)."""
        return self.truncation.truncate_to(offset)

    def start_at(self, offset: int) -> int:
        """Hand out `offset` next when the log ends below it; the new log end (LogTruncation)."""
        return self.truncation.start_at(offset)

    def settle_incarnation(self) -> Incarnation:
        """Record where a recreated partition's pending incarnation starts: at the log end,
        once the queue's checkpoint has set it (the owner's open, before any put)."""
        if self.incarnation.pending and not self.read_only:
            self.incarnation = incarnation_file.settle(self.directory, self.incarnation,
                                                       self.log_end_offset)
        return self.incarnation

    # -- status (log_status.py) ----------------------------------------------------
    @property
    def last_recovery(self) -> RecoveryReport:
        """What the open found and did (recovery.py)."""
        return self.state.last_recovery

    def segment_infos(self) -> list[SegmentInfo]:
        """One SegmentInfo per live segment, oldest first."""
        return self.status.segment_infos()

    def stats(self) -> dict[str, Any]:
        """Plain JSON-serialisable facts about the log."""
        return self.status.stats()

    def read_damage_stats(self) -> dict[str, int]:
        """Damaged batches reads met since open: places and the offsets they lost."""
        return self.status.read_damage_stats()

    # -- closing --------------------------------------------------------------------
    def close(self, clean: bool = True) -> None:
        """Flush, trim, fsync and mark the shutdown clean, in that order; release the lock.
        clean=False writes nothing (the directory is no longer this log's: the next open
        recovers as after a crash)."""
        state = self.state
        if state.closed:
            return
        with state.flush_slot(), state.lock:  # no append, flush or retention runs meanwhile
            if state.closed:
                return
            try:
                if clean and not self.read_only and state.offline is None:
                    self._close_cleanly()
            except OSError as exc:
                raise state.go_offline(exc) from exc  # no clean flag: the next open recovers
            finally:
                state.closed = True
                for segment in state.segments + tuple(state.pending_deletes):
                    segment.close()
                if state.state_fd >= 0:
                    os.close(state.state_fd)
                    state.state_fd = -1
                state.release_dir_lock()

    def _close_cleanly(self) -> None:
        """Trim, fsync files and directory, then write the clean flag. Caller holds the flush
        slot and the lock."""
        state = self.state
        active = state.segments[-1]
        active.add_final_time_entry()
        active.trim()
        for segment in state.segments:
            segment.flush()
        for segment in state.pending_deletes:
            segment.delete_files()
        state.pending_deletes.clear()
        fsync_directory(self.directory)
        state.recovery_point = state.committed_end = state.log_end_offset
        state.write_state(clean=True)


def _make_recreated_directory(path: Path) -> None:
    """Make a recreated partition's directory with its new incarnation's file in it (its
    start pending) as one step: made under a temp name, then renamed into place, so no
    crash leaves the directory without it (a temp one it leaves is used by the next). An
    empty directory in its place (log/incarnation.made_again) gets the file in place: a
    crash before it leaves it empty, made again by the next recreate; a temp one an
    earlier recreate left beside it then goes (verify would note it forever)."""
    if path.is_dir():
        incarnation_file.begin(path)
        _remove_recreate_temp_dir(path)
        return
    temp = recreate_temp_dir(path)
    _make_directory_durably(temp)
    incarnation_file.begin(temp)
    try:
        os.rename(temp, path)
    except OSError as exc:
        raise UnusableFileError(path, "a partition directory", exc) from exc
    fsync_directory(path.parent)


def _remove_recreate_temp_dir(path: Path) -> None:
    """Remove the temp directory an earlier recreate of `path` left before its rename,
    when it holds nothing but its incarnation file (or that file's temp): no partition
    data is ever written there. Anything else in it keeps it (verify lists it)."""
    temp = recreate_temp_dir(path)
    if temp.is_symlink() or not temp.is_dir():
        return
    for name in os.listdir(temp):
        if name in (INCARNATION_FILE, INCARNATION_FILE + TMP_SUFFIX):
            os.unlink(temp / name)
    try:
        temp.rmdir()
    except OSError:  # something else is in it: not ours to remove
        return
    fsync_directory(path.parent)


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

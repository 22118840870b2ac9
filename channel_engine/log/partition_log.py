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
silently: it resumes at the next intact batch (segment.find_next_batch), records the
lost offsets once in take_new_losses() and stats()["read_damage"], and (writer only)
leaves a `<base>.repair` marker so the next writable open repairs the segment
(loader.py).
"""
from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from channel_engine.atomic_file import fsync_directory, open_lock_file
from channel_engine.errors import (
    BatchTooLargeError,
    ChannelEngineError,
    ChannelGoneError,
    CorruptRecordError,
    DiskFullError,
    InvalidBatch,
    LogDirectoryError,
    LogLockedError,
    LogOfflineError,
    OffsetOutOfRangeError,
    ReadOnlyLogError,
    StorageError,
    UndoFailedError,
    UnusableFileError,
)
from channel_engine.event import Event, PendingEvent
from channel_engine.filenames import (
    LOCK_FILE,
    LOG_STATE_FILE,
    LOG_SUFFIX,
    parse_segment_file,
    segment_file,
)
from channel_engine.log import loader as log_loader
from channel_engine.log import record_batch
from channel_engine.log import state as log_state
from channel_engine.log.config import INT32_MAX, LogConfig
from channel_engine.log.record_batch import BatchHeader
from channel_engine.log.recovery import STRAY_MOVED, LostRange, RecoveryAction, RecoveryReport
from channel_engine.log.segment import LogSegment
from channel_engine.log.state import LogState

DEFAULT_READ_BYTES = 1 << 20
READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)  # the directory refuses writes


@dataclass(frozen=True)
class AppendResult:
    """Where a batch went."""

    first_offset: int
    last_offset: int
    segment_base_offset: int
    position: int
    size: int
    max_timestamp: int
    flush_due: bool = False  # durability or flush_messages asks for an fsync of this batch

    @property
    def next_offset(self) -> int:
        """Offset that follows the batch."""
        return self.last_offset + 1


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


@dataclass(frozen=True)
class RetentionResult:
    """What one retention pass deleted."""

    deleted_base_offsets: list[int]
    reasons: list[str]
    bytes_deleted: int
    events_deleted: int
    log_start_offset: int


class PartitionLog:
    """The log of one partition; see the module doc for the offsets and the guarantees."""

    def __init__(self, directory: Path, config: LogConfig, partition: int, read_only: bool,
                 clock: Callable[[], float], sealer: record_batch.Sealer | None = None) -> None:
        self.directory = directory
        self.sealer = sealer  # encrypts new batches' records and decrypts them when read
        self.config = config
        self.partition = partition
        self.read_only = read_only
        self._clock = clock
        self._codec = record_batch.COMPRESSION_CODECS[config.compression]
        self._lock = threading.Lock()
        self._flush_cond = threading.Condition()
        self._state_lock = threading.Lock()
        self._flushing = False
        self._lock_fd = -1
        self._segments: tuple[LogSegment, ...] = ()
        self._pending_deletes: list[LogSegment] = []
        self._marked: set[LogSegment] = set()  # segments with commit stamps not yet synced
        self._log_start_offset = 0
        self._log_end_offset = 0
        self._recovery_point = 0
        self._persisted_state = LogState()
        self._committed_end = 0  # log.state's committed-end record (state.py)
        self._state_fd = -1  # log.state, held open for that record's in-place writes
        self._last_flush_ms = 0
        self._last_state_write_ms = 0
        self._dir_dirty = False
        self._offline: BaseException | None = None
        self._dir_identity = (0, 0)  # (st_dev, st_ino) of the directory when opened
        self._unsynced_segments: list[LogSegment] = []  # rolled to since the last flush
        self._index_rebuilds_dropped = 0  # repairs counted by segments no longer in the log
        self._closed = False
        self._truncations = 0  # bumped by truncate_to: appenders waiting on an fsync re-check
        self.last_recovery = RecoveryReport(str(directory))
        self._new_losses: list[LostRange] = []  # found since the channel last asked
        # damaged places reads met: (segment base, byte) -> the offsets reported lost there
        self._read_damage: dict[tuple[int, int], LostRange] = {}
        self._repair_marked: set[int] = set()  # segments with a .repair marker written

    # -- opening ----------------------------------------------------------------------------
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

    def take_new_losses(self) -> list[LostRange]:
        """Offset ranges found lost (at open, or by a read that met damage) since the last
        call; the caller (the channel) owns them from here: queue, count, ledger."""
        if not self._new_losses:  # the take path asks often; a loss is rare: no lock then
            return []
        with self._lock:
            losses, self._new_losses = self._new_losses, []
        return losses

    def _take_dir_lock(self) -> Path | None:
        """Take `.lock`; return where a non-regular file in its place went (or None)."""
        fd, moved = open_lock_file(self.directory / LOCK_FILE, "the partition's writer lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogLockedError(self.directory) from None
        self._lock_fd = fd
        return moved

    def _release_dir_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = -1

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- offsets ----------------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        """First offset readers may see."""
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        """Offset the next appended event gets."""
        return self._log_end_offset

    @property
    def recovery_point(self) -> int:
        """First offset not known to be on disk."""
        return self._recovery_point

    @property
    def high_watermark(self) -> int:
        """Readers see offsets below this: the recovery point in fsync durability, else the LEO."""
        if self.config.durability == "fsync":
            return self._recovery_point
        return self._log_end_offset

    @property
    def unflushed_events(self) -> int:
        """Events appended but not yet known to be on disk (the policy-mode loss window)."""
        return self._log_end_offset - self._recovery_point

    @property
    def size_bytes(self) -> int:
        """Valid bytes in all segments."""
        return sum(seg.size for seg in self._segments)

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        """The live segments, oldest first (a snapshot)."""
        return self._segments

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _set_segments(self, segments: Sequence[LogSegment]) -> None:
        kept = set(map(id, segments))
        self._index_rebuilds_dropped += sum(s.index_rebuilds for s in self._segments
                                            if id(s) not in kept)
        self._segments = tuple(segments)  # replaced whole: readers keep a consistent snapshot

    # -- appending --------------------------------------------------------------------------
    def append(self, events: Sequence[PendingEvent]) -> AppendResult:
        """Append events as one batch, atomically; durable on return in fsync durability."""
        self._check_writable()
        return self.append_batch(self.build_batch(events))

    def build_batch(self, events: Sequence[PendingEvent],
                    transaction_id: int | None = None) -> bytearray:
        """Encode events as a batch for this log (its codec), checking every event and the
        size limits, without writing anything."""
        return self.prepare_batch(record_batch.build(events, self._codec, transaction_id))

    def prepare_batch(self, batch: bytearray) -> bytearray:
        """Make an encoded batch ready to append: encrypted when the log is, and within the
        size limits (BatchTooLargeError otherwise); nothing is written."""
        if self.sealer is not None:
            batch = record_batch.seal(batch, self.sealer)
        for limit, setting in ((self.config.max_batch_bytes, "max_batch_bytes"),
                               (self.config.segment_bytes, "segment_bytes")):
            if len(batch) > limit:
                raise BatchTooLargeError(len(batch), limit, setting)
        return batch

    def append_batch(self, batch: bytearray, defer_flush: bool = False) -> AppendResult:
        """Append a batch made by build_batch, atomically; durable on return in fsync
        durability. With defer_flush the caller flushes instead: it calls flush_to(result.
        next_offset) when result.flush_due (the channel registers the batch first)."""
        self._check_writable()
        with self._lock:
            self._check_writable()
            self._check_directory(self._segments[-1])
            segment = self._maybe_roll(len(batch), record_batch.read_header(batch))
            record_batch.set_base_offset(batch, self._log_end_offset)
            header = record_batch.read_header(batch)
            position = self._write(segment, batch, header)
            self._log_end_offset = end = header.next_offset
            epoch = self._truncations
            if self.config.durability == "policy":  # handed out on return: say so first
                self._note_committed(end)
            flush_due = self.config.durability == "fsync" or (
                self.config.flush_messages is not None
                and end - self._recovery_point >= self.config.flush_messages
            )
        if flush_due and not defer_flush:
            self._make_durable(end, epoch)
        return AppendResult(header.base_offset, header.last_offset, segment.base_offset,
                            position, len(batch), header.max_timestamp, flush_due)

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyLogError(f"{self.directory}: opened read-only")
        if self._offline is not None:
            raise self._offline_error()
        if self._closed:
            raise ReadOnlyLogError(f"{self.directory}: log is closed")

    def _offline_error(self) -> LogOfflineError:
        """The error every call raises once the log is offline (the directory's own when it
        is gone or read-only)."""
        cause = self._offline
        if isinstance(cause, LogDirectoryError):
            return LogDirectoryError(self.directory, cause.reason)
        return LogOfflineError(self.directory, cause or OSError("offline"))

    def _check_directory(self, segment: LogSegment) -> None:
        """Go offline with LogDirectoryError unless `segment`'s path still names the file we
        write (one stat): a deleted, replaced or unmounted directory acknowledges nothing."""
        try:
            if not segment.gone():
                return
            found = os.stat(self.directory)
            if (found.st_dev, found.st_ino) != self._dir_identity:
                reason = ("another directory is at this path now (the partition directory "
                          "was replaced or unmounted)")
            else:
                reason = f"{segment.log_path.name} was deleted or replaced in the directory"
        except FileNotFoundError:
            reason = "the partition directory no longer exists (deleted or unmounted)"
        except OSError as exc:
            reason = f"the partition directory cannot be checked ({exc})"
        raise self._go_offline(LogDirectoryError(self.directory, reason))

    def _write(self, segment: LogSegment, batch: bytearray, header: BatchHeader) -> int:
        try:
            return segment.append(batch, header)
        except UndoFailedError as exc:
            cause = exc.__cause__
            read_only = isinstance(cause, OSError) and cause.errno in READ_ONLY_ERRNOS
            raise self._go_offline(cause if read_only and cause else exc,
                                   "appending a batch") from exc
        except OSError as exc:  # undone: the segment is as it was
            if exc.errno in READ_ONLY_ERRNOS:
                raise self._go_offline(exc, "appending a batch") from exc
            error = DiskFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StorageError
            raise error(self.directory, exc, "appending a batch") from exc

    def _go_offline(self, exc: BaseException, doing: str = "writing") -> LogOfflineError:
        """Refuse every later write: the files and the in-memory state may disagree. A
        directory that refuses writes (EROFS, EACCES, EPERM) is a LogDirectoryError."""
        if isinstance(exc, OSError) and exc.errno in READ_ONLY_ERRNOS:
            exc = LogDirectoryError(self.directory, f"the partition directory refuses writes "
                                                    f"({exc.strerror}) while {doing}")
        self._offline = exc
        return self._offline_error()

    def _maybe_roll(self, batch_size: int, header: BatchHeader) -> LogSegment:
        segment = self._segments[-1]
        if segment.size == 0:
            return segment
        config = self.config
        first_ts = segment.first_batch_timestamp
        if (segment.size + batch_size > config.segment_bytes
                or (first_ts is not None and header.max_timestamp - first_ts > config.segment_ms)
                or segment.index_full
                or self._log_end_offset + header.record_count - segment.base_offset > INT32_MAX):
            return self._roll()
        return segment

    def roll(self) -> None:
        """Start a new segment now (if the active one is not empty)."""
        with self._lock:
            self._check_writable()
            if self._segments[-1].size:
                self._roll()

    def _roll(self) -> LogSegment:
        """Seal the active segment and start a new one at the LEO. Caller holds the lock.
        If the new segment cannot be created, nothing changed and the old one stays active.
        In policy durability the sealed segment is flushed first (Kafka flushes up to the
        new segment's base on roll), so the recovery point moves to the new base."""
        config = self.config
        try:
            new = LogSegment.create(
                self.directory, self._log_end_offset, index_max_bytes=config.segment_index_bytes,
                index_interval_bytes=config.index_interval_bytes,
                preallocate_bytes=config.segment_bytes if config.preallocate else 0)
        except OSError as exc:
            if exc.errno in READ_ONLY_ERRNOS:
                raise self._go_offline(exc, "rolling to a new segment") from exc
            if exc.errno == errno.ENOENT:
                self._check_directory(self._segments[-1])  # raises if the directory is gone
            error = DiskFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StorageError
            raise error(self.directory, exc, "rolling to a new segment") from exc
        sealed = self._segments[-1]
        try:
            sealed.on_become_inactive()
            if config.durability == "policy":
                sealed.flush_data()
                if self._dir_dirty:  # the sealed segment's own entry, made at the last roll
                    fsync_directory(self.directory)
        except OSError as exc:  # an fsync of the sealed segment failed
            new.delete_files()
            raise self._go_offline(exc, "rolling to a new segment") from exc
        if config.durability == "policy":
            self._recovery_point = max(self._recovery_point, sealed.next_offset)
        self._set_segments(self._segments + (new,))
        self._dir_dirty = True
        self._unsynced_segments.append(new)
        return new

    # -- durability -------------------------------------------------------------------------
    @contextmanager
    def _flush_slot(self) -> Iterator[None]:
        """Be the only thread flushing or closing files (group commit leader or maintenance)."""
        with self._flush_cond:
            while self._flushing:
                self._flush_cond.wait()
            self._flushing = True
        try:
            yield
        finally:
            with self._flush_cond:
                self._flushing = False
                self._flush_cond.notify_all()

    def _make_durable(self, end: int, epoch: int, files: bool = False) -> None:
        """Return once offsets below `end` (written in truncation epoch `epoch`) are on disk,
        and with `files` the files and directory entries of new segments too; one fsync
        serves all waiting appenders."""
        while True:
            with self._flush_cond:
                while (self._recovery_point < end or self._truncations != epoch
                       or (files and self._dir_dirty)):
                    if self._truncations != epoch:
                        raise StorageError(self.directory, OSError("truncated meanwhile"),
                                           "committing a batch a concurrent truncate_to removed")
                    if self._offline is not None:
                        raise self._offline_error()
                    if not self._flushing:
                        self._flushing = True
                        break
                    self._flush_cond.wait()
                else:
                    return
            try:
                self._flush_written()
            finally:
                with self._flush_cond:
                    self._flushing = False
                    self._flush_cond.notify_all()

    def _flush_written(self) -> None:
        """fsync everything written so far, then check that it landed in our directory
        (LogDirectoryError, nothing acknowledged, if not). Caller holds the flush slot."""
        with self._lock:
            self._check_writable()
            end = self._log_end_offset
            dirty = [seg for seg in self._segments if seg.dirty]
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            try:
                self._sync_new_index_files()
            except OSError as exc:
                raise self._go_offline(exc, "flushing a new segment's indexes") from exc
        try:
            for seg in dirty:
                seg.flush_data()
            if dir_dirty:
                fsync_directory(self.directory)
        except OSError as exc:
            error = self._go_offline(exc, "flushing")
            self._cut_unflushed()
            raise error from exc
        with self._lock:
            self._check_directory(dirty[-1] if dirty else self._segments[-1])
            self._recovery_point = max(self._recovery_point, end)
            self._last_flush_ms = self._now_ms()
            self._note_committed(end)  # before any waiter returns: fsync durability's ack

    def _note_committed(self, end: int) -> None:
        """Rewrite log.state's committed-end record in place, without an fsync (one pwrite
        of 12 bytes): the only record of the log's end outside its active segment, so a kill
        followed by the loss of that segment's file loses nothing uncounted (state.py).
        Caller holds the lock."""
        if end <= self._committed_end:
            return
        self._committed_end = end
        try:
            os.pwrite(self._state_fd, log_state.encode_committed_end(end),
                      log_state.COMMITTED_END_AT)
        except OSError as exc:
            raise self._go_offline(exc, "recording the committed end in log.state") from exc

    def _open_state_file(self) -> None:
        """Hold the current log.state open (again after each atomic replace) for
        _note_committed. Caller holds the lock, or is opening the log."""
        fd = os.open(self.directory / LOG_STATE_FILE, os.O_WRONLY)
        old, self._state_fd = self._state_fd, fd
        if old >= 0:
            os.close(old)

    def _sync_new_index_files(self) -> None:
        """fsync the (small) index files of segments rolled to since the last flush, so a
        flush after a roll leaves all three new files on disk. Caller holds the lock, which
        also keeps a roll from closing them meanwhile."""
        new, self._unsynced_segments = self._unsynced_segments, []
        for seg in new:
            seg.flush_indexes()

    def _cut_unflushed(self) -> None:
        """After a failed fsync, best effort: cut each segment back to its durable bytes, so a
        batch whose commit failed does not come back after a reopen."""
        with self._lock:
            for seg in self._segments:
                if seg.durable_size < seg.size:
                    try:
                        os.ftruncate(seg._fd, seg.durable_size)
                        os.fsync(seg._fd)
                    except OSError:
                        pass

    def mark_committed(self, segment_base_offset: int, position: int) -> None:
        """Stamp a transactional batch (where append_batch put it) committed; durable after
        sync_marks() or the next flush of its segment. A deleted segment is skipped."""
        with self._lock:
            self._check_writable()
            for segment in self._segments:
                if segment.base_offset == segment_base_offset:
                    try:
                        segment.mark_committed(position)
                    except OSError as exc:
                        raise self._go_offline(exc) from exc
                    self._marked.add(segment)
                    return

    def sync_marks(self) -> None:
        """Make every commit stamp so far durable."""
        with self._lock:
            marked, self._marked = self._marked, set()
        try:
            for segment in marked:
                if not segment.deleted:
                    segment.sync()
        except OSError as exc:
            raise self._go_offline(exc) from exc

    def flush_to(self, offset: int) -> None:
        """Return once every offset below `offset` is on disk (sharing an fsync with
        concurrent callers)."""
        self._check_writable()
        with self._lock:
            epoch = self._truncations
        self._make_durable(offset, epoch)

    def flush(self) -> None:
        """Make everything appended so far durable (Kafka's explicit flush), and the files
        and directory entries of segments rolled to since the last flush."""
        self._check_writable()
        with self._lock:
            end, epoch = self._log_end_offset, self._truncations
        self._make_durable(end, epoch, files=True)

    def flush_if_due(self) -> bool:
        """The scheduler's hook: flush when flush_ms passed, persist the recovery point when
        its interval passed, unlink deleted files whose delay passed. True if it flushed."""
        self._check_writable()
        now = self._now_ms()
        config = self.config
        flushed = False
        if ((self.unflushed_events > 0 or self._dir_dirty) and config.flush_ms is not None
                and now - self._last_flush_ms >= config.flush_ms):
            self.flush()
            flushed = True
        if (self._recovery_point != self._persisted_state.recovery_point
                and now - self._last_state_write_ms >= config.recovery_point_checkpoint_ms):
            self.checkpoint_recovery_point()
        self.delete_expired_files()
        return flushed

    def checkpoint_recovery_point(self) -> None:
        """Persist the log start offset and recovery point to log.state now, after the
        indexes of everything below the recovery point (a reopen trusts those)."""
        with self._flush_slot(), self._lock:
            self._check_writable()
            try:
                for seg in self._segments:
                    seg.flush_indexes()
                self._write_state(clean=False)
            except OSError as exc:
                raise self._go_offline(exc) from exc

    def _write_state(self, clean: bool) -> None:
        with self._state_lock:  # one writer of log.state.tmp at a time
            self._write_state_locked(clean)

    def _write_state_locked(self, clean: bool) -> None:
        state = LogState(self._log_start_offset, self._recovery_point, self._log_end_offset,
                         clean, committed_end=self._committed_end)
        log_state.write(self.directory / LOG_STATE_FILE, state)
        self._open_state_file()  # the in-place record goes to the new file from now on
        self._persisted_state = state
        self._last_state_write_ms = self._now_ms()

    # -- reading ----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read-only: catch up with the writer process — batches it appended, segments it
        rolled, and segments retention removed (those stay readable by iterators already
        holding them until close). A writer's own view is always current: no-op there."""
        if not self.read_only:
            return
        with self._lock:
            try:
                state = log_state.read(self.directory / LOG_STATE_FILE)
            except ChannelEngineError:
                state = None  # being replaced right now, or damaged: keep the old log start
            present = set(log_loader.log_bases(self.directory))
            kept = [s for s in self._segments if s.base_offset in present]
            self._pending_deletes += [s for s in self._segments if s.base_offset not in present]
            if kept:
                kept[-1].catch_up()  # the segment that was active when we last looked
            known = {s.base_offset for s in kept}
            for base in sorted(present - known):
                if kept and base < kept[-1].base_offset:
                    continue  # a truncated-and-rewritten history is for a reopen to sort out
                if kept and base != kept[-1].next_offset and log_loader.is_empty_segment(
                        segment_file(self.directory, base, LOG_SUFFIX)):
                    continue  # not where the writer rolls: a stray, until it holds batches
                segment = LogSegment.open(
                    self.directory, base, index_max_bytes=self.config.segment_index_bytes,
                    index_interval_bytes=self.config.index_interval_bytes, writable=False)
                segment.scan(segment.file_size, verify_from=None)
                kept.append(segment)
            if kept:
                self._set_segments(kept)
                self._log_end_offset = self._recovery_point = kept[-1].next_offset
            if state is not None:
                self._log_start_offset = max(self._log_start_offset, state.log_start_offset)

    def read(
        self,
        start_offset: int,
        max_events: int | None = None,
        max_bytes: int = DEFAULT_READ_BYTES,
        end_offset: int | None = None,
    ) -> list[Event]:
        """Events from start_offset up to the high watermark (and end_offset), at most
        max_events, from batches totalling about max_bytes (always at least one batch)."""
        events: list[Event] = []
        limit = max_events if max_events is not None else 1 << 62
        for segment, header, data in self.read_batches(start_offset, end_offset, max_bytes):
            self._decode(segment, header, data, start_offset, end_offset, events, limit)
            if len(events) >= limit:
                break
        return events

    def iter_events(self, start_offset: int, end_offset: int | None = None) -> Iterator[Event]:
        """Yield every event from start_offset to end_offset (default: the high watermark)."""
        end = self.high_watermark if end_offset is None else min(end_offset, self.high_watermark)
        for segment, header, data in self.read_batches(start_offset, end, 1 << 62):
            events: list[Event] = []
            self._decode(segment, header, data, start_offset, end, events, 1 << 62)
            yield from events

    def decode_batch(self, segment: LogSegment, header: BatchHeader, data: bytes) -> list[Event]:
        """Every event of one batch from read_batches (decrypted when sealed)."""
        events: list[Event] = []
        self._decode(segment, header, data, header.base_offset, None, events, 1 << 62)
        return events

    def _decode(self, segment: LogSegment, header: BatchHeader, data: bytes, start: int,
                end: int | None, out: list[Event], limit: int) -> None:
        stop = header.next_offset if end is None else min(end, header.next_offset)
        partition = self.partition
        try:
            plain = record_batch.unseal(data, self.sealer)
            for offset, timestamp, key, value, headers in record_batch.records(plain):
                if offset < start:
                    continue
                if offset >= stop or len(out) >= limit:
                    return
                out.append(Event(partition, offset, timestamp, key,
                                 dict(headers) if headers else {},  # type: ignore[arg-type]
                                 value if value is not None else b""))
        except InvalidBatch as exc:
            position = segment.find_position(header.base_offset, segment.size) or 0
            raise CorruptRecordError(segment.log_path, position, exc.reason) from exc

    def read_batches(
        self, start_offset: int, end_offset: int | None = None, max_bytes: int = DEFAULT_READ_BYTES
    ) -> Iterator[tuple[LogSegment, BatchHeader, bytes]]:
        """Yield (segment, header, raw bytes) of the CRC-checked batches holding offsets from
        start_offset up to the high watermark (and end_offset); the first batch may begin
        before start_offset. Raises OffsetOutOfRangeError outside [log start, high watermark].
        A damaged batch is skipped, never silently: its offsets go to take_new_losses()."""
        bound = self.high_watermark
        if end_offset is not None:
            bound = min(bound, end_offset)
        if not self._log_start_offset <= start_offset <= self.high_watermark:
            raise OffsetOutOfRangeError(start_offset, self._log_start_offset, self.high_watermark)
        segments = self._segments
        i = max(bisect_right([s.base_offset for s in segments], start_offset) - 1, 0)
        total = 0
        for segment in segments[i:]:
            if start_offset >= bound or segment.base_offset >= bound:
                return
            next_offset, size = segment.next_offset, segment.size  # an appender sets size first
            position, start_offset, first = self._position_of(segment, start_offset, size,
                                                              next_offset)
            while position is not None and start_offset < bound:
                checked = first
                try:
                    for _, header, data in segment.read_batches(position, size, bound, 1 << 62,
                                                                first_base=first):
                        checked = (header.next_offset, header.next_offset)
                        if header.next_offset <= start_offset:
                            continue  # resumed after damage before the offsets asked for
                        if total and total + header.size > max_bytes:
                            return  # one budget for the whole read, across segments
                        total += header.size
                        yield segment, header, data
                        start_offset = header.next_offset
                    position = None
                except CorruptRecordError as exc:
                    position, start_offset, first = self._skip_damage(
                        segment, exc, checked[0], start_offset, size, next_offset)
            if segment.misplaced_bases:  # delivered with the offsets their place holds
                self._mark_for_repair(segment)

    def _position_of(self, segment: LogSegment, offset: int, size: int, next_offset: int
                     ) -> tuple[int | None, int, tuple[int, int]]:
        """(byte position of the batch holding `offset` or None, the offset to read from, the
        range its base offset must lie in)."""
        try:
            position = segment.find_position(offset, size)
        except CorruptRecordError as exc:  # a header met on the way holds offsets <= offset
            return self._skip_damage(segment, exc, segment.base_offset, offset, size, next_offset)
        return position, offset, (segment.base_offset, max(offset, segment.base_offset))

    def _skip_damage(self, segment: LogSegment, exc: CorruptRecordError, expected: int,
                     start_offset: int, size: int, next_offset: int
                     ) -> tuple[int | None, int, tuple[int, int]]:
        """Damage at use: record the lost offsets once (take_new_losses, stats), ask the next
        writable open to repair the segment, and return where intact batches resume: (byte
        position or None for the segment's end, offset to read from, its base offset)."""
        found = segment.resume_after(exc.position, size, expected)
        resume_at = found[0] if found is not None else size
        end = found[1].base_offset if found is not None else next_offset
        key = (segment.base_offset, exc.position)
        with self._lock:  # each lost offset of a damaged place is reported once
            reported = self._read_damage.get(key)
            top = end if reported is None else reported.start
            if start_offset < top:
                loss = LostRange(start_offset, top, str(segment.log_path), exc.position,
                                 resume_at - exc.position, f"corrupt at read: {exc.reason}")
                self._new_losses.append(loss)
                self._read_damage[key] = LostRange(start_offset, max(end, top), loss.path,
                                                   loss.position, loss.length, loss.cause)
        self._mark_for_repair(segment)
        return (resume_at if resume_at < size else None), max(start_offset, end), (end, end)

    def _mark_for_repair(self, segment: LogSegment) -> None:
        if self.read_only or self._closed or segment.base_offset in self._repair_marked:
            return
        self._repair_marked.add(segment.base_offset)
        try:
            log_loader.mark_for_repair(self.directory, segment.base_offset)
        except OSError:  # best effort: `recover` (force_recovery) finds the damage too
            pass

    def batch_headers(self, start_offset: int) -> Iterator[tuple[LogSegment, int, BatchHeader]]:
        """(segment, position, header) of the batches from the one holding start_offset up
        to the high watermark, records unread (CRCs unchecked); a damaged header is skipped
        and counted as by read_batches."""
        bound = self.high_watermark
        for segment in self._segments:
            if segment.next_offset <= start_offset or segment.base_offset >= bound:
                continue
            next_offset, size = segment.next_offset, segment.size
            offset = max(start_offset, segment.base_offset)
            position, offset, first = self._position_of(segment, offset, size, next_offset)
            while position is not None:
                checked = first
                try:
                    for at, header in segment.headers_at(position, size, first):
                        checked = (header.next_offset, header.next_offset)
                        if header.base_offset >= bound:
                            return
                        if header.next_offset > offset:
                            yield segment, at, header
                            offset = header.next_offset
                    position = None
                except CorruptRecordError as exc:  # skipped and counted, as by a read
                    position, offset, first = self._skip_damage(
                        segment, exc, checked[0], offset, size, next_offset)
            if segment.misplaced_bases:
                self._mark_for_repair(segment)

    def offsets_for_time(self, timestamp: int) -> int | None:
        """Earliest offset whose timestamp is >= `timestamp`, or None (Kafka offsetsForTimes).
        A damaged batch is skipped and counted as by read_batches: the answer is the earliest
        such offset that a read can deliver."""
        bound = self.high_watermark
        for segment in self._segments:
            if segment.max_timestamp < timestamp or segment.base_offset >= bound:
                continue
            start = max(self._log_start_offset, segment.start_for_time(timestamp))
            end = min(bound, segment.next_offset)
            if start >= end:
                continue
            for batch_segment, header, data in self.read_batches(start, end, 1 << 62):
                if header.max_timestamp < timestamp:
                    continue
                for event in self.decode_batch(batch_segment, header, data):
                    if start <= event.offset < end and event.timestamp >= timestamp:
                        return event.offset
        return None

    # -- retention and truncation -----------------------------------------------------------
    def _retention_candidates(self, now: int, limit: int) -> list[tuple[LogSegment, str]]:
        """Oldest-first prefix of segments retention may delete now. The active segment only
        when time retention applies to every event in it (then it is rolled first)."""
        config = self.config
        segments = self._segments[:-1]
        excess = self.size_bytes - config.retention_bytes if config.retention_bytes >= 0 else -1
        out = []
        for segment in segments:
            if segment.next_offset > limit:
                break
            if segment.next_offset <= self._log_start_offset:
                reason = "below the log start offset"
            elif config.retention_bytes >= 0 and excess - segment.size >= 0:
                reason = f"log exceeds retention_bytes={config.retention_bytes}"
            elif config.retention_ms >= 0 and now - segment.max_timestamp > config.retention_ms:
                reason = f"older than retention_ms={config.retention_ms}"
            else:
                break
            excess -= segment.size
            out.append((segment, reason))
        active = self._segments[-1]
        if (len(out) == len(segments) and active.size and active.next_offset <= limit
                and config.retention_ms >= 0 and now - active.max_timestamp > config.retention_ms):
            out.append((active, f"older than retention_ms={config.retention_ms} (the active "
                                f"segment: rolled first, the log end stays)"))
        return out

    def apply_retention(self, limit_offset: int | None = None) -> RetentionResult:
        """Delete the oldest segments that retention allows, ending at or below limit_offset
        (default: the high watermark). An active segment whose every event is older than
        retention_ms is rolled, then deleted: the new active segment is empty at the same log
        end (Kafka's rule, so an idle log does not keep expired events). Crash-safe: the log
        start offset is persisted first, then the files are renamed to .deleted and unlinked
        after file_delete_delay_ms, so reads in flight finish."""
        with self._lock:
            self._check_writable()
            limit = self.high_watermark if limit_offset is None else min(limit_offset,
                                                                         self.high_watermark)
            doomed = self._retention_candidates(self._now_ms(), limit)
            if doomed and doomed[-1][0] is self._segments[-1]:
                self._roll()  # as Kafka: a log always keeps a segment, empty at the log end
            result = self._delete_segments([seg for seg, _ in doomed])
        self.delete_expired_files()
        return RetentionResult(result.deleted_base_offsets, [why for _, why in doomed],
                               result.bytes_deleted, result.events_deleted,
                               result.log_start_offset)

    def delete_records_before(self, offset: int) -> RetentionResult:
        """Raise the log start offset to `offset` (Kafka DeleteRecords) and delete the
        segments wholly below it."""
        with self._lock:
            self._check_writable()
            if not self._log_start_offset <= offset <= self.high_watermark:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, self.high_watermark)
            self._log_start_offset = offset
            doomed = [s for s in self._segments[:-1] if s.next_offset <= offset]
            result = self._delete_segments(doomed)
        self.delete_expired_files()
        return result

    def _delete_segments(self, doomed: list[LogSegment]) -> RetentionResult:
        """Persist the new log start, then unlink `doomed` from the log. Caller holds the lock.
        An I/O error part way takes the log offline; the next open finishes the job."""
        if doomed:
            remaining = self._segments[len(doomed):]
            self._log_start_offset = max(self._log_start_offset, remaining[0].base_offset)
            self._set_segments(remaining)
        deadline = self._now_ms() + self.config.file_delete_delay_ms
        try:
            self._write_state(clean=False)
            for segment in doomed:
                segment.rename_to_deleted()
                segment.delete_after_ms = deadline
                self._pending_deletes.append(segment)
            if doomed:
                fsync_directory(self.directory)
        except OSError as exc:
            raise self._go_offline(exc) from exc
        return RetentionResult(
            [s.base_offset for s in doomed], [], sum(s.size for s in doomed),
            sum(s.next_offset - s.base_offset for s in doomed), self._log_start_offset)

    def delete_expired_files(self, force: bool = False) -> int:
        """Unlink segments renamed to .deleted whose delay has passed; return how many."""
        now = self._now_ms()
        with self._flush_slot():
            due = [s for s in self._pending_deletes if force or s.delete_after_ms <= now]
            for segment in due:
                try:
                    segment.delete_files()
                except OSError as exc:  # kept pending: tried again next time, or on open
                    raise StorageError(self.directory, exc, "unlinking a deleted segment") \
                        from exc
                self._pending_deletes.remove(segment)
        return len(due)

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
        config = self.config
        segment = LogSegment.create(
            self.directory, offset, index_max_bytes=config.segment_index_bytes,
            index_interval_bytes=config.index_interval_bytes,
            preallocate_bytes=config.segment_bytes if config.preallocate else 0)
        self._set_segments(keep + [segment])
        return segment

    # -- status -----------------------------------------------------------------------------
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

    # -- closing ----------------------------------------------------------------------------
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

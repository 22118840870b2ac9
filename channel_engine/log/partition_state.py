"""PartitionState: what the parts of a partition log share (partition_log.PartitionLog: the whole).

PartitionLog makes one and hands it to its parts: the appender (log_append.py),
the flusher (log_flush.py), the reader (log_read.py), retention
(log_retention.py), truncation (log_truncate.py) and status (log_status.py), as
ChannelOwner does with ChannelState. It holds the state
of the log (its segments, the offsets, the recovery point, the committed end,
whether it is offline, what the open found, the damage reads met) and what
every part does with it: its writer lock on
`.lock`, the checks every write makes first (read-only, closed, offline; the
directory still ours), going offline, the flush slot, the `log.state` file
(state.py owns its bytes: the atomically replaced record, and the 12-byte
committed-end record rewritten in place, never fsynced) and unlinking deleted
segments when their delay passed. The rules of each phase live in its part.

Offsets: the log start offset is the first offset readers may see; the log end
offset (LEO) is the offset the next batch gets; the recovery point is the first
offset not known to be on disk; the high watermark is what readers see: the
recovery point in 'fsync' durability (never an event whose commit has not
returned), the LEO in 'policy' durability (the flush policy bounds the loss).

Concurrency: `lock` guards the state (appends, roll, retention, truncation and
close take it); the flush slot (flush_slot.py) lets one thread at a time flush
or close files, outside `lock`; `state_lock` serialises writers of
log.state.tmp. Readers take no lock: they work on a snapshot of the segment list
(replaced whole by set_segments).

Failures: a failure that leaves the files and the in-memory state in doubt takes
the log offline (go_offline): every later call raises LogOfflineError (or the
directory's LogDirectoryError) until the directory is opened again, which
recovers it. A directory deleted, replaced, unmounted or refusing writes (EROFS,
EACCES, EPERM) is a LogDirectoryError naming it.
"""
from __future__ import annotations

import errno
import fcntl
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from channel_engine.atomic_file import open_lock_file
from channel_engine.errors import (
    LogDirectoryError,
    LogLockedError,
    LogOfflineError,
    ReadOnlyLogError,
    StorageError,
)
from channel_engine.filenames import (
    LOCK_FILE,
    LOG_STATE_FILE,
)
from channel_engine.log import record_batch
from channel_engine.log import state as log_state
from channel_engine.log.config import LogConfig
from channel_engine.log.flush_slot import FlushSlot
from channel_engine.log.recovery import LostRange, RecoveryReport
from channel_engine.log.segment import LogSegment, SegmentConfig
from channel_engine.log.state import LogState

READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)  # the directory refuses writes


class PartitionState:
    """A partition log's shared state and the checks and records every part makes; see the
    module doc for its locks."""

    def __init__(self, directory: Path, config: LogConfig, partition: int, read_only: bool,
                 clock: Callable[[], float], sealer: record_batch.Sealer | None = None) -> None:
        self.directory = directory
        self.sealer = sealer  # encrypts new batches' records and decrypts them when read
        self.config = config
        self.partition = partition
        self.read_only = read_only
        self.clock = clock
        self.codec = record_batch.COMPRESSION_CODECS[config.compression]
        self.segment_config = SegmentConfig.of(config)  # what each new segment is made with
        self.lock = threading.Lock()
        self.slot = FlushSlot()  # one flusher or closer at a time (flush_slot.py)
        self.state_lock = threading.Lock()
        self.lock_fd = -1
        self.segments: tuple[LogSegment, ...] = ()  # the live segments, oldest first
        self.pending_deletes: list[LogSegment] = []  # renamed to .deleted, not yet unlinked
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.recovery_point = 0
        self.persisted_state = LogState()
        self.committed_end = 0  # log.state's committed-end record (state.py)
        self.state_fd = -1  # log.state, held open for that record's in-place writes
        self.last_flush_ms = 0
        self.last_state_write_ms = 0
        self.dir_dirty = False
        self.offline: BaseException | None = None
        self.dir_identity = (0, 0)  # (st_dev, st_ino) of the directory when opened
        self.unsynced_segments: list[LogSegment] = []  # rolled to since the last flush
        self.index_rebuilds_dropped = 0  # repairs counted by segments no longer in the log
        self.closed = False
        self.truncations = 0  # bumped by truncate_to: appenders waiting on an fsync re-check
        self.new_losses: list[LostRange] = []  # found since the channel last asked
        # damaged places reads met: (segment base, byte) -> the offsets reported lost there
        self.read_damage: dict[tuple[int, int], LostRange] = {}
        self.last_recovery = RecoveryReport(str(directory))  # what the open found and did

    # -- the writer's directory lock ------------------------------------------------
    def take_dir_lock(self) -> Path | None:
        """Take `.lock`; return where a non-regular file in its place went (or None)."""
        fd, moved = open_lock_file(self.directory / LOCK_FILE, "the partition's writer lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogLockedError(self.directory) from None
        self.lock_fd = fd
        return moved

    def release_dir_lock(self) -> None:
        """Drop `.lock` (at close; the tests' kill -9 too)."""
        if self.lock_fd >= 0:
            os.close(self.lock_fd)  # closing the descriptor drops the flock
            self.lock_fd = -1

    # -- offsets --------------------------------------------------------------------
    @property
    def high_watermark(self) -> int:
        """Readers see offsets below this: the recovery point in fsync durability, else the LEO."""
        if self.config.durability == "fsync":
            return self.recovery_point
        return self.log_end_offset

    @property
    def unflushed_events(self) -> int:
        """Events appended but not yet known to be on disk (the policy-mode loss window)."""
        return self.log_end_offset - self.recovery_point

    @property
    def size_bytes(self) -> int:
        """Valid bytes in all segments."""
        return sum(seg.size for seg in self.segments)

    @property
    def preallocated_bytes(self) -> int:
        """Zero bytes written or allocated past the valid bytes (preallocation; on disk, not
        data): file lengths beyond the segments' sizes."""
        return sum(max(seg.file_size - seg.size, 0) for seg in self.segments)

    def now_ms(self) -> int:
        """The log's clock, in milliseconds."""
        return int(self.clock() * 1000)

    def set_segments(self, segments: Sequence[LogSegment]) -> None:
        """Replace the segment list (caller holds the lock, or is opening the log)."""
        kept = set(map(id, segments))
        self.index_rebuilds_dropped += sum(s.index_rebuilds for s in self.segments
                                            if id(s) not in kept)
        self.segments = tuple(segments)  # replaced whole: readers keep a consistent snapshot

    def take_new_losses(self) -> list[LostRange]:
        """Offset ranges found lost (at open, or by a read that met damage) since the last
        call; the caller (the channel) owns them from here: queue, count, ledger."""
        if not self.new_losses:  # the take path asks often; a loss is rare: no lock then
            return []
        with self.lock:
            losses, self.new_losses = self.new_losses, []
        return losses

    # -- refusing writes: read-only, closed, offline --------------------------------
    def check_writable(self) -> None:
        """Raise unless writes are allowed: not read-only, not offline, not closed."""
        if self.read_only:
            raise ReadOnlyLogError(f"{self.directory}: opened read-only")
        if self.offline is not None:
            raise self.offline_error()
        if self.closed:
            raise ReadOnlyLogError(f"{self.directory}: log is closed")

    def offline_error(self) -> LogOfflineError:
        """The error every call raises once the log is offline (the directory's own when it
        is gone or read-only)."""
        cause = self.offline
        if isinstance(cause, LogDirectoryError):
            return LogDirectoryError(self.directory, cause.reason)
        return LogOfflineError(self.directory, cause or OSError("offline"))

    def check_directory(self, segment: LogSegment) -> None:
        """Go offline with LogDirectoryError unless `segment`'s path still names the file we
        write (one statx, segment_file.gone): a deleted, replaced or unmounted directory
        acknowledges nothing."""
        try:
            if not segment.gone():
                return
            found = os.stat(self.directory)
            if (found.st_dev, found.st_ino) != self.dir_identity:
                reason = ("another directory is at this path now (the partition directory "
                          "was replaced or unmounted)")
            else:
                reason = f"{segment.log_path.name} was deleted or replaced in the directory"
        except FileNotFoundError:
            reason = "the partition directory no longer exists (deleted or unmounted)"
        except OSError as exc:
            reason = f"the partition directory cannot be checked ({exc})"
        raise self.go_offline(LogDirectoryError(self.directory, reason))

    def verify_directory(self) -> None:
        """Go offline with LogDirectoryError unless the partition directory is still the one
        opened: its identity (st_dev, st_ino) recorded at open, as the home lock's `replaced`
        does for the home (one stat). A directory deleted or unmounted under a running log
        is found here by status and flush, even with nothing to write."""
        if self.read_only or self.closed:
            return
        if self.offline is not None:
            raise self.offline_error()
        try:
            found = os.stat(self.directory)
        except FileNotFoundError:
            reason = "the partition directory no longer exists (deleted or unmounted)"
        except OSError as exc:
            reason = f"the partition directory cannot be checked ({exc})"
        else:
            if (found.st_dev, found.st_ino) == self.dir_identity:
                return
            reason = ("another directory is at this path now (the partition directory was "
                      "replaced or unmounted)")
        raise self.go_offline(LogDirectoryError(self.directory, reason))

    def go_offline(self, exc: BaseException, doing: str = "writing") -> LogOfflineError:
        """Refuse every later write: the files and the in-memory state may disagree. A
        directory that refuses writes (EROFS, EACCES, EPERM) is a LogDirectoryError."""
        if isinstance(exc, OSError) and exc.errno in READ_ONLY_ERRNOS:
            exc = LogDirectoryError(self.directory, f"the partition directory refuses writes "
                                                    f"({exc.strerror}) while {doing}")
        self.offline = exc
        return self.offline_error()

    # -- the flush slot, log.state, deleted files -----------------------------------
    @contextmanager
    def flush_slot(self) -> Iterator[None]:
        """Be the only thread flushing or closing files (group commit leader or maintenance)."""
        self.slot.take()
        try:
            yield
        finally:
            self.slot.release()

    def note_committed(self, end: int) -> None:
        """Rewrite log.state's committed-end record in place, without an fsync (one pwrite
        of 12 bytes): the only record of the log's end outside its active segment, so a kill
        followed by the loss of that segment's file loses nothing uncounted (state.py).
        Caller holds the lock."""
        if end <= self.committed_end:
            return
        self.committed_end = end
        try:
            os.pwrite(self.state_fd, log_state.encode_committed_end(end),
                      log_state.COMMITTED_END_AT)
        except OSError as exc:
            raise self.go_offline(exc, "recording the committed end in log.state") from exc

    def open_state_file(self) -> None:
        """Hold the current log.state open (again after each atomic replace) for
        note_committed. Caller holds the lock, or is opening the log."""
        fd = os.open(self.directory / LOG_STATE_FILE, os.O_WRONLY)
        old, self.state_fd = self.state_fd, fd
        if old >= 0:
            os.close(old)

    def write_state(self, clean: bool) -> None:
        """Replace log.state atomically with the offsets now (state.py)."""
        with self.state_lock:  # one writer of log.state.tmp at a time
            self._write_state_locked(clean)

    def _write_state_locked(self, clean: bool) -> None:
        state = LogState(self.log_start_offset, self.recovery_point, self.log_end_offset,
                         clean, committed_end=self.committed_end)
        log_state.write(self.directory / LOG_STATE_FILE, state)
        self.open_state_file()  # the in-place record goes to the new file from now on
        self.persisted_state = state
        self.last_state_write_ms = self.now_ms()

    def delete_expired_files(self, force: bool = False) -> int:
        """Unlink segments renamed to .deleted whose delay has passed; return how many."""
        now = self.now_ms()
        with self.flush_slot():
            due = [s for s in self.pending_deletes if force or s.delete_after_ms <= now]
            for segment in due:
                try:
                    segment.delete_files()
                except OSError as exc:  # kept pending: tried again next time, or on open
                    raise StorageError(self.directory, exc, "unlinking a deleted segment") \
                        from exc
                self.pending_deletes.remove(segment)
        return len(due)

"""LogAppender: a partition log's one append path, and rolling to a new segment.

Append path, written once: build and check the batch (outside the lock) -> check
the directory -> roll if due -> assign the base offset -> write -> make durable
per the policy -> record the committed end in log.state (one 12-byte pwrite in
place, never an fsync: after the write in 'policy' durability, after the group
fsync in 'fsync' durability; the evidence of the log's end that outlives its
active segment, state.py). The batch bytes are record_batch.py's; this module
sets only the base offset field.

Roll (Kafka's rules): when the next batch would make the active segment larger
than segment_bytes, its max timestamp is segment_ms past the segment's first, an
index is full, or relative offsets would overflow int32. A roll in 'policy'
durability fdatasyncs the sealed segment (and the directory if a segment was
created since the last flush) before moving on, so the recovery point reaches the
new base, as Kafka's roll flushes up to the new segment.

Never acknowledged unless on disk in our directory: every append first checks
with one stat (about 1 us) that the active segment's path still names the file the
log holds open.

Concurrency: thread-safe: the write and the roll run under the log's lock, the
batch is built and the fsync made outside it.

Failures: a failed write is undone (the segment is cut back) and reported
(DiskFullError, StorageError); a write that cannot be undone, or a directory that
refuses writes, takes the log offline; a failed roll changes nothing (the new
segment is deleted); a batch over max_batch_bytes or segment_bytes is refused
before anything is written (BatchTooLargeError).
"""
from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import (
    BatchTooLargeError,
    DiskFullError,
    StorageError,
    UndoFailedError,
)
from channel_engine.event import PendingEvent
from channel_engine.log import record_batch
from channel_engine.log.config import INT32_MAX
from channel_engine.log.log_core import READ_ONLY_ERRNOS
from channel_engine.log.log_flush import LogFlusher
from channel_engine.log.record_batch import BatchHeader
from channel_engine.log.segment import LogSegment


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


class LogAppender(LogFlusher):
    """Appending to a partition log and rolling its segments (see the module doc)."""

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

    # -- rolling --------------------------------------------------------------------
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
            new = LogSegment.create(self.directory, self._log_end_offset, self._segment_config)
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

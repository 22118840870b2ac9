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

Never acknowledged unless on disk in our directory: one statx (a few us; it reads no
timestamp: file_identity.py says why) checks that the active segment's path still
names the file the log holds open. In 'policy' durability, where a batch is
acknowledged once written, every append checks first. In 'fsync' durability the check
after each group fsync (log_flush.py) is the one that guards the acknowledgement: it
runs after every write its fsync covers, so a batch written into a file deleted or
replaced meanwhile fails with LogDirectoryError and takes the log offline, never
acknowledged; its bytes went to the old file, never into a directory or file now at
that path. So an fsync'd put makes one identity check, not two; a roll still checks
before it creates the new segment, so that file is never made in a directory that is
no longer ours.

A part of PartitionLog over its PartitionState (partition_state.py):
PartitionLog.append_batch runs write_batch, then, when the policy asks for it,
LogFlusher.make_durable (log_flush.py). Retention rolls an expired active segment
with roll_locked.

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
from channel_engine.log.partition_state import READ_ONLY_ERRNOS, PartitionState
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
    epoch: int = 0  # the truncation epoch it was written in: a deferred flush_to's

    @property
    def next_offset(self) -> int:
        """Offset that follows the batch."""
        return self.last_offset + 1


class LogAppender:
    """Appending to a partition log and rolling its segments (see the module doc)."""

    def __init__(self, state: PartitionState) -> None:
        self.state = state

    def build_batch(self, events: Sequence[PendingEvent],
                    transaction_id: int | None = None) -> bytearray:
        """Encode events as a batch for this log (its codec), checking every event and the
        size limits, without writing anything."""
        state = self.state
        return self.prepare_batch(record_batch.build(events, state.codec, transaction_id))

    def prepare_batch(self, batch: bytearray) -> bytearray:
        """Make an encoded batch ready to append: encrypted when the log is, and within the
        size limits (BatchTooLargeError otherwise); nothing is written."""
        state = self.state
        if state.sealer is not None:
            batch = record_batch.seal(batch, state.sealer)
        for limit, setting in ((state.config.max_batch_bytes, "max_batch_bytes"),
                               (state.config.segment_bytes, "segment_bytes")):
            if len(batch) > limit:
                raise BatchTooLargeError(len(batch), limit, setting)
        return batch

    def write_batch(self, batch: bytearray) -> AppendResult:
        """Write a batch made by build_batch, atomically: the append path up to the committed
        end of 'policy' durability (PartitionLog.append_batch then makes it durable when
        result.flush_due). Returns where it went, with the truncation epoch it was written
        in (LogFlusher.make_durable's)."""
        state = self.state
        state.check_writable()
        with state.lock:
            state.check_writable()
            if state.config.durability != "fsync":  # acknowledged on return: look first
                state.check_directory(state.segments[-1])
            segment = self._maybe_roll(len(batch), record_batch.read_header(batch))
            record_batch.set_base_offset(batch, state.log_end_offset)
            header = record_batch.read_header(batch)
            position = self._write_to(segment, batch, header)
            state.log_end_offset = end = header.next_offset
            epoch = state.truncations
            if state.config.durability == "policy":  # handed out on return: say so first
                state.note_committed(end)
            flush_due = state.config.durability == "fsync" or (
                state.config.flush_messages is not None
                and end - state.recovery_point >= state.config.flush_messages
            )
        return AppendResult(header.base_offset, header.last_offset, segment.base_offset,
                            position, len(batch), header.max_timestamp, flush_due, epoch)

    def _write_to(self, segment: LogSegment, batch: bytearray, header: BatchHeader) -> int:
        state = self.state
        try:
            return segment.append(batch, header)
        except UndoFailedError as exc:
            cause = exc.__cause__
            read_only = isinstance(cause, OSError) and cause.errno in READ_ONLY_ERRNOS
            raise state.go_offline(cause if read_only and cause else exc,
                                   "appending a batch") from exc
        except OSError as exc:  # undone: the segment is as it was
            if exc.errno in READ_ONLY_ERRNOS:
                raise state.go_offline(exc, "appending a batch") from exc
            error = DiskFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StorageError
            raise error(state.directory, exc, "appending a batch") from exc

    # -- rolling --------------------------------------------------------------------
    def _maybe_roll(self, batch_size: int, header: BatchHeader) -> LogSegment:
        state = self.state
        segment = state.segments[-1]
        if segment.size == 0:
            return segment
        config = state.config
        first_ts = segment.first_batch_timestamp
        if (segment.size + batch_size > config.segment_bytes
                or (first_ts is not None and header.max_timestamp - first_ts > config.segment_ms)
                or segment.index_full
                or state.log_end_offset + header.record_count - segment.base_offset > INT32_MAX):
            return self.roll_locked()
        return segment

    def roll(self) -> None:
        """Start a new segment now (if the active one is not empty)."""
        state = self.state
        with state.lock:
            state.check_writable()
            if state.segments[-1].size:
                self.roll_locked()

    def roll_locked(self) -> LogSegment:
        """Seal the active segment and start a new one at the LEO. Caller holds the lock.
        If the new segment cannot be created, nothing changed and the old one stays active.
        In fsync durability the directory is checked first (LogDirectoryError if it is not
        ours any more). In policy durability the sealed segment is flushed first (Kafka
        flushes up to the new segment's base on roll), so the recovery point moves to the
        new base."""
        state = self.state
        config = state.config
        if config.durability == "fsync":  # whatever rolls: the new segment must go into our
            # directory, and the sealed one's unflushed writes are acknowledged only if they
            # are in our files (the group fsync's check looks at the active segment alone)
            state.check_directory(state.segments[-1])
        try:
            new = LogSegment.create(state.directory, state.log_end_offset, state.segment_config)
        except OSError as exc:
            if exc.errno in READ_ONLY_ERRNOS:
                raise state.go_offline(exc, "rolling to a new segment") from exc
            if exc.errno == errno.ENOENT:
                state.check_directory(state.segments[-1])  # raises if the directory is gone
            error = DiskFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StorageError
            raise error(state.directory, exc, "rolling to a new segment") from exc
        sealed = state.segments[-1]
        try:
            sealed.on_become_inactive()
            if config.durability == "policy":
                sealed.flush_data()
                if state.dir_dirty:  # the sealed segment's own entry, made at the last roll
                    fsync_directory(state.directory)
        except OSError as exc:  # an fsync of the sealed segment failed
            new.delete_files()
            raise state.go_offline(exc, "rolling to a new segment") from exc
        if config.durability == "policy":
            state.recovery_point = max(state.recovery_point, sealed.next_offset)
        state.set_segments(state.segments + (new,))
        state.dir_dirty = True
        state.unsynced_segments.append(new)
        return new

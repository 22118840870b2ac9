"""LogRetention: deleting a partition log's oldest segments (Kafka's retention and DeleteRecords).

Retention (Kafka's): the oldest segments while the log exceeds retention_bytes or
their largest timestamp is older than retention_ms; when every event of the
active segment is older than retention_ms it is rolled and deleted too, and the
new active segment starts empty at the same log end. delete_records_before raises
the log start offset and deletes the segments wholly below it.

Crash-safe: the new log start offset is persisted to log.state first, then the
files are renamed to `.deleted` (a directory fsync) and unlinked after
file_delete_delay_ms (PartitionState.delete_expired_files), so reads in flight finish;
the next open finishes a deletion a crash interrupted.

A part of PartitionLog over its PartitionState (partition_state.py); it rolls an
expired active segment with the appender's roll (handed in: LogAppender.roll_locked).

Concurrency: thread-safe: a pass runs under the log's lock.

Failures: an I/O error part way takes the log offline; OffsetOutOfRangeError for
a log start outside [log start, high watermark].
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import (
    OffsetOutOfRangeError,
)
from channel_engine.log.partition_state import PartitionState
from channel_engine.log.segment import LogSegment


@dataclass(frozen=True)
class RetentionResult:
    """What one retention pass deleted."""

    deleted_base_offsets: list[int]
    reasons: list[str]
    bytes_deleted: int
    events_deleted: int
    log_start_offset: int


class LogRetention:
    """Retention of a partition log (see the module doc)."""

    def __init__(self, state: PartitionState, roll_locked: Callable[[], LogSegment]) -> None:
        self.state = state
        self.roll_locked = roll_locked  # the appender's roll (log_append.py); caller holds lock

    def candidates(self, now: int, limit: int) -> list[tuple[LogSegment, str]]:
        """Oldest-first prefix of segments retention may delete now. The active segment only
        when time retention applies to every event in it (then it is rolled first)."""
        state = self.state
        config = state.config
        segments = state.segments[:-1]
        excess = state.size_bytes - config.retention_bytes if config.retention_bytes >= 0 else -1
        out = []
        for segment in segments:
            if segment.next_offset > limit:
                break
            if segment.next_offset <= state.log_start_offset:
                reason = "below the log start offset"
            elif config.retention_bytes >= 0 and excess - segment.size >= 0:
                reason = f"log exceeds retention_bytes={config.retention_bytes}"
            elif config.retention_ms >= 0 and now - segment.max_timestamp > config.retention_ms:
                reason = f"older than retention_ms={config.retention_ms}"
            else:
                break
            excess -= segment.size
            out.append((segment, reason))
        active = state.segments[-1]
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
        state = self.state
        with state.lock:
            state.check_writable()
            limit = state.high_watermark if limit_offset is None else min(limit_offset,
                                                                         state.high_watermark)
            doomed = self.candidates(state.now_ms(), limit)
            if doomed and doomed[-1][0] is state.segments[-1]:
                self.roll_locked()  # as Kafka: a log always keeps a segment, empty at the log end
            result = self._delete_segments([seg for seg, _ in doomed])
        state.delete_expired_files()
        return RetentionResult(result.deleted_base_offsets, [why for _, why in doomed],
                               result.bytes_deleted, result.events_deleted,
                               result.log_start_offset)

    def delete_records_before(self, offset: int) -> RetentionResult:
        """Raise the log start offset to `offset` (Kafka DeleteRecords) and delete the
        segments wholly below it."""
        state = self.state
        with state.lock:
            state.check_writable()
            if not state.log_start_offset <= offset <= state.high_watermark:
                raise OffsetOutOfRangeError(offset, state.log_start_offset, state.high_watermark)
            state.log_start_offset = offset
            doomed = [s for s in state.segments[:-1] if s.next_offset <= offset]
            result = self._delete_segments(doomed)
        state.delete_expired_files()
        return result

    def _delete_segments(self, doomed: list[LogSegment]) -> RetentionResult:
        """Persist the new log start, then unlink `doomed` from the log. Caller holds the lock.
        An I/O error part way takes the log offline; the next open finishes the job."""
        state = self.state
        if doomed:
            remaining = state.segments[len(doomed):]
            state.log_start_offset = max(state.log_start_offset, remaining[0].base_offset)
            state.set_segments(remaining)
        deadline = state.now_ms() + state.config.file_delete_delay_ms
        try:
            state.write_state(clean=False)
            for segment in doomed:
                segment.rename_to_deleted()
                segment.delete_after_ms = deadline
                state.pending_deletes.append(segment)
            if doomed:
                fsync_directory(state.directory)
        except OSError as exc:
            raise state.go_offline(exc) from exc
        return RetentionResult(
            [s.base_offset for s in doomed], [], sum(s.size for s in doomed),
            sum(s.next_offset - s.base_offset for s in doomed), state.log_start_offset)

"""LogFlusher: a partition log's durability (group commit, flush policy, recovery point checkpoint).

In 'fsync' durability, appenders that arrive while an fsync runs share the next
one (group commit): one leader flushes everything written so far while the others
wait; commit fsyncs run outside the append lock (rare metadata fsyncs of roll,
retention and truncation run under it). After each group fsync the committed end
goes to log.state (one 12-byte pwrite, state.py) before any waiter returns. A
flush right after a roll also fsyncs the new segment's three files and the
directory entry. In 'policy' durability flush_if_due() (the scheduler's hook)
flushes when flush_ms passed; append asks for a flush after flush_messages.

Never acknowledged unless on disk in our directory: every group fsync checks after
it returns that the active segment's path still names the file the log holds open, and
a roll checks the segment it seals before making the next (log_append.py), so the
segments before the active one hold nothing unchecked.

A part of PartitionLog over its PartitionState (partition_state.py); PartitionLog
calls make_durable after the appender's write (log_append.py) when the policy
asks for it.

Concurrency: thread-safe; see partition_state.py for the locks. The leader holds the
flush slot (flush_slot.py; not the append lock) while it fsyncs; when it lets go, it
wakes only the waiters its fsync covered and one other to lead the next.

Failures: a failed fsync takes the log offline (Linux may already have dropped the
dirty pages, so no later fsync can be trusted) and cuts each segment back to its
durable bytes, best effort, so a batch whose commit failed does not come back
after a reopen. Waiters of a batch a concurrent truncate_to removed get
StorageError.
"""
from __future__ import annotations

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import (
    StorageError,
)
from channel_engine.log.partition_state import PartitionState
from channel_engine.log.segment import LogSegment


class LogFlusher:
    """Making a partition log's writes durable (see the module doc)."""

    def __init__(self, state: PartitionState) -> None:
        self.state = state
        self.marked: set[LogSegment] = set()  # segments with commit stamps not yet synced

    # -- group commit ---------------------------------------------------------------
    def make_durable(self, end: int, epoch: int, files: bool = False) -> None:
        """Return once offsets below `end` (written in truncation epoch `epoch`) are on disk,
        and with `files` the files and directory entries of new segments too; one fsync
        serves all waiting appenders."""
        state = self.state

        def done() -> bool:  # under the slot's lock: reads only
            if (state.recovery_point >= end and state.truncations == epoch
                    and not (files and state.dir_dirty)):
                return True
            if state.truncations != epoch:
                raise StorageError(state.directory, OSError("truncated meanwhile"),
                                   "committing a batch a concurrent truncate_to removed")
            if state.offline is not None:
                raise state.offline_error()
            return False

        while state.slot.take(done):  # False: a flush covered it meanwhile
            try:
                self._flush_written()
            finally:
                state.slot.release()

    def _flush_written(self) -> None:
        """fsync everything written so far, then check that it landed in our directory
        (LogDirectoryError, nothing acknowledged, if not). Caller holds the flush slot."""
        state = self.state
        with state.lock:
            state.check_writable()
            end = state.log_end_offset
            dirty = [seg for seg in state.segments if seg.dirty]
            dir_dirty, state.dir_dirty = state.dir_dirty, False
            try:
                self._sync_new_index_files()
            except OSError as exc:
                raise state.go_offline(exc, "flushing a new segment's indexes") from exc
        try:
            for seg in dirty:
                seg.flush_data()
            if dir_dirty:
                fsync_directory(state.directory)
        except OSError as exc:
            error = state.go_offline(exc, "flushing")
            self._cut_unflushed()
            raise error from exc
        with state.lock:
            state.check_directory(dirty[-1] if dirty else state.segments[-1])
            state.recovery_point = max(state.recovery_point, end)
            state.last_flush_ms = state.now_ms()
            state.note_committed(end)  # before any waiter returns: fsync durability's ack

    def _sync_new_index_files(self) -> None:
        """fsync the (small) index files of segments rolled to since the last flush, so a
        flush after a roll leaves all three new files on disk. Caller holds the lock, which
        also keeps a roll from closing them meanwhile."""
        state = self.state
        new, state.unsynced_segments = state.unsynced_segments, []
        for seg in new:
            seg.flush_indexes()

    def _cut_unflushed(self) -> None:
        """After a failed fsync, best effort: cut each segment back to its durable bytes, so a
        batch whose commit failed does not come back after a reopen."""
        state = self.state
        with state.lock:
            for seg in state.segments:
                if seg.durable_size < seg.size:
                    try:
                        seg.cut_to_durable()
                    except OSError:
                        pass

    # -- commit stamps of transactional batches -------------------------------------
    def mark_committed(self, segment_base_offset: int, position: int) -> None:
        """Stamp a transactional batch (where append_batch put it) committed; durable after
        sync_marks() or the next flush of its segment. A deleted segment is skipped."""
        state = self.state
        with state.lock:
            state.check_writable()
            for segment in state.segments:
                if segment.base_offset == segment_base_offset:
                    try:
                        segment.mark_committed(position)
                    except OSError as exc:
                        raise state.go_offline(exc) from exc
                    self.marked.add(segment)
                    return

    def sync_marks(self) -> None:
        """Make every commit stamp so far durable."""
        state = self.state
        with state.lock:
            marked, self.marked = self.marked, set()
        try:
            for segment in marked:
                if not segment.deleted:
                    segment.sync()
        except OSError as exc:
            raise state.go_offline(exc) from exc

    # -- flushing on request and on schedule ----------------------------------------
    def flush_to(self, offset: int, epoch: int | None = None) -> None:
        """Return once every offset below `offset` is on disk (sharing an fsync with
        concurrent callers); `epoch`: the truncation epoch it was written in (else now's)."""
        state = self.state
        state.check_writable()
        if epoch is None:
            with state.lock:
                epoch = state.truncations
        self.make_durable(offset, epoch)

    def flush(self) -> None:
        """Make everything appended so far durable (Kafka's explicit flush), and the files
        and directory entries of segments rolled to since the last flush."""
        state = self.state
        state.check_writable()
        state.verify_directory()  # with nothing to write, make_durable would not look
        with state.lock:
            end, epoch = state.log_end_offset, state.truncations
        self.make_durable(end, epoch, files=True)

    def flush_if_due(self) -> bool:
        """The scheduler's hook: flush when flush_ms passed, persist the recovery point when
        its interval passed, unlink deleted files whose delay passed. True if it flushed."""
        state = self.state
        state.check_writable()
        now = state.now_ms()
        config = state.config
        flushed = False
        if ((state.unflushed_events > 0 or state.dir_dirty) and config.flush_ms is not None
                and now - state.last_flush_ms >= config.flush_ms):
            self.flush()
            flushed = True
        if (state.recovery_point != state.persisted_state.recovery_point
                and now - state.last_state_write_ms >= config.recovery_point_checkpoint_ms):
            self.checkpoint_recovery_point()
        state.delete_expired_files()
        return flushed

    def checkpoint_recovery_point(self) -> None:
        """Persist the log start offset and recovery point to log.state now, after the
        indexes of everything below the recovery point (a reopen trusts those)."""
        state = self.state
        with state.flush_slot(), state.lock:
            state.check_writable()
            try:
                for seg in state.segments:
                    seg.flush_indexes()
                state.write_state(clean=False)
            except OSError as exc:
                raise state.go_offline(exc) from exc

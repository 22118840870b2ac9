"""LogTruncation: cutting a partition log back to an offset (truncate_to, Kafka's truncateTo),
and moving its end forward past offsets handed out once (start_at).

The cut falls at the start of the batch holding the offset: the segments above it
are deleted, the one holding it is cut there (its indexes rebuilt from the rest),
and the log end, recovery point, committed end and log start follow the files at
each step. An offset in a gap between segments (offsets lost earlier) starts a new
empty segment there, so the log end never goes below it and no offset is handed
out twice. Then the kept segment and the directory are fsynced and log.state is
replaced (state.py).

start_at(offset) is the other way: the log ends below offsets a checkpoint knew were
handed out (its directory lost and made again empty, a cut tail without log.state), so
the next append must get `offset`, never a lost one again (a drain that sent offsets
below it would take new events for ones already sent). An empty log starts there
(Kafka's truncateFullyAndStartAt: log start = log end = offset); a log with events gets
a new empty active segment there, as the loader makes after a hole.

A part of PartitionLog over its PartitionState (partition_state.py). Appenders
still waiting for an fsync of a removed batch fail (the state's truncation epoch,
LogFlusher.make_durable).

Concurrency: thread-safe: it holds the flush slot and the log's lock throughout.
Not for use while readers are reading above the offset.

Failures: OffsetOutOfRangeError below the log start; an I/O error part way takes
the log offline (the next open recovers).
"""
from __future__ import annotations

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import OffsetOutOfRangeError
from channel_engine.log.partition_state import PartitionState
from channel_engine.log.segment import LogSegment


class LogTruncation:
    """Truncating a partition log (see the module doc)."""

    def __init__(self, state: PartitionState) -> None:
        self.state = state

    def truncate_to(self, offset: int) -> int:
        """Remove every event at or after `offset`. As in Kafka, the cut falls at the start of
        the batch holding `offset`; an offset in a gap between segments (offsets lost
        earlier) starts a new empty segment there, so the log end is never below it and no
        offset is handed out twice. Returns the new log end offset. Not for use while
        readers are reading above `offset`."""
        state = self.state
        with state.flush_slot(), state.lock:
            state.check_writable()
            if offset >= state.log_end_offset:
                return state.log_end_offset
            if offset < state.log_start_offset:
                raise OffsetOutOfRangeError(offset, state.log_start_offset, state.log_end_offset)
            state.truncations += 1  # appenders still waiting for an fsync must not succeed
            try:
                self._truncate(offset)
            except OSError as exc:
                raise state.go_offline(exc) from exc
            return state.log_end_offset

    def start_at(self, offset: int) -> int:
        """Make `offset` the next offset handed out, when the log ends below it (module
        doc); an empty log starts there. Returns the new log end offset."""
        state = self.state
        with state.flush_slot(), state.lock:
            state.check_writable()
            if offset <= state.log_end_offset:
                return state.log_end_offset
            empty = state.log_start_offset == state.log_end_offset
            try:
                self._start_segment_at(offset, list(state.segments))
                state.log_end_offset = state.recovery_point = state.committed_end = offset
                if empty:
                    state.log_start_offset = offset
                fsync_directory(state.directory)
                state.write_state(clean=False)
            except OSError as exc:
                raise state.go_offline(exc) from exc
            return state.log_end_offset

    def _truncate(self, offset: int) -> None:
        """truncate_to's file work; the in-memory offsets follow the files at each step."""
        state = self.state
        keep = [s for s in state.segments if s.base_offset < offset] or [state.segments[0]]
        doomed = state.segments[len(keep):]
        state.set_segments(keep)
        segment = keep[-1]
        position = segment.find_position(offset, segment.size)
        if position is not None:
            segment.truncate_file(position)
        elif segment.next_offset < offset:  # a gap: its offsets were handed out once
            for dropped in doomed:  # one of them may start at `offset`
                dropped.delete_files()
            doomed = ()
            segment = self._start_segment_at(offset, keep)
        state.log_end_offset = segment.next_offset
        state.recovery_point = min(state.recovery_point, state.log_end_offset)
        state.committed_end = min(state.committed_end, state.log_end_offset)  # handed out again
        state.log_start_offset = min(state.log_start_offset, state.log_end_offset)
        for dropped in doomed:
            dropped.delete_files()
        segment.flush()
        fsync_directory(state.directory)
        state.write_state(clean=False)

    def _start_segment_at(self, offset: int, keep: list[LogSegment]) -> LogSegment:
        """truncate_to into a gap: a new empty active segment at `offset`, so the log end
        never goes below the target (an empty last segment is replaced)."""
        state = self.state
        if keep[-1].size == 0:
            keep.pop().delete_files()
        elif keep:
            keep[-1].on_become_inactive()
        segment = LogSegment.create(state.directory, offset, state.segment_config)
        state.set_segments(keep + [segment])
        return segment

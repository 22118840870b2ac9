"""PartitionQueue: which offsets of one partition are queued, taken, or in flight.

The queue of a partition is its log from `taken_through` (the head: everything
below is taken and committed) to the log end. Above the head, offsets are in
exactly one of three states:
  * committed: taken by a transaction that committed, out of order (a later
    take committed before an earlier one);
  * in flight: reserved by a take transaction not yet committed or rolled back;
  * returned: reserved once, then rolled back (or its taker died or its lease
    expired); served again before anything never taken, in offset order;
and everything from `frontier` (the first offset never reserved) to the log end
is queued in order. So [taken_through, frontier) = committed + in flight +
returned, disjoint, and all state is O(ranges), never O(events): a take of
1000 events is one range. Offsets the log can no longer deliver (mark_lost)
leave the queue as if taken and committed: nothing counts or reserves them again.

Pure data, not thread-safe: the channel holds its lock (or, across processes,
the shared state file's lock) around every call.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

from channel_engine.queue.checkpoint import PartitionCheckpoint, QueueCheckpoint, Range


class PartitionQueue:
    """Queue state of one partition as a few sorted lists of [start, end) ranges."""

    def __init__(self, taken_through: int = 0) -> None:
        self.taken_through = taken_through
        self.frontier = taken_through
        self.committed: list[Range] = []
        self.returned: list[Range] = []
        self.in_flight: dict[int, list[Range]] = {}

    # -- takes ----------------------------------------------------------------------------
    def reserve(self, take_id: int, max_events: int, log_end: int) -> list[Range]:
        """Reserve up to max_events queued offsets for a take, oldest first; return them."""
        got: list[Range] = []
        want = max_events
        while want > 0 and self.returned:
            start, end = self.returned[0]
            if end - start <= want:
                self.returned.pop(0)
            else:
                end = start + want
                self.returned[0] = (end, self.returned[0][1])
            got.append((start, end))
            want -= end - start
        if want > 0 and self.frontier < log_end:
            end = min(log_end, self.frontier + want)
            got.append((self.frontier, end))
            self.frontier = end
        if got:
            self.in_flight.setdefault(take_id, []).extend(got)
        return got

    def commit(self, take_id: int) -> int:
        """Mark a take's ranges taken for good; return how many events that was."""
        ranges = self.in_flight.pop(take_id, [])
        for r in ranges:
            _insert(self.committed, r)
        self._advance_head()
        return sum(end - start for start, end in ranges)

    def rollback(self, take_id: int) -> int:
        """Return a take's ranges to the queue, ahead of never-taken events; return the count."""
        ranges = self.in_flight.pop(take_id, [])
        for r in ranges:
            _insert(self.returned, r)
        return sum(end - start for start, end in ranges)

    def mark_committed(self, ranges: Iterable[Range]) -> None:
        """Replay a journalled commit: these ranges are taken for good, wherever they are now
        (returned after a restart, or not yet reserved). Replaying twice changes nothing."""
        for start, end in ranges:
            start = max(start, self.taken_through)
            if end <= start:
                continue
            if end > self.frontier:  # offsets never reserved here: everything between returns
                if start > self.frontier:
                    insort(self.returned, (self.frontier, start))
                self.frontier = end
            self.returned = _subtract(self.returned, start, end)
            _insert(self.committed, (start, end))
        self.returned = _merge(self.returned)
        self._advance_head()

    def mark_lost(self, start: int, end: int) -> int:
        """The log can no longer deliver offsets [start, end) (end at most the log end the
        caller reserves up to): they leave the queue as if taken — queued, returned and in
        flight alike (an in-flight take's lost offsets leave its ranges, so its commit never
        marks them taken). Return how many of them were not yet taken: the lost events."""
        start = max(start, self.taken_through)
        if end <= start:
            return 0
        lost = end - start - _overlap(self.committed, start, end)
        for take_id, ranges in list(self.in_flight.items()):
            self.in_flight[take_id] = _subtract(ranges, start, end)
        self.mark_committed([(start, end)])
        return lost

    def _advance_head(self) -> None:
        if self.committed and self.committed[0][0] == self.taken_through:
            self.taken_through = self.committed.pop(0)[1]

    # -- counts -----------------------------------------------------------------------------
    def queued(self, log_end: int) -> int:
        """Events that a take could get now."""
        return max(0, log_end - self.frontier) + _count(self.returned)

    def untaken(self, log_end: int) -> int:
        """Events not taken and committed: queued plus in flight (what counts for capacity)."""
        return log_end - self.taken_through - _count(self.committed)

    def untaken_in(self, low: int, high: int) -> list[Range]:
        """The offsets of [low, high) not taken and committed, as ranges (queued, in flight
        or returned alike): what an event loss there costs this queue."""
        low = max(low, self.taken_through)
        if high <= low:
            return []
        return _subtract_all([(low, high)], self.committed)

    def in_flight_events(self) -> int:
        """Events reserved by takes not yet committed or rolled back."""
        return sum(_count(ranges) for ranges in self.in_flight.values())

    # -- log retention and checkpoints -------------------------------------------------------
    def skip_to(self, log_start: int) -> None:
        """The log dropped offsets below log_start (opt-in retention): they leave the queue."""
        if log_start <= self.taken_through:
            return
        self.taken_through = log_start
        self.frontier = max(self.frontier, log_start)
        self.committed = _clip(self.committed, log_start)
        self.returned = _clip(self.returned, log_start)
        for take_id, ranges in list(self.in_flight.items()):
            self.in_flight[take_id] = _clip(ranges, log_start)
        self._advance_head()

    @property
    def known_end(self) -> int:
        """The end of the offsets this queue holds state for (reserved at least once)."""
        return max(self.frontier, self.taken_through)

    def clip_to(self, log_end: int) -> int:
        """The log ends before offsets this queue knew (a flush-policy crash lost them, or
        damage was cut off): forget every state at or above log_end; return how many of
        those offsets were not taken (in flight or returned: the lost events). The caller
        checkpoints at once, so no later replay of an older journal applies the old
        offsets to new events; a writable open never hands them out again anyway (the log
        goes on after them: channel_recovery.py step 5)."""
        known = self.known_end
        if known <= log_end:
            return 0
        low = max(log_end, self.taken_through)
        lost = max(0, known - low) - _overlap(self.committed, low, known)
        self.taken_through = min(self.taken_through, log_end)
        self.frontier = min(self.frontier, log_end)
        self.committed = _below(self.committed, log_end)
        self.returned = _below(self.returned, log_end)
        for take_id, ranges in list(self.in_flight.items()):
            self.in_flight[take_id] = _below(ranges, log_end)
        self._advance_head()
        return lost

    def to_checkpoint(self, log_start: int, recovery_point: int,
                      log_end: int) -> PartitionCheckpoint:
        """The state to persist: head, committed and in-flight ranges, and the log's offsets."""
        in_flight = sorted(r for ranges in self.in_flight.values() for r in ranges)
        return PartitionCheckpoint(log_start, recovery_point, log_end, self.taken_through,
                                   tuple(self.committed), tuple(in_flight))

    @classmethod
    def from_checkpoint(cls, saved: PartitionCheckpoint | QueueCheckpoint) -> PartitionQueue:
        """Restore after a restart: takes that were in flight are returned to the queue."""
        queue = cls(saved.taken_through)
        queue.committed = _merge(sorted(saved.committed))
        taken = queue.committed + sorted(saved.in_flight)
        queue.frontier = max([queue.taken_through] + [end for _, end in taken])
        queue.returned = _gaps(queue.taken_through, queue.frontier, queue.committed)
        queue._advance_head()
        return queue


def _count(ranges: Iterable[Range]) -> int:
    return sum(end - start for start, end in ranges)


def _overlap(ranges: Iterable[Range], low: int, high: int) -> int:
    """How many offsets of [low, high) the ranges cover (they do not overlap each other)."""
    return sum(max(0, min(end, high) - max(start, low)) for start, end in ranges)


def _insert(ranges: list[Range], new: Range) -> None:
    """Insert a range into a sorted, merged list, merging it with its neighbours only: a
    commit costs O(log n) plus the list shift, not a pass over every range."""
    start, end = new
    if end <= start:
        return
    i = bisect_left(ranges, new)
    if i > 0 and ranges[i - 1][1] >= start:
        i -= 1
        start = min(start, ranges[i][0])
        end = max(end, ranges[i][1])
        del ranges[i]
    while i < len(ranges) and ranges[i][0] <= end:
        end = max(end, ranges[i][1])
        del ranges[i]
    ranges.insert(i, (start, end))


def _merge(ranges: list[Range]) -> list[Range]:
    merged: list[Range] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        elif end > start:
            merged.append((start, end))
    return merged


def _subtract(ranges: list[Range], low: int, high: int) -> list[Range]:
    out: list[Range] = []
    for start, end in ranges:
        if end <= low or start >= high:
            out.append((start, end))
            continue
        if start < low:
            out.append((start, low))
        if end > high:
            out.append((high, end))
    return out


def _subtract_all(ranges: list[Range], taken: Iterable[Range]) -> list[Range]:
    for start, end in taken:
        ranges = _subtract(ranges, start, end)
    return ranges


def union_count(ranges: Iterable[Range]) -> int:
    """How many offsets the ranges cover together (they may overlap)."""
    return _count(_merge(sorted(ranges)))


def _clip(ranges: list[Range], low: int) -> list[Range]:
    return [(max(start, low), end) for start, end in ranges if end > low]


def _below(ranges: list[Range], high: int) -> list[Range]:
    return [(start, min(end, high)) for start, end in ranges if start < high]


def _gaps(low: int, high: int, taken: list[Range]) -> list[Range]:
    gaps, position = [], low
    for start, end in taken:
        if start > position:
            gaps.append((position, start))
        position = max(position, end)
    if position < high:
        gaps.append((position, high))
    return gaps

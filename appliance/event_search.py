"""Search a channel's events newest first across partitions, without taking them: the
message browser's one read path (the UI's latest events, the search API and its UI).

How a scan goes. Each partition is read backwards in chunks (channel.read, the same read
the per-partition events API uses: committed events only, the queue never moves), from an
exclusive upper position down to its log start offset. The partitions' heads are merged by
timestamp (newest first; ties by partition, then offset), so a page of hits is in one
order across partitions, as Kafdrop's and AKHQ's "newest" views are. Every event merged
counts as scanned, matching or not. When retention deletes a partition's oldest events
while it is scanned or tailed, the read goes on from the new log start (the error says
where it is): nothing still kept is skipped.

What a reader may see of each partition, from its log start offset up to its last stable
offset, comes from channel.list_offsets(): one small round trip to the owner per search or
tail request, never the channel's whole status().

Bounds. A scan stops at `limit` hits, at `scan_limit` events scanned, once its hits hold
`max_bytes` (keys, headers and bodies: a read's worth, DEFAULT_READ_BYTES, as the
per-partition events API answers at most), or when its time budget is spent (checked
between events, and before each read of a partition, the first fill included); it then
says why and returns a cursor (each
partition's position) from which a next scan goes on with older events. One event's match
is bounded too: a regular expression is RE2's (linear in the text, no backtracking) and
`contains` and the regex see a body's first MATCH_BYTES only.

Positions and cursors are `{partition: offset}`: for a backward scan the first offset not
yet scanned is below the position (exclusive bound); for a tail (`read_after`) the next
event to show is at the position. As text: "0:120,1:98" (cursor_text / parse_cursor).
"""
from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from channel_engine import Channel, Event, OffsetOutOfRangeError
from channel_engine.log.log_read import DEFAULT_READ_BYTES

CHUNK_EVENTS = 200  # events read from a partition at a time (one owner round trip)
MATCH_BYTES = 1024 * 1024  # the part of a body `contains` and a regex look at


class Pattern(Protocol):
    """A compiled regular expression (RE2's: search_query.py compiles it)."""

    def search(self, text: str) -> object: ...  # noqa: D102


@dataclass(frozen=True)
class Filters:
    """What a hit must match; every filter given must match (none given: every event)."""

    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    contains: bytes | None = None
    regex: Pattern | None = None

    def match(self, event: Event) -> bool:
        """Does the event pass every filter?"""
        if self.key is not None and event.key != self.key:
            return False
        if any(event.headers.get(name) != value for name, value in self.headers):
            return False
        if self.contains is not None and event.body.find(self.contains, 0, MATCH_BYTES) < 0:
            return False
        return self.regex is None or bool(self.regex.search(
            event.body[:MATCH_BYTES].decode("utf-8", errors="replace")))


STOPPED = ("limit", "bytes", "scan_limit", "time_budget")  # why a scan stopped
EARLY = ("scan_limit", "time_budget")  # stopped before a page of hits was found


@dataclass(frozen=True)
class Bounds:
    """How far one scan may go."""

    limit: int = 50            # hits
    max_bytes: int = DEFAULT_READ_BYTES  # hits' bytes (event_size)
    scan_limit: int = 10_000   # events scanned
    budget_s: float = 2.0      # wall time


@dataclass
class SearchResult:
    """One scan: its hits newest first, how much it scanned and of what, why it stopped
    (None: nothing older is left), where a next scan goes on (None: nowhere) and where a
    tail of what was searched starts (each partition's end when the scan began)."""

    hits: list[Event]
    scanned: int
    total: int
    remaining: int
    stopped: str | None
    cursor: dict[int, int] | None
    tail: dict[int, int]


@dataclass
class _Backwards:
    """One partition read backwards: a chunk buffered (in offset order, the head last)
    above `below`.

    A read answers about DEFAULT_READ_BYTES (channel_engine's log read) from its start
    offset on, so a chunk of big events can come back cut short of `below`: the chunk is
    then read again narrower (`span`, down to one event), so the buffer holds one read's
    worth at most; after a whole chunk it widens again."""

    channel: Channel
    partition: int
    start: int
    below: int
    buffer: list[Event] = field(default_factory=list)
    span: int = CHUNK_EVENTS

    def head(self, late: Callable[[], bool] = lambda: False) -> Event | None:
        """The newest event not yet scanned (reading the next chunk when needed); None when
        none is left, or when a read is needed and `late()` says the time is up."""
        while not self.buffer and self.below > self.start:
            if late():
                return None
            span = min(self.span, self.below - self.start)
            low = self.below - span
            try:
                got = [e for e in self.channel.read(self.partition, low, span)
                       if e.offset < self.below]
            except OffsetOutOfRangeError as exc:
                if exc.log_start_offset <= self.start:  # not retention: nothing to go on with
                    raise
                # retention removed the oldest meanwhile: what is left above is still here
                self.start = min(exc.log_start_offset, self.below)
                continue
            if got and got[-1].offset + 1 < self.below and span > 1:  # cut short
                self.span = max(1, min(len(got), span - 1))
                continue
            self.span = min(CHUNK_EVENTS, self.span * 2)
            self.buffer = got
            self.below = low
        return self.buffer[-1] if self.buffer else None

    def pop(self) -> None:
        """The head is scanned."""
        self.buffer.pop()

    def position(self) -> int:
        """Exclusive bound of what is not yet scanned."""
        return self.buffer[-1].offset + 1 if self.buffer else self.below


def search(channel: Channel, partitions: Sequence[int], filters: Filters, bounds: Bounds,
           cursor: dict[int, int] | None = None,
           clock: Callable[[], float] = time.monotonic,
           ranges: list[tuple[int, int]] | None = None) -> SearchResult:
    """Scan `partitions` newest first (from `cursor`, else from their ends) for hits;
    `ranges`: channel.list_offsets() when the caller has them, else they are asked for."""
    ranges = ranges or channel.list_offsets()
    tail = {p: ranges[p][1] for p in partitions}
    scans = [_Backwards(channel, p, ranges[p][0],
                        min(max((cursor or tail).get(p, ranges[p][0]), ranges[p][0]),
                            ranges[p][1]))
             for p in partitions]
    total = sum(ranges[p][1] - ranges[p][0] for p in partitions)
    hits, scanned, stopped = _merge(scans, filters, bounds, clock)
    remaining = sum(s.position() - s.start for s in scans)
    positions = {s.partition: s.position() for s in scans} if remaining else None
    return SearchResult(hits, scanned, total, remaining, stopped if remaining else None,
                        positions, tail)


def _merge(scans: list[_Backwards], filters: Filters, bounds: Bounds,
           clock: Callable[[], float]) -> tuple[list[Event], int, str | None]:
    """Merge the partitions newest first until a bound; (hits, scanned, which bound)."""
    late = _Deadline(clock, bounds.budget_s)
    heap: list[tuple[int, int, int, int]] = []
    for i, scan in enumerate(scans):
        _push(heap, i, scan, late)
    hits: list[Event] = []
    scanned = size = 0
    while heap:
        if len(hits) >= bounds.limit:
            return hits, scanned, "limit"
        if size >= bounds.max_bytes:
            return hits, scanned, "bytes"
        if scanned >= bounds.scan_limit:
            return hits, scanned, "scan_limit"
        if late():
            return hits, scanned, "time_budget"
        *_, i = heapq.heappop(heap)
        event = scans[i].head()
        assert event is not None  # pushed because it had one
        scans[i].pop()
        scanned += 1
        if filters.match(event):
            hits.append(event)
            size += event_size(event)
        _push(heap, i, scans[i], late)
    # a partition left unread because the time was up is not done: search() sees it remain
    return hits, scanned, "time_budget" if late.passed else None


class _Deadline:
    """Is the time budget spent? Once it is, it stays spent (a partition not read for
    lack of time must end the scan, not be skipped by it)."""

    def __init__(self, clock: Callable[[], float], budget_s: float) -> None:
        self.clock, self.at, self.passed = clock, clock() + budget_s, False

    def __call__(self) -> bool:
        self.passed = self.passed or self.clock() >= self.at
        return self.passed


def event_size(event: Event) -> int:
    """The bytes an event holds: key, header names and values, body."""
    return (len(event.key or b"") + len(event.body)
            + sum(len(name) + len(value) for name, value in event.headers.items()))


def _push(heap: list[tuple[int, int, int, int]], i: int, scan: _Backwards,
          late: Callable[[], bool]) -> None:
    event = scan.head(late)
    if event is not None:  # max-heap by (timestamp, partition, offset)
        heapq.heappush(heap, (-event.timestamp, -event.partition, -event.offset, i))


def cursor_text(cursor: dict[int, int] | None) -> str | None:
    """A cursor as text: "0:120,1:98"."""
    return None if cursor is None else ",".join(f"{p}:{o}" for p, o in sorted(cursor.items()))


def parse_cursor(text: str, partitions: int) -> dict[int, int]:
    """A cursor from its text; ValueError saying what is wrong."""
    cursor: dict[int, int] = {}
    for part in text.split(","):
        p, sep, o = part.partition(":")
        if not (sep and p.isascii() and p.isdigit() and o.isascii() and o.isdigit()
                and len(p) < 7 and len(o) < 20):
            raise ValueError(f"{part!r} is not partition:offset")
        if int(p) >= partitions:
            raise ValueError(f"partition {p} is not in 0..{partitions - 1}")
        cursor[int(p)] = int(o)
    return cursor


def read_after(channel: Channel, positions: dict[int, int], filters: Filters,
               limit: int, max_bytes: int = DEFAULT_READ_BYTES
               ) -> tuple[list[Event], dict[int, int], int]:
    """The events at or after each partition's position (a tail), up to `limit` matching
    ones oldest first across partitions; (hits, the next positions, events scanned).

    The partitions share one read's worth of bytes (`max_bytes`): each partition after the
    first is asked for as many events as fit in what is left, going by the biggest event
    read so far, and for one at least, so every partition still moves on (the engine's read
    has an event count, not a byte count: the bound is an estimate, within one read)."""
    ranges = channel.list_offsets()
    runs: list[list[Event]] = []
    biggest = 0
    for p, position in positions.items():
        start, end = ranges[p]
        at = min(max(position, start), end)
        fits = limit if not biggest else max(1, max_bytes // biggest)
        want = min(end - at, limit, fits)
        runs.append(_read_kept(channel, p, at, want) if want > 0 else [])
        sizes = [event_size(e) for e in runs[-1]]
        max_bytes -= sum(sizes)
        biggest = max([biggest, *sizes])
    following = {p: min(max(o, ranges[p][0]), ranges[p][1]) for p, o in positions.items()}
    hits: list[Event] = []
    scanned = 0
    # merge keeps each partition's offset order even where its timestamps go backwards
    for event in heapq.merge(*runs, key=lambda e: (e.timestamp, e.partition, e.offset)):
        if len(hits) >= limit:
            break
        scanned += 1
        following[event.partition] = event.offset + 1
        if filters.match(event):
            hits.append(event)
    return hits, following, scanned


def _read_kept(channel: Channel, partition: int, offset: int, max_events: int) -> list[Event]:
    """channel.read from `offset`, or from the log start when retention has passed it since
    the ranges were fetched."""
    while True:
        try:
            return channel.read(partition, offset, max_events)
        except OffsetOutOfRangeError as exc:
            if exc.log_start_offset <= offset:  # not retention (beyond the end): a real error
                raise
            offset = exc.log_start_offset


def describe(result: SearchResult) -> dict[str, Any]:
    """A scan's figures (without its hits) as the API and the UI show them."""
    return {"scanned": result.scanned, "total": result.total, "remaining": result.remaining,
            "stopped": result.stopped,
            "stopped_early": result.stopped in EARLY,
            "cursor": cursor_text(result.cursor), "tail": cursor_text(result.tail)}

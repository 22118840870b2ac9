"""TimeIndex: the sparse `.timeindex` file of a segment, in Kafka's layout.

    offset  size  field
    ------  ----  ------------------------------------------------------------
         0     8  timestamp       int64 BE, ms
         8     4  relativeOffset  int32 BE: offset - segment base offset

An entry (T, o) says: the largest timestamp in the segment up to offset o is T,
and the batch ending at o holds it. An entry is added, together with an offset
index entry, only when T is greater than the last entry's; roll, close and
recovery add the final (max timestamp, offset) so the last entry is the
segment's largest timestamp. Both columns increase. No header, as in Kafka;
checked on open and at every use (the batch ending at o must exist and hold T),
rebuilt from the log when wrong, like the offset index.

maybe_append, as Kafka's TimeIndex.maybeAppend: a timestamp not larger than the
last entry's is ignored (Kafka raises for a smaller one; Weir's writer passes a
running maximum, so ignoring is the same and cannot fail an append); an entry
that would be added to a full index is refused with IndexAppendError (one slot
is kept for the final entry of roll, close and recovery, which skip that check),
and so is one whose offset goes backwards, as in Kafka. An empty index behaves
as if its last entry were (-1, base), Kafka's NO_TIMESTAMP.

Lookup for offsets_for_time(t): the last entry with T < t, so that every record
up to its offset is older than t and the scan for the first record with
timestamp >= t may start right after it.
"""
from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from pathlib import Path

from channel_engine.errors import CorruptIndexError, IndexAppendError
from channel_engine.log.index_file import IndexFile

ENTRY = struct.Struct(">qi")
assert ENTRY.size == 12
NO_TIMESTAMP = -1


class TimeIndex(IndexFile):
    """Sparse map from a max timestamp so far to the offset of the batch holding it."""

    ENTRY_SIZE = ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_bytes: int, writable: bool) -> None:
        super().__init__(path, max(2, max_bytes // self.ENTRY_SIZE), writable)
        self.base_offset = base_offset
        self._timestamps = array("q")
        self._relative = array("i")

    def __len__(self) -> int:
        return len(self._timestamps)

    def load(self) -> None:
        """Read the file and check its shape; raise CorruptIndexError when it is wrong."""
        data = self._read_file()
        if len(data) % self.ENTRY_SIZE:
            raise CorruptIndexError(
                self.path, f"size {len(data)} is not a multiple of {self.ENTRY_SIZE}"
            )
        timestamps, relative = array("q"), array("i")
        for i, (ts, rel) in enumerate(ENTRY.iter_unpack(data)):
            if rel < 0:
                raise CorruptIndexError(self.path, f"entry {i}: offset below the base")
            if ts < NO_TIMESTAMP:  # Kafka's timestamps are -1 (none) or epoch milliseconds
                raise CorruptIndexError(self.path, f"entry {i}: timestamp {ts} is negative")
            if timestamps and (ts <= timestamps[-1] or rel < relative[-1]):
                raise CorruptIndexError(
                    self.path,
                    f"entry {i}: ({ts}, {rel}) does not follow ({timestamps[-1]}, {relative[-1]})",
                )
            timestamps.append(ts)
            relative.append(rel)
        self._timestamps, self._relative = timestamps, relative

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Add (timestamp, offset) if the timestamp is larger than the last entry's; refuse an
        offset going backwards, or a full index (skip_full_check: the final entry's slot)."""
        if timestamp <= (self._timestamps[-1] if self._timestamps else NO_TIMESTAMP):
            return
        room = self.max_entries if skip_full_check else self.max_entries - 1
        if len(self._timestamps) >= room:
            raise IndexAppendError(self.path, f"entry ({timestamp}, {offset}) refused: the "
                                              f"time index is full ({len(self)} entries)")
        relative = offset - self.base_offset
        if relative < (self._relative[-1] if self._relative else 0):
            last = self.base_offset + (self._relative[-1] if self._relative else 0)
            raise IndexAppendError(self.path, f"entry ({timestamp}, {offset}) refused: offset "
                                              f"goes back below {last}")
        self._timestamps.append(timestamp)
        self._relative.append(relative)
        self._write_entry(ENTRY.pack(timestamp, relative))

    def lookup_before(self, timestamp: int) -> int | None:
        """Return the offset of the last entry whose timestamp is < `timestamp`, or None."""
        i = bisect_left(self._timestamps, timestamp) - 1
        if i < 0:
            return None
        return self.base_offset + self._relative[i]

    def lookup_slot(self, timestamp: int) -> int:
        """Index of the last entry whose timestamp is < `timestamp`, or -1 when none."""
        return bisect_left(self._timestamps, timestamp) - 1

    def replace_entries(self, entries: list[tuple[int, int]]) -> None:
        """Swap in entries (timestamp, absolute offset) rebuilt from the log, memory and file."""
        timestamps = array("q", (timestamp for timestamp, _ in entries))
        relative = array("i", (offset - self.base_offset for _, offset in entries))
        self._timestamps, self._relative = timestamps, relative
        self._rewrite(b"".join(ENTRY.pack(t, r) for t, r in zip(timestamps, relative,
                                                                   strict=True)))

    def entry(self, i: int) -> tuple[int, int]:
        """Return entry i as (timestamp, absolute offset)."""
        return self._timestamps[i], self.base_offset + self._relative[i]

    def last_entry(self) -> tuple[int, int] | None:
        """Return the last entry, or None when empty."""
        return self.entry(-1) if self._timestamps else None

    def truncate_to_offset(self, offset: int) -> None:
        """Drop the entries whose offset is >= `offset`."""
        keep = len(self._relative)
        while keep and self.base_offset + self._relative[keep - 1] >= offset:
            keep -= 1
        del self._timestamps[keep:]
        del self._relative[keep:]
        self._truncate_file(keep)

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self._timestamps = array("q")
        self._relative = array("i")
        self._rewrite(b"")

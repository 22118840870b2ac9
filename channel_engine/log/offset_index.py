"""OffsetIndex: the sparse `.index` file of a segment, in Kafka's layout.

    offset  size  field
    ------  ----  ------------------------------------------------------------
         0     4  relativeOffset  int32 BE: entry offset - segment base offset
         4     4  position        int32 BE: byte position of a batch in .log

An entry (o, p) says: the batch that starts at byte p ends with offset o (Kafka
maps the last offset of an appended batch to where the batch starts). Entries
are added when more than index_interval_bytes were appended since the last
entry, checked before counting the batch, so the first batch is never indexed,
and only while neither index is full (a segment reopened with a smaller
segment_index_bytes just stops adding entries). Both columns strictly increase.
The file has no header: Kafka's layout has no room for one, and the index is
derived data that is checked against the log on every open and at every use
(LogSegment.find_position verifies the batch an entry points at) and rebuilt
when wrong (see segment_reader.py).

Appends are refused (IndexAppendError) when the index is full (max_entries, as
Kafka's OffsetIndex; the log rolls before that) or an entry does not increase.

Lookup: the largest entry with offset <= target, or (base, 0) when none.
"""
from __future__ import annotations

import operator
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from channel_engine.errors import CorruptIndexError, IndexAppendError
from channel_engine.log.index_file import IndexFile

ENTRY = struct.Struct(">ii")
assert ENTRY.size == 8


class OffsetIndex(IndexFile):
    """Sparse map from the last offset of a batch to the byte position where it starts."""

    ENTRY_SIZE = ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_bytes: int, writable: bool) -> None:
        super().__init__(path, max(2, max_bytes // self.ENTRY_SIZE), writable)
        self.base_offset = base_offset
        self._relative = array("i")
        self._positions = array("i")

    def __len__(self) -> int:
        return len(self._relative)

    def load(self) -> None:
        """Read the file and check its shape; raise CorruptIndexError when it is wrong."""
        data = self._read_file()
        if len(data) % self.ENTRY_SIZE:
            raise CorruptIndexError(
                self.path, f"size {len(data)} is not a multiple of {self.ENTRY_SIZE}"
            )
        pairs = array("i", data)
        if sys.byteorder == "little":
            pairs.byteswap()
        relative, positions = pairs[0::2], pairs[1::2]
        _check_increasing(self.path, relative, "offset")
        _check_increasing(self.path, positions, "position")
        if relative and relative[0] < 0:
            raise CorruptIndexError(self.path, f"entry offset {relative[0]} below the base")
        if positions and positions[0] < 0:
            raise CorruptIndexError(self.path, f"entry position {positions[0]} is negative")
        self._relative, self._positions = relative, positions

    def append(self, offset: int, position: int) -> None:
        """Add an entry; offsets and positions must increase and the index must have room."""
        relative = offset - self.base_offset
        if len(self._relative) >= self.max_entries:
            raise IndexAppendError(self.path, f"entry ({offset}, {position}) refused: the index "
                                              f"is full ({self.max_entries} entries)")
        if self._relative and (relative <= self._relative[-1] or position <= self._positions[-1]):
            raise IndexAppendError(
                self.path,
                f"entry ({offset}, {position}) does not follow "
                f"({self.base_offset + self._relative[-1]}, {self._positions[-1]})",
            )
        self._relative.append(relative)
        self._positions.append(position)
        self._write_entry(ENTRY.pack(relative, position))

    def lookup(self, offset: int) -> tuple[int, int]:
        """Return (offset, position) of the largest entry with offset <= target, else (base, 0)."""
        i = bisect_right(self._relative, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._relative[i], self._positions[i]

    def lookup_slot(self, offset: int) -> int:
        """Index of the largest entry with offset <= target, or -1 when none."""
        return bisect_right(self._relative, offset - self.base_offset) - 1

    def slot_below_position(self, position: int) -> int:
        """Index of the last entry pointing below byte `position`, or -1 when none."""
        return bisect_left(self._positions, position) - 1

    def replace_entries(self, entries: list[tuple[int, int]]) -> None:
        """Swap in entries (absolute offset, position) rebuilt from the log, memory and file."""
        relative = array("i", (offset - self.base_offset for offset, _ in entries))
        positions = array("i", (position for _, position in entries))
        self._relative, self._positions = relative, positions
        self._rewrite(b"".join(ENTRY.pack(r, p) for r, p in zip(relative, positions,
                                                                   strict=True)))

    def entry(self, i: int) -> tuple[int, int]:
        """Return entry i as (absolute offset, position)."""
        return self.base_offset + self._relative[i], self._positions[i]

    def last_entry(self) -> tuple[int, int]:
        """Return the last entry, or (base, 0) when empty."""
        return self.entry(-1) if self._relative else (self.base_offset, 0)

    def truncate_to_position(self, position: int) -> None:
        """Drop the entries that point at or after `position`."""
        keep = bisect_right(self._positions, position - 1)
        del self._relative[keep:]
        del self._positions[keep:]
        self._truncate_file(keep)

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self._relative = array("i")
        self._positions = array("i")
        self._rewrite(b"")


def _check_increasing(path: Path, column: array, name: str) -> None:  # type: ignore[type-arg]
    if all(map(operator.lt, column, column[1:])):
        return
    for i in range(1, len(column)):
        if column[i] <= column[i - 1]:
            raise CorruptIndexError(
                path, f"entry {i}: {name} {column[i]} does not increase (after {column[i - 1]})"
            )

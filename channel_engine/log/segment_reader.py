"""SegmentReader: a segment's reads, and the repair at use of indexes found wrong.

A collaborator of LogSegment (segment.py) over the segment's SegmentFile
(segment_file.py: the descriptor, the counters, the indexes). Finding the batch
that holds an offset (find_position) or the first offset that may hold a time
(start_for_time), and reading batches or their headers from a byte position
(read_batches, headers_at). Reads no format of their own: batch headers are
record_batch.py's, index entries offset_index.py's and time_index.py's.

Indexes are never trusted at use: find_position checks that the batch an offset
index entry points at has a valid header whose last offset is the entry's (so its
base offset is <= the target), and start_for_time checks a time index entry
against the batch it names. A wrong entry rebuilds both indexes from the batch
headers (repair_indexes, counted in index_rebuilds and logged) and the lookup
starts again; a lookup never skips a batch and never fails because of a derived
file. A batch whose base offset field alone is damaged is delivered with the
offsets its place holds (true_base_offset, damage.fixable_base_offset).

Concurrency: readers may call these concurrently with one appender: they only look
at bytes below a size and an offset bound taken before they start, which cover
complete batches only. A repair at use runs in the reader's thread under the
segment's index lock (SegmentFile.index_lock), which append, roll and
truncate_file also take around their index work; readers see the old or the new
entries whole (each is verified anyway).
The reader's one piece of its own state, `_found` (the last batch find_position
landed on), is shared by every thread reading this segment and written without a
lock: a reader may see another's. It is only a size hint for the first read of
read_batches (assigned as one tuple, so never half-written); a stale one costs a
second read, never a wrong batch, since every batch read is checked.

Failures: damage met by a read raises CorruptRecordError naming the file and the
byte (the partition log skips it and counts the loss); an index file that cannot
be rewritten after a repair is logged and checked again at the next use.
"""
from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from channel_engine.errors import CorruptRecordError, InvalidBatch
from channel_engine.log.damage import fixable_base_offset
from channel_engine.log.record_batch import HEADER_SIZE, BatchHeader, check_crc, check_header
from channel_engine.log.segment_file import (
    FIRST_READ_CHUNK,
    NO_TIMESTAMP,
    READ_CHUNK,
    SegmentFile,
)

logger = logging.getLogger(__name__)

_REPAIRED = object()  # find_position's marker: the entry was wrong, indexes rebuilt


class _NoMap:
    """Stands in for the mmap of an empty file (mmap refuses length 0)."""

    def __enter__(self) -> bytes:
        return b""

    def __exit__(self, *exc: object) -> None:
        return None


class SegmentReader:
    """Reads of one segment, verifying every index entry they use (see the module doc)."""

    def __init__(self, file: SegmentFile) -> None:
        self.file = file  # the state: descriptor, counters, indexes (segment_file.py)
        # the last batch find_position landed on, (position, header): a read that starts
        # there reads that batch's size, not a 64 KiB chunk, when it needs only that batch
        # (a take of one producer's batch). Only a size hint: every read is checked anyway
        self._found: tuple[int, BatchHeader] | None = None

    # -- finding an offset or a time ------------------------------------------------
    def find_position(self, offset: int, size_bound: int) -> int | None:
        """Byte position of the batch holding `offset` (below size_bound), or None if none.
        Starts from a verified offset index entry; a wrong one is repaired, never followed."""
        for _ in range(3):
            found = self._find_from_index(offset, size_bound)
            if found is not _REPAIRED:
                return found  # type: ignore[return-value]
        return self._walk_to(offset, 0, size_bound, None)  # still racing a rewrite: no index

    def _find_from_index(self, offset: int, size_bound: int) -> int | None | object:
        """find_position from the index entry for `offset`; _REPAIRED if that entry was wrong."""
        file = self.file
        index, generation = file.offset_index, file.index_generation
        slot = index.lookup_slot(offset)
        try:
            entry = index.entry(slot) if slot >= 0 else None
            if entry is not None and entry[1] >= size_bound:
                if entry[1] > file.size:  # no batch starts past the valid end
                    return self._repair(generation, index.path, f"entry ({entry[0]}, "
                                        f"{entry[1]}) points past the valid end {file.size}")
                slot = min(slot, index.slot_below_position(size_bound))  # appended meanwhile
                entry = index.entry(slot) if slot >= 0 else None
        except IndexError:  # the arrays were swapped by a repair meanwhile: look again
            return _REPAIRED
        if entry is None:
            return self._walk_to(offset, 0, size_bound, None)
        entry_offset, position = entry
        try:
            if position < 0:
                raise InvalidBatch("corrupt", "a negative position")
            header = file.header_at(position, None)
        except InvalidBatch as exc:
            return self._repair(generation, index.path, f"entry ({entry_offset}, {position}) "
                                                        f"points at no batch: {exc.reason}")
        if header.last_offset != entry_offset or header.base_offset < file.base_offset:
            return self._repair(generation, index.path,
                                f"entry ({entry_offset}, {position}) points at the batch of "
                                f"offsets {header.base_offset}..{header.last_offset}")
        return self._walk_to(offset, position, size_bound, header)

    def _walk_to(self, offset: int, position: int, size_bound: int,
                 header: BatchHeader | None) -> int | None:
        """Walk batch headers from `position` to the one holding `offset`."""
        file = self.file
        while position < size_bound:
            if header is None:
                try:
                    header = file.header_at(position, None)
                except InvalidBatch as exc:
                    raise CorruptRecordError(file.log_path, position, exc.reason) from exc
            if header.last_offset >= offset:
                self._found = (position, header)
                return position
            position += header.size
            header = None
        return None

    def start_for_time(self, timestamp: int) -> int:
        """First offset that may hold a record with a timestamp >= `timestamp`: the one after
        the last time index entry older than it, once that entry is verified against its
        batch (it must end at the entry's offset and hold the entry's timestamp)."""
        file = self.file
        index = file.time_index
        for _ in range(3):
            generation = file.index_generation
            slot = index.lookup_slot(timestamp)
            if slot < 0:
                return file.base_offset
            try:
                entry_timestamp, entry_offset = index.entry(slot)
            except IndexError:
                continue  # swapped by a repair meanwhile
            problem = self._time_entry_problem(entry_timestamp, entry_offset)
            if problem is None:
                return entry_offset + 1
            self._repair(generation, index.path, problem)
        return file.base_offset  # no trusted entry: scan the whole segment

    def _time_entry_problem(self, timestamp: int, offset: int) -> str | None:
        file = self.file
        what = f"time index entry ({timestamp}, {offset})"
        if not file.base_offset <= offset < file.next_offset:
            return f"{what} points outside offsets {file.base_offset}..{file.next_offset - 1}"
        try:
            position = self.find_position(offset, file.size)
            header = file.header_at(position, None) if position is not None else None
        except (InvalidBatch, CorruptRecordError) as exc:
            return f"{what}: {exc}"
        if header is None or header.last_offset != offset or header.max_timestamp != timestamp:
            found = "no batch" if header is None else (
                f"the batch ending at {header.last_offset} with max timestamp "
                f"{header.max_timestamp}")
            return f"{what} disagrees with the log: {found}"
        return None

    # -- reading batches ------------------------------------------------------------
    def headers(self, offset: int) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of the batches from the one holding `offset` to the valid end,
        without reading the records (for scans that open already checked)."""
        file = self.file
        position = self.find_position(offset, file.size)
        if position is not None:
            yield from self.headers_at(position, file.size, None)

    def headers_at(self, position: int, size_bound: int, first_base: tuple[int, int] | None
                   ) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of the batches from `position` to size_bound, records unread;
        first_base checks offsets as in read_batches. Raises CorruptRecordError on damage."""
        file = self.file
        expected = first_base
        while position < size_bound:
            try:
                header = file.header_at(position, None)
                if expected is not None:
                    header = self._checked_base(position, header, expected, size_bound)
            except InvalidBatch as exc:
                raise CorruptRecordError(file.log_path, position, exc.reason) from exc
            expected = (header.next_offset, header.next_offset)
            yield position, header
            position += header.size

    def read_batches(
        self, position: int, size_bound: int, offset_bound: int, max_bytes: int,
        first_base: tuple[int, int] | None = None,
    ) -> Iterator[tuple[int, BatchHeader, bytes]]:
        """Yield (position, header, bytes) of CRC-checked batches from `position` while their
        base offset is below offset_bound and they end within size_bound. The first batch is
        yielded whole; later ones only while the total stays within max_bytes. With
        first_base=(lo, hi) the offsets are checked too (their field lies outside the CRC):
        the first base offset within [lo, hi], each next one following the previous batch.
        A read stops after the batch that holds offset_bound - 1, without reading the next
        header: damage in the batch after it is reported (CorruptRecordError) by the read
        that wants that batch's offsets, not by one ending just before them."""
        file = self.file
        total = 0
        buf, buf_start = b"", position
        expected = first_base
        chunk = FIRST_READ_CHUNK  # doubled at each read: small reads stay small, scans grow
        found = self._found
        if found is not None and found[0] == position and found[1].next_offset >= offset_bound:
            chunk = found[1].size  # the one batch wanted, found just before (a size hint)
        while position < size_bound:
            rel = position - buf_start
            if rel + HEADER_SIZE > len(buf):
                buf, buf_start, rel = file.read_at(position, HEADER_SIZE, size_bound, chunk), \
                    position, 0
                chunk = min(2 * chunk, READ_CHUNK)
            try:
                header = stored = check_header(buf, rel, None)
                if expected is not None:
                    header = self._checked_base(position, header, expected, size_bound)
                    expected = (header.next_offset, header.next_offset)
                if header.base_offset >= offset_bound:
                    return
                if position + header.size > size_bound:
                    raise InvalidBatch("partial", f"batch runs past byte {size_bound}")
                if rel + header.size > len(buf):
                    buf, buf_start = file.read_at(position, header.size, size_bound, chunk), \
                        position
                    rel = 0
                    chunk = min(2 * chunk, READ_CHUNK)
                check_crc(buf, rel, header)
            except InvalidBatch as exc:
                raise CorruptRecordError(file.log_path, position, exc.reason) from exc
            if total and total + header.size > max_bytes:
                return
            total += header.size
            data = buf[rel:rel + header.size]
            if header is not stored:  # only its base offset field was damaged
                data = header.base_offset.to_bytes(8, "big", signed=True) + data[8:]
            yield position, header, data
            position += header.size
            if header.next_offset >= offset_bound:
                return  # the next batch starts at that offset: no read of it for nothing

    def _checked_base(self, position: int, header: BatchHeader, expected: tuple[int, int],
                      size_bound: int) -> BatchHeader:
        """The header with the base offset its place holds; InvalidBatch when that is not
        its base offset and not only its base offset field is damaged."""
        if expected[0] <= header.base_offset <= expected[1]:
            return header
        exact = self.true_base_offset(position, header, expected, size_bound)
        if exact is None:
            raise InvalidBatch("corrupt", f"base offset {header.base_offset}, "
                                          f"expected {expected[0]}..{expected[1]}")
        return header._replace(base_offset=exact)

    def true_base_offset(self, position: int, header: BatchHeader, expected: tuple[int, int],
                         size_bound: int) -> int | None:
        """For a read: the base offset the batch at `position` has when only its base offset
        field is damaged (fixable_base_offset, the exact offset taken from `expected` or
        from what follows the batch), else None. Notes the place in misplaced_bases."""
        file = self.file
        after = position + header.size
        if after > size_bound:
            return None
        with mmap.mmap(file.fd, size_bound, access=mmap.ACCESS_READ) as buf:
            if expected[0] == expected[1]:
                exact = expected[0]
            elif after < size_bound:
                try:
                    exact = check_header(buf, after, None).base_offset - header.record_count
                except InvalidBatch:
                    return None
            elif after == file.size:
                exact = file.next_offset - header.record_count
            else:
                return None
            if not expected[0] <= exact <= expected[1] or \
                    fixable_base_offset(buf, position, size_bound, exact) is None:
                return None
        file.misplaced_bases.add(position)
        return exact

    # -- repairing the indexes at use -----------------------------------------------
    def _repair(self, generation: int, path: Path, reason: str) -> object:
        self.repair_indexes(f"{path}: {reason}", generation)
        return _REPAIRED

    def repair_indexes(self, reason: str, generation: int | None = None) -> None:
        """Rebuild both indexes from the batch headers because `reason` showed an entry wrong
        at use: swapped whole in memory, rewritten and fsynced on disk when writable. Batches
        past a damaged one keep their old entries that still check out. With `generation`
        (the one the finding was made in), nothing is done if another repair came first."""
        file = self.file
        with file.index_lock:
            if generation is not None and generation != file.index_generation:
                return
            logger.warning("%s: rebuilding the indexes of %s from the log", reason,
                           file.log_path)
            offsets, times = self._entries_from_headers()
            for index, entries in ((file.offset_index, offsets), (file.time_index, times)):
                was_open = index.is_open
                try:
                    index.replace_entries(entries)  # memory first: lookups are right from here
                    index.flush()
                except OSError as exc:  # the file stays wrong: checked again at use and open
                    logger.warning("%s: cannot rewrite the rebuilt index: %s", index.path, exc)
                finally:
                    if not was_open:
                        index.close()  # a sealed segment keeps one descriptor, its .log
            file.index_rebuilds += 1
            file.index_generation += 1

    def _entries_from_headers(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Index entries by the rule of SegmentFile.track, for the batches from byte 0 to the
        valid end (old entries kept past a batch that fails its header check)."""
        file = self.file
        offsets: list[tuple[int, int]] = []
        times: list[tuple[int, int]] = []
        offset_room = file.offset_index.max_entries - 1
        time_room = file.time_index.max_entries - 1
        since, max_ts, offset_of_max = 0, NO_TIMESTAMP, file.base_offset - 1
        size = min(file.size, os.fstat(file.fd).st_size)  # mmap refuses to map past the end
        position, expected = 0, file.base_offset
        with mmap.mmap(file.fd, size, access=mmap.ACCESS_READ) if size else _NoMap() as buf:
            while position < size:
                try:
                    header = check_header(buf, position, expected)
                except InvalidBatch:
                    break
                if position + header.size > size:
                    break
                if header.max_timestamp > max_ts:
                    max_ts, offset_of_max = header.max_timestamp, header.last_offset
                if since > file.index_interval_bytes and len(offsets) < offset_room \
                        and len(times) < time_room:
                    offsets.append((header.last_offset, position))
                    if max_ts > (times[-1][0] if times else NO_TIMESTAMP):
                        times.append((max_ts, offset_of_max))
                    since = 0
                since += header.size
                position += header.size
                expected = header.next_offset
        if position < size:
            offsets += self._old_offset_entries_past(position, offsets)
            times += [e for e in self._old_time_entries() if e[1] >= expected
                      and e[0] > (times[-1][0] if times else NO_TIMESTAMP)]
        elif max_ts > (times[-1][0] if times else NO_TIMESTAMP) and (
                file.sealed or len(times) < time_room):
            times.append((max_ts, offset_of_max))  # the final entry, as roll and recovery add
        return offsets, times

    def _old_offset_entries_past(self, position: int,
                                 kept: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Old offset index entries past `position` whose batch still checks out."""
        file = self.file
        out: list[tuple[int, int]] = []
        index = file.offset_index
        for i in range(len(index)):
            offset, at = index.entry(i)
            last = out[-1] if out else (kept[-1] if kept else (-1, -1))
            if at <= position or offset <= last[0] or at <= last[1]:
                continue
            try:
                if file.header_at(at, None).last_offset == offset:
                    out.append((offset, at))
            except InvalidBatch:
                continue
        return out

    def _old_time_entries(self) -> list[tuple[int, int]]:
        index = self.file.time_index
        return [index.entry(i) for i in range(len(index))]

"""Fetch: the batches of an offset range as a reader carries them away — Kafka's fetch
(`LogSegment.read` answering a `FetchDataInfo` whose records are a `FileRecords.slice`).

One answer holds whole batches of ONE segment: from the batch holding `start`, while
their base offset is below `end` (the caller bounds `end` by the last stable offset, a
batch boundary, so no batch runs past it), up to the segment's end or about `max_bytes`
(always at least one batch). The first batch may begin before `start` and the last end
after `end`; `next_offset` follows the last batch, and the caller asks again from there
for the rest (Kafka's consumer does the same).

The answer's records take one of two shapes:

    shape      when                                     what the bytes are
    ---------  ---------------------------------------  ---------------------------------
    FileSlice  the first batch is plain, as stored      bytes [position, position +
               (log without a sealer, base offset       length) of the segment's .log on
               field intact) and the file is still at   a descriptor of its own: zero-copy
               its path (retention did not move it)     for a server (sendfile)
    bytes      otherwise: an encrypted log, a batch     the batches opened one by one
               met with a repaired base offset, a       (record_batch.open_batch:
               file retention renamed meanwhile         unsealed, their own CRC)

A FileSlice ends before the first batch that is not plain as stored, and before a place
where a read skipped damage, so its bytes are batches back to back. Its batches' CRCs
are not checked here (their headers are): as Kafka's broker does, the bytes go out as
stored and the reader checks each CRC (Kafka's check.crcs; channel_engine/spark does). The
opened bytes were CRC-checked before opening (PartitionLog.read_batches).

Concurrency: as the log's reads (log_read.py): no lock, a snapshot of the segment list
and of each segment's size. A FileSlice owns its descriptor (opened anew, so its file
position is its own, and the log may close meanwhile): close it.

Failures: OffsetOutOfRangeError unless log start <= start < min(end, high watermark);
damage is skipped and counted as by the log's reads (take_new_losses), so an answer may
begin past `start` or be empty (next_offset == start) when damage covers the range:
the reader sees the gap; a batch that does not open raises CorruptRecordError naming
the file and byte, a wrong key DecryptionError.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from channel_engine.errors import CorruptRecordError, InvalidBatch, OffsetOutOfRangeError
from channel_engine.log import record_batch
from channel_engine.log.partition_log import PartitionLog
from channel_engine.log.segment import LogSegment

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

DEFAULT_FETCH_BYTES = 50 << 20  # Kafka's fetch.max.bytes default


class FileSlice(io.RawIOBase):
    """Bytes [start, end) of a segment's .log as a read-only binary file on a descriptor of
    its own (Kafka's FileRecords.slice): read() stops at `end`; positions (tell, seek) are
    the file's own, kept within the slice, and are those of fileno(), so a server can hand
    fileno() to sendfile() from its current position (gunicorn does). Close it."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        super().__init__()
        self._fd = fd
        self.start = start
        self.length = length
        self.end = start + length
        os.lseek(fd, start, os.SEEK_SET)

    def readable(self) -> bool:
        """True: a slice is read."""
        return True

    def seekable(self) -> bool:
        """True: within the slice."""
        return True

    def fileno(self) -> int:
        """The descriptor, positioned where the next read() begins."""
        if self.closed:
            raise ValueError("I/O operation on a closed FileSlice")
        return self._fd

    def tell(self) -> int:
        """The position in the file (start..end)."""
        return os.lseek(self.fileno(), 0, os.SEEK_CUR)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move within the slice; SEEK_END is the slice's end; a target outside the slice
        stops at its nearer edge. Returns the new position in the file."""
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.tell(), os.SEEK_END: self.end}[whence]
        return os.lseek(self.fileno(), min(max(base + offset, self.start), self.end),
                        os.SEEK_SET)

    def readinto(self, buffer: WriteableBuffer) -> int:
        """Read into `buffer`, never past the slice's end; 0 at the end."""
        left = self.end - self.tell()
        if left <= 0:
            return 0
        view = memoryview(buffer).cast("B")
        return os.readv(self._fd, [view[:left]])

    def close(self) -> None:
        """Close the descriptor."""
        if not self.closed:
            os.close(self._fd)
        super().close()


@dataclass(frozen=True)
class FetchData:
    """One fetch's answer (Kafka's FetchDataInfo): whole batches of one segment, and the
    offsets they cover — [start_offset, next_offset) and maybe a little before and after
    (see the module doc). Close it when done (a FileSlice holds a descriptor)."""

    start_offset: int  # the offset asked for
    next_offset: int  # the offset after the last batch: where the next fetch starts
    records: FileSlice | bytes

    @property
    def length(self) -> int:
        """Bytes of the batches."""
        return self.records.length if isinstance(self.records, FileSlice) else len(self.records)

    def close(self) -> None:
        """Release the slice's descriptor (nothing for bytes)."""
        if isinstance(self.records, FileSlice):
            self.records.close()

    def __enter__(self) -> FetchData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fetch(log: PartitionLog, start: int, end: int,
          max_bytes: int = DEFAULT_FETCH_BYTES) -> FetchData:
    """Whole batches of one segment from the one holding `start`, below `end` and the high
    watermark, about max_bytes (at least one batch): a FileSlice when stored bytes serve."""
    if end <= start:
        raise ValueError(f"fetch needs start < end, not [{start}, {end})")
    bound = min(end, log.high_watermark)
    if not log.log_start_offset <= start < bound:
        raise OffsetOutOfRangeError(start, log.log_start_offset, bound)
    if log.sealer is None:  # a sealer's log holds sealed batches: they must be opened
        found = _file_slice(log, start, bound, max_bytes)
        if found is not None:
            return found
    return _opened(log, start, bound, max_bytes)


def _file_slice(log: PartitionLog, start: int, bound: int, max_bytes: int) -> FetchData | None:
    """The FileSlice answer, or None when the first batch must be opened (or the file is no
    longer at its path)."""
    segment: LogSegment | None = None
    first = last = 0
    next_offset = start
    for at_segment, position, header in log.batch_headers(start):
        if header.base_offset >= bound:
            break
        as_stored = not (header.attributes & record_batch.ENCRYPTED_MASK
                         or position in at_segment.misplaced_bases)
        if segment is None:
            if not as_stored:
                return None
            segment, first = at_segment, position
        elif (at_segment is not segment or position != last or not as_stored
              or last + header.size - first > max_bytes):
            break  # another segment, a place damage was skipped, or a batch to open
        last = position + header.size
        next_offset = header.next_offset
    if segment is None:  # damage covers the rest of the range: nothing to serve
        return FetchData(start, start, b"")
    fd = _open_again(segment)
    if fd is None:
        return None
    return FetchData(start, next_offset, FileSlice(fd, first, last - first))


def _open_again(segment: LogSegment) -> int | None:
    """A descriptor of the segment's .log with a file position of its own, or None when the
    file at its path is no longer the one the segment holds (retention renamed it)."""
    try:
        fd = os.open(segment.log_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    found = os.fstat(fd)
    if (found.st_dev, found.st_ino) != segment.identity:
        os.close(fd)
        return None
    return fd


def _opened(log: PartitionLog, start: int, bound: int, max_bytes: int) -> FetchData:
    """The bytes answer: the CRC-checked batches of the first segment, each opened."""
    segment: LogSegment | None = None
    opened: list[bytes] = []
    next_offset = start
    for at_segment, header, data in log.read_batches(start, bound, max_bytes):
        if segment is not None and at_segment is not segment:
            break
        segment = at_segment
        try:
            opened.append(record_batch.open_batch(data, log.sealer))
        except InvalidBatch as exc:
            position = at_segment.find_position(header.base_offset, at_segment.size) or 0
            raise CorruptRecordError(at_segment.log_path, position, exc.reason) from exc
        next_offset = header.next_offset
    return FetchData(start, next_offset, b"".join(opened))

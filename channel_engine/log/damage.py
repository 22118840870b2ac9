"""Damage in a segment's bytes: telling it from a torn write, and where intact batches resume.

Pure functions over a buffer of `.log` bytes (an mmap of the file, or bytes): no
file, no state, no lock, so recovery (segment_recovery.py), reads that meet
damage (segment_reader.py) and the verify tool (tools/verify.py) apply the same
rules. The batch layout is record_batch.py's (the magic byte at MAGIC_AT = 16).

The resync rule (find_next_batch): the first byte position after the damage
holding a header with magic 2, a length that fits, a base offset above the offset
expected at the damage (the damaged region held at least one batch; this also
rejects a batch stored inside a record that names an offset already passed), a
CRC-32C that holds, and not contradicted by the batch after it (a valid batch
there must start at its next offset; this rejects a batch whose base offset field
is itself damaged when an intact batch follows).

Damage or a torn write (damaged_batches_end, is_torn): a complete batch none of
whose pieces between 512-byte sector boundaries is all zeros was written whole:
damage. Power loss loses whole sectors, so an unwritten part of a write reads as
zeros or lies past the end of the file: a torn write. A kill cuts a write short
only at a page boundary of the file (the kernel copies a write into the page
cache page by page, and a fatal signal stops it between pages), so a write a kill
cut short into preallocated zeros (Kafka's preallocate, fsync durability's zeros
ahead) is zeros from a 4096-aligned file offset to its end and beyond: an
all-zero piece between sector boundaries, torn by the same rule. A batch inside
which the non-zero bytes end without such a piece (a body that ends in zeros, and
a flipped byte elsewhere) was written whole: damage, its offsets lost.

A damaged base offset field alone (fixable_base_offset): the field lies outside
the CRC, so an intact batch where the expected batch belongs, not contradicted by
the batch after it, keeps its offsets.

Failures: none raised; every function answers None (or a position) when the bytes
do not qualify.
"""
from __future__ import annotations

import mmap
from pathlib import Path

from channel_engine.errors import InvalidBatch
from channel_engine.filenames import DAMAGED_SUFFIX
from channel_engine.log.record_batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    BytesLike,
    check_batch,
    check_crc,
    check_header,
    is_zero,
    read_header,
)

MAGIC_AT = 16  # byte of the magic in a batch header
MAGIC_BYTE = bytes([MAGIC])
SECTOR = 512  # the unit power loss tears writes at
TRAILING_ZEROS = 8  # zero bytes a batch may end with (empty headers, zero varints)
ZERO_SCAN_BYTES = 1 << 20  # copied out of the buffer at a time, looking back for non-zeros


def find_next_batch(buf: bytes | bytearray | mmap.mmap, start: int, limit: int,
                    expected: int) -> tuple[int, BatchHeader] | None:
    """(position, header) of the first intact batch at or after byte `start` and within
    `limit` whose base offset is > `expected` (the resync rule, above)."""
    search = start + MAGIC_AT
    while True:
        at = buf.find(MAGIC_BYTE, search, limit)
        position, search = at - MAGIC_AT, at + 1
        if at < 0 or position + HEADER_SIZE > limit:
            return None
        try:
            header = check_batch(buf, position, limit, None, verify_crc=True)
        except InvalidBatch:
            continue
        if header.base_offset > expected and not _contradicted(buf, position, header, limit):
            return position, header


def damaged_batches_end(buf: BytesLike, position: int, data_end: int,
                        expected: int) -> int | None:
    """One past the last offset of the batches from `position` (where offset `expected`
    belongs) that are complete in `buf` and not torn (is_torn), read from their headers
    without their CRC-32C; None when the first one is not such a batch. Its base offset
    field may itself be damaged: the place says `expected`. `data_end`: where the file's
    non-zero bytes end."""
    end = None
    limit = len(buf)
    while position + HEADER_SIZE <= min(limit, data_end):
        header = _header_or_whole_rest(buf, position, data_end)
        if header is None:
            break
        # a write a kill cut short into zeros is zero from a page boundary on: is_torn
        if position + header.size > limit or is_torn(buf, position, header.size) or (
                end is not None and header.base_offset != expected) or \
                header.record_count > header.batch_length:
            break
        end = expected + header.record_count
        position, expected = position + header.size, end
    return end


def _header_or_whole_rest(buf: BytesLike, position: int, data_end: int) -> BatchHeader | None:
    """The header at `position` if its fields are sound and it fits; else, when the batch
    length field alone is wrong (it lies outside the CRC-32C), the header of a batch that ends where
    the non-zero bytes do (or a few zero bytes later) if its CRC-32C holds; else None."""
    try:
        header = check_header(buf, position, None)
        if position + header.size <= len(buf):
            return header
    except InvalidBatch:
        header = read_header(buf, position)
    if header.magic != MAGIC or header.record_count < 1 or \
            header.last_offset_delta != header.record_count - 1:
        return None
    for end in range(data_end, min(len(buf), data_end + TRAILING_ZEROS) + 1):
        whole = header._replace(batch_length=end - position - LOG_OVERHEAD)
        try:
            check_crc(buf, position, whole)
        except InvalidBatch:
            continue
        return whole
    return None


def is_torn(buf: BytesLike, position: int, size: int) -> bool:
    """True if a piece of the batch at `position` between sector boundaries is all zeros:
    a write the kernel never made durable (power loss loses whole sectors) or a kill
    stopped at a page boundary, not damage."""
    start = position
    while start < position + size:
        end = min(position + size, (start // SECTOR + 1) * SECTOR)
        if is_zero(buf, start, end):
            return True
        start = end
    return False


def fixable_base_offset(buf: BytesLike, position: int, limit: int,
                        expected: int) -> int | None:
    """The base offset stored in the batch at `position` when only that field is wrong: the
    batch is intact (CRC-32C, which does not cover the field), it sits where the batch
    with base offset `expected` belongs, and no intact batch after it contradicts that.
    None otherwise."""
    try:
        header = check_batch(buf, position, limit, None, verify_crc=True)
    except InvalidBatch:
        return None
    if header.base_offset == expected:
        return None
    if _contradicted(buf, position, header._replace(base_offset=expected), limit):
        return None
    return header.base_offset


def _contradicted(buf: BytesLike, position: int, header: BatchHeader, limit: int) -> bool:
    """True when a valid batch follows this one but does not start at its next offset."""
    after = position + header.size
    if after >= limit:
        return False
    try:
        following = check_batch(buf, after, limit, None, verify_crc=True)
    except InvalidBatch:
        return False
    return following.base_offset != header.next_offset


def end_of_batches(buf: BytesLike, position: int, limit: int) -> int:
    """Where a zero tail starts after the valid batches from `position`, else `limit`
    (bytes after further damage are kept for the next repair)."""
    expected = None
    while position < limit:
        try:
            header = check_batch(buf, position, limit, expected, verify_crc=False)
        except InvalidBatch as exc:
            return position if exc.kind == "zero_tail" else limit
        position, expected = position + header.size, header.next_offset
    return limit


def data_end_of(buf: BytesLike, start: int, limit: int) -> int:
    """The end of the non-zero bytes in buf[start:limit] (a preallocated zero tail excluded)."""
    end = limit
    while end > start:
        chunk_start = max(start, end - ZERO_SCAN_BYTES)
        chunk = bytes(buf[chunk_start:end])
        stripped = chunk.rstrip(b"\0")
        if stripped:
            return chunk_start + len(stripped)
        end = chunk_start
    return start


def damaged_file(log_path: Path, position: int) -> Path:
    """Where the damaged bytes found at `position` of a .log are kept."""
    return log_path.with_name(f"{log_path.name}{DAMAGED_SUFFIX}-{position}")

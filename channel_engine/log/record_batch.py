"""Kafka record batch v2: the unit of atomicity in a segment's `.log` file.

Weir writes Kafka's own on-disk format, so Kafka's tools and client codecs read
Weir's segments. This module owns the batch header, the checks that decide whether
the bytes at a position are a valid batch, and the mapping of events onto records.

Codecs. The hot paths — build() without compression, a put's check of its events
(check_events) and the produce endpoint's commonest events (events_from_texts), and a
reader's records turned into Events (decode_events, LogReader._decode) — go through
`_batch_codec`, this package's C
extension (`_batch_codec.c`): it writes the very bytes aiokafka's builder writes and
reads records with aiokafka's checks, in a fraction of the time; its ColumnBuffers
(column_buffers()) reads plain batches' records straight into Arrow buffers for the Spark
source. Compressed batches, the other readers (records(), record_columns()) and every
case the extension declines (bad input, whose InvalidEventError the Python path words;
fields of a subclass of bytes, bytearray, memoryview, str or dict, which the Python path
reads as Python does) go through aiokafka's compiled codec. The extension is optional:
when it was not built (no C compiler at install) or WEIR_PURE_PYTHON_CODEC=1 was set when
this module was imported, aiokafka does all of it; CODEC says which ran (`python -m
channel_engine --version` prints it).

Batch layout (big-endian; Kafka DefaultRecordBatch, docs §5.3.1):

    offset  size  field
    ------  ----  -----------------------------------------------------------
         0     8  baseOffset            first offset in the batch
         8     4  batchLength           bytes after this field (total = +12)
        12     4  partitionLeaderEpoch  -1, outside the CRC. Weir has no
                                        leaders; it sets 0 (COMMITTED_EPOCH)
                                        in a transactional batch once its put
                                        committed, so the commit survives the
                                        loss of every checkpoint and journal
        16     1  magic                 2: the format version of the batch
        17     4  crc                   CRC-32C of bytes 21 .. end of batch
        21     2  attributes            bits 0-2 codec (0 none, 1 gzip,
                                        2 snappy, 3 lz4, 4 zstd); bit 3
                                        timestamp type (0 CreateTime); bit 4
                                        transactional (a multi-partition put);
                                        bit 7 (Weir's; unused by Kafka)
                                        encrypted: the records are a sealed
                                        unit (encryption.py), see seal();
                                        open_batch() gives it back as a plain
                                        batch (bit clear, records and length
                                        plain, CRC over them): how readers
                                        without the key get it
        23     4  lastOffsetDelta       recordCount - 1 (Weir never compacts)
        27     8  baseTimestamp         ms; timestamp of the first record
        35     8  maxTimestamp          ms; largest record timestamp
        43     8  producerId            -1, or the put transaction id (bit 4)
        51     2  producerEpoch         -1
        53     4  baseSequence          -1
        57     4  recordCount           >= 1
        61     -  records               varint records, compressed as one
                                        block when the codec bits say so

Record (zig-zag varints): length, attributes i8, timestampDelta, offsetDelta,
keyLength + key (-1 = null), valueLength + value, headerCount, then per header
keyLength + key (UTF-8), valueLength + value.

Event -> record: body -> value, key -> key, headers (str -> bytes) -> headers (a str
value is stored as its UTF-8 bytes, None as b"": event.header_value),
timestamp -> the record timestamp (CreateTime; "now" when the producer gave none).

A batch at a position is valid when: at least 12 bytes remain, batchLength >= 49,
the whole batch lies inside the file, magic is 2, the CRC matches (when
checked), recordCount >= 1, lastOffsetDelta == recordCount - 1 and baseOffset is
the offset expected next. The base offset is outside the CRC, so a batch is
built once and its base offset written in when the log assigns it.
"""
from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Iterator, Sequence
from operator import itemgetter
from types import ModuleType
from typing import Any, NamedTuple, Protocol, cast

import crc32c as _crc32c
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from channel_engine.errors import (
    BatchTooLargeError,
    ConfigError,
    EncryptedBatchError,
    InvalidBatch,
    InvalidEventError,
)
from channel_engine.event import Event, PendingEvent, header_value, make_event, view_problem

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes not counted in batchLength
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
MAGIC = 2
CRC_AT = 17  # where the CRC-32C is stored
CRC_START = 21  # where the bytes it covers begin
assert HEADER.size == HEADER_SIZE

COMPRESSION_CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CODEC_NAMES = {code: name for name, code in COMPRESSION_CODECS.items()}
CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10  # Kafka's isTransactional bit; producer_id holds Weir's txn id
ENCRYPTED_MASK = 0x80  # Weir's bit: the records section is a sealed unit
LEADER_EPOCH_AT = 12
COMMITTED_EPOCH = 0  # partitionLeaderEpoch of a transactional batch whose put committed
ATTRIBUTES_AT = 21
_LENGTH = struct.Struct(">qi")
_MAX_BATCH = 2**31 - 1
_MAX_TIMESTAMP = 2**63 - 1
_MAX_PRODUCER_ID = 2**63 - 1
_ZEROS = bytes(1 << 16)

BytesLike = bytes | bytearray | memoryview | mmap.mmap

PURE_PYTHON_VARIABLE = "WEIR_PURE_PYTHON_CODEC"


def _load_codec() -> tuple[ModuleType | None, str]:
    """The compiled codec (None when not built or turned off) and what CODEC says."""
    forced = os.environ.get(PURE_PYTHON_VARIABLE, "")
    if forced not in ("", "0", "1"):
        raise ConfigError(PURE_PYTHON_VARIABLE, f"must be 1 (the pure Python codec) or 0 (the "
                          f"compiled one when built), not {forced!r}")
    if forced == "1":
        return None, "python (compiled codec turned off)"
    try:
        from channel_engine.log import _batch_codec  # type: ignore[attr-defined]
    except ImportError:  # built without a C compiler: aiokafka's codec does it all
        return None, "python (compiled codec not built)"
    return _batch_codec, f"compiled (C, CRC-32C {_batch_codec.CRC32C_IMPLEMENTATION})"


_codec, CODEC = _load_codec()


class BatchHeader(NamedTuple):
    """The 61-byte header of a record batch, field for field."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on disk."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        """Offset of the last record in the batch."""
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """Offset that follows the batch."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def transaction_id(self) -> int | None:
        """Weir's put transaction id of a transactional batch, else None."""
        return self.producer_id if self.attributes & TRANSACTIONAL_MASK else None

    @property
    def marked_committed(self) -> bool:
        """A transactional batch whose put's commit was stamped into it (see the layout)."""
        return self.leader_epoch == COMMITTED_EPOCH

    @property
    def codec(self) -> str:
        """Compression codec name from the attributes."""
        return CODEC_NAMES.get(self.attributes & CODEC_MASK, "unknown")


def read_header(buf: BytesLike, position: int = 0) -> BatchHeader:
    """Unpack the batch header at `position` without checking it."""
    return BatchHeader._make(HEADER.unpack_from(buf, position))


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    """CRC-32C over a whole batch's checksummed part (attributes to the end)."""
    return int(_crc32c.crc32c(memoryview(batch)[CRC_START:]))


def is_zero(buf: BytesLike, start: int, end: int) -> bool:
    """True if buf[start:end] is all zero bytes (a preallocated or never-written tail)."""
    view = memoryview(buf)
    for chunk_start in range(start, end, len(_ZEROS)):
        chunk = view[chunk_start:min(end, chunk_start + len(_ZEROS))]
        if chunk != _ZEROS[: len(chunk)]:
            return False
    return True


def check_header(
    buf: BytesLike, position: int, expected_base: int | None
) -> BatchHeader:
    """Return the header at `position` if its fields are sound, else raise InvalidBatch.

    Only the 61 header bytes are needed: the caller checks that the whole batch is there."""
    remaining = len(buf) - position
    if remaining < HEADER_SIZE:
        raise InvalidBatch("partial", f"{remaining} bytes, too few for a batch header")
    header = read_header(buf, position)
    if header.batch_length < MIN_BATCH_LENGTH:
        raise InvalidBatch("corrupt", f"batch length {header.batch_length} < {MIN_BATCH_LENGTH}")
    if header.magic != MAGIC:
        raise InvalidBatch("corrupt", f"magic {header.magic}, expected {MAGIC}")
    if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
        raise InvalidBatch(
            "corrupt",
            f"record count {header.record_count} with last offset delta "
            f"{header.last_offset_delta}",
        )
    if expected_base is not None and header.base_offset != expected_base:
        raise InvalidBatch(
            "corrupt", f"base offset {header.base_offset}, expected {expected_base}"
        )
    return header


def check_crc(buf: BytesLike, position: int, header: BatchHeader) -> None:
    """Raise InvalidBatch if the batch at `position` fails its CRC-32C."""
    end = position + header.size
    actual = int(_crc32c.crc32c(memoryview(buf)[position + CRC_START:end]))
    if actual != header.crc:
        raise InvalidBatch("corrupt", f"CRC-32C {actual:#010x} != stored {header.crc:#010x}")


def check_batch(
    buf: BytesLike,
    position: int,
    limit: int,
    expected_base: int | None,
    verify_crc: bool,
) -> BatchHeader:
    """Return the header of the valid batch in buf[position:limit], else raise InvalidBatch.

    kind 'zero_tail': only zero bytes remain (a preallocated or never-written tail);
    'partial': the batch runs past `limit` (a torn write); 'corrupt': anything else."""
    remaining = limit - position
    maybe_zeros = remaining < LOG_OVERHEAD or _LENGTH.unpack_from(buf, position) == (0, 0)
    if maybe_zeros and is_zero(buf, position, limit):
        raise InvalidBatch("zero_tail", f"{remaining} zero bytes at the end")
    if remaining < HEADER_SIZE:
        raise InvalidBatch("partial", f"{remaining} bytes, too few for a batch header")
    header = check_header(buf, position, expected_base)
    if header.size > remaining:
        raise InvalidBatch("partial", f"batch of {header.size} bytes cut after {remaining}")
    if verify_crc:
        check_crc(buf, position, header)
    return header


_FIELD = [itemgetter(i) for i in range(4)]
_NONE = type(None)
_PLAIN_TYPES: tuple[set[type], ...] = ({PendingEvent}, {bytes}, {_NONE, bytes}, {_NONE}, {_NONE})


def check_events(first_index: int, events: Sequence[object]) -> list[PendingEvent]:
    """make_event for many events (numbered from first_index); InvalidEventError on the
    first bad one. PendingEvents with bytes bodies, key None or bytes, and no headers or
    timestamp are taken as they are: the compiled codec tells in one pass (plain_events),
    else type sets built in C do; the rest are checked one by one. What is checked is a
    copy of `events`, and the copy is what is returned: a caller's list changed by another
    thread meanwhile cannot slip an unchecked event in."""
    events = list(events)
    if _codec is not None:
        if _codec.plain_events(events):
            return events  # type: ignore[return-value]
    else:
        columns = [set(map(type, events))]
        if columns[0] <= _PLAIN_TYPES[0] and set(map(len, events)) <= {4}:  # type: ignore[arg-type]
            columns += [set(map(type, map(_FIELD[i], events))) for i in range(4)]  # type: ignore[arg-type]
            if all(c <= plain for c, plain in zip(columns, _PLAIN_TYPES, strict=True)):
                return events  # type: ignore[return-value]
    return [make_event(first_index + i, *event)  # type: ignore[misc]
            for i, event in enumerate(events)]


def events_from_texts(objects: object) -> list[PendingEvent] | None:
    """PendingEvent(text.encode()) for each object of a list that is exactly {"body": text}
    (a dict and a str, not subclasses): the commonest event of a JSON produce request.
    None when any object is another shape, or without the compiled codec: the caller then
    reads the objects one by one (and words any error)."""
    return None if _codec is None else cast("list[PendingEvent] | None",
                                            _codec.events_from_texts(objects))


def build(events: Sequence[PendingEvent], compression: int = 0,
          transaction_id: int | None = None) -> bytearray:
    """Encode events as one batch with base offset 0; raise InvalidEventError on bad input
    (BatchTooLargeError when the records pass the 2 GiB a batch can hold, none dropped).
    With a transaction_id the batch is transactional (Kafka's attribute bit 4, the id in
    producerId): it counts only once its transaction's commit is journalled."""
    if not events:
        raise InvalidEventError(0, "events", "a batch needs at least one event")
    if transaction_id is not None and (type(transaction_id) is not int
                                       or not 0 <= transaction_id <= _MAX_PRODUCER_ID):
        # producerId is an int64 and Kafka's are never negative; a bad one is a caller's bug
        raise InvalidEventError(0, "transaction_id",
                                f"must be an int in [0, 2**63), not {transaction_id!r}")
    now = int(time.time() * 1000)
    if compression == 0 and _codec is not None:
        batch = _codec.encode(events, transaction_id, now)
        if batch is not None:
            return cast(bytearray, batch)
    # compressed, no compiled codec, or input it declines (the errors are worded here)
    return build_python(events, compression, transaction_id, now)


def build_python(events: Sequence[PendingEvent], compression: int,
                 transaction_id: int | None, now: int) -> bytearray:
    """build() by aiokafka's builder, with `now` for the events without a timestamp."""
    if transaction_id is None:
        builder = DefaultRecordBatchBuilder(MAGIC, compression, 0, -1, -1, -1, _MAX_BATCH)
    else:
        builder = DefaultRecordBatchBuilder(MAGIC, compression, 1, transaction_id, 0, -1,
                                            _MAX_BATCH)
    append = builder.append
    index = 0
    try:
        for index, event in enumerate(events):
            body, key, headers, timestamp = event
            if body is None:
                raise InvalidEventError(index, "body", "must be bytes, not None")
            if timestamp is None:
                timestamp = now
            elif type(timestamp) is not int or not 0 <= timestamp <= _MAX_TIMESTAMP:
                raise InvalidEventError(
                    index, "timestamp", f"must be milliseconds in [0, 2**63), not {timestamp!r}"
                )
            record = _header_list(index, headers) if headers else []
            if append(index, timestamp, key, body, record) is None:  # past _MAX_BATCH
                # the highest max_batch_bytes allowed: the put path's error for a big batch
                size = builder.size() + builder.size_in_bytes(index, timestamp, key, body, record)
                raise BatchTooLargeError(size, _MAX_BATCH, "max_batch_bytes")
    except (TypeError, ValueError, AttributeError, OverflowError, BufferError) as exc:
        if isinstance(exc, InvalidEventError | BatchTooLargeError):  # ValueErrors, worded
            raise
        raise _explain(index, events[index], exc) from exc
    return cast(bytearray, builder.build())


def _header_list(index: int, headers: object) -> list[tuple[str, bytes]]:
    items = list(headers.items())  # type: ignore[attr-defined]
    for position, (name, value) in enumerate(items):
        if type(value) is not bytes:  # str -> UTF-8, None -> b"" (event.header_value)
            items[position] = (name, header_value(index, name, value))
    return items


def _explain(index: int, event: object, exc: Exception) -> InvalidEventError:
    fields = getattr(event, "_fields", None)
    if fields != PendingEvent._fields:
        return InvalidEventError(index, "event", f"must be a PendingEvent, not {event!r}")
    body, key, headers, _ = cast(PendingEvent, event)
    if not isinstance(body, bytes | bytearray | memoryview):
        return InvalidEventError(index, "body", f"must be bytes, not {type(body).__name__}")
    if key is not None and not isinstance(key, bytes | bytearray | memoryview):
        return InvalidEventError(index, "key", f"must be bytes or None, not {type(key).__name__}")
    for field, value in (("body", body), ("key", key)):
        problem = view_problem(value)
        if problem is not None:
            return InvalidEventError(index, field, problem)
    if headers is not None and not hasattr(headers, "items"):
        return InvalidEventError(index, "headers", "must be a mapping of str to bytes")
    return InvalidEventError(index, "headers", f"must map str to bytes ({exc})")


class Sealer(Protocol):
    """Encrypts and authenticates a batch's records (encryption.BatchSealer)."""

    def seal(self, records: bytes, header_fields: bytes) -> bytes: ...
    def open(self, unit: bytes, header_fields: bytes) -> bytes: ...


def seal(batch: bytearray, sealer: Sealer) -> bytearray:
    """Encrypt a built batch's records in place of them: set the encrypted bit, fix the
    length and CRC. The header bytes from attributes to recordCount are bound to the sealed
    unit as associated data; the base offset is not (the log assigns it later; the loader
    checks that offsets follow each other)."""
    attributes = read_header(batch).attributes | ENCRYPTED_MASK
    struct.pack_into(">h", batch, ATTRIBUTES_AT, attributes)
    unit = sealer.seal(bytes(batch[HEADER_SIZE:]), bytes(batch[ATTRIBUTES_AT:HEADER_SIZE]))
    sealed = bytearray(batch[:HEADER_SIZE]) + unit
    struct.pack_into(">i", sealed, 8, len(sealed) - LOG_OVERHEAD)
    struct.pack_into(">I", sealed, CRC_AT, compute_crc(sealed))
    return sealed


def unseal(batch: bytes, sealer: Sealer | None) -> bytes:
    """The batch with its records decrypted, if it is encrypted; raise DecryptionError on a
    wrong key or damage, EncryptedBatchError when there is no sealer."""
    if len(batch) < HEADER_SIZE:
        raise InvalidBatch("partial", f"{len(batch)} bytes, too few for a batch header")
    header = read_header(batch)
    if not header.attributes & ENCRYPTED_MASK:
        return batch
    if sealer is None:
        raise EncryptedBatchError(f"batch at offset {header.base_offset} is encrypted: open "
                                  "the channel with its encryption_key_file to read it")
    records = sealer.open(batch[HEADER_SIZE:], batch[ATTRIBUTES_AT:HEADER_SIZE])
    plain = bytearray(batch[:HEADER_SIZE]) + records
    struct.pack_into(">i", plain, 8, len(plain) - LOG_OVERHEAD)
    struct.pack_into(">h", plain, ATTRIBUTES_AT, header.attributes & ~ENCRYPTED_MASK)
    return bytes(plain)  # the CRC is not fixed: it was checked on the sealed bytes


def open_batch(batch: bytes, sealer: Sealer | None) -> bytes:
    """The batch as it travels to a reader: unsealed (unseal) and, if it was sealed, with
    the CRC of its plain bytes, so it is a valid batch of its own; a plain batch as it is."""
    plain = unseal(batch, sealer)
    if plain is batch:
        return batch
    opened = bytearray(plain)
    struct.pack_into(">I", opened, CRC_AT, compute_crc(opened))
    return bytes(opened)


def set_base_offset(batch: bytearray, base_offset: int) -> None:
    """Write the base offset into a built batch (it lies outside the CRC)."""
    struct.pack_into(">q", batch, 0, base_offset)


Record = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def _plain_batch(batch: bytes) -> DefaultRecordBatch:
    if len(batch) < HEADER_SIZE:
        raise InvalidBatch("partial", f"{len(batch)} bytes, too few for a batch header")
    if read_header(batch).attributes & ENCRYPTED_MASK:
        raise EncryptedBatchError("batch is encrypted: unseal it with the channel's key ring")
    return DefaultRecordBatch(batch)


def undecodable(exc: Exception) -> InvalidBatch:
    """The InvalidBatch for an exception the codec raised while decoding records."""
    # The codec is third-party: behind a valid CRC a damaged records section raises
    # CorruptRecordException, a decompressor's own error (zlib.error, EOFError,
    # cramjam.DecompressionError, ...), UnicodeDecodeError (a header key) or struct.error.
    return InvalidBatch("corrupt", f"records do not decode: {type(exc).__name__}: {exc}")


def decode_events(batch: bytes, partition: int, start: int, stop: int, limit: int,
                  out: list[Event]) -> bool:
    """Append to `out` the Events (partition, offset, timestamp, key, headers, value or b"")
    of a plain batch's records with start <= offset < stop, until `out` holds `limit`, by
    the compiled codec; False when that is not its to do (no compiled codec, a compressed
    batch): the caller iterates record_objects(). Raises what record_objects() would, for
    the caller to turn into undecodable(exc)."""
    return _codec is not None and bool(_codec.decode(batch, partition, start, stop, limit, out))


def record_objects(batch: bytes) -> Iterator[Any]:
    """The codec's record objects (.offset, .timestamp, .key, .value, .headers) of a valid
    plain batch, for a hot loop that reads them in place; the caller turns any exception
    while iterating into undecodable(exc), as records() does."""
    return iter(_plain_batch(batch))


def records(batch: bytes) -> Iterator[Record]:
    """Yield (offset, timestamp, key, value, headers) of each record of a valid batch
    (an encrypted one must go through unseal() first); InvalidBatch if they do not decode."""
    try:
        for record in _plain_batch(batch):
            yield record.offset, record.timestamp, record.key, record.value, record.headers
    except (InvalidBatch, EncryptedBatchError):
        raise
    except Exception as exc:
        raise undecodable(exc) from exc


Headers = list[tuple[str, bytes | None]]
RecordColumns = tuple[list[int], list[int], list[bytes | None], list[bytes | None],
                      list[Headers]]


def record_columns(batch: bytes) -> RecordColumns:
    """records() column by column: (offsets, timestamps, keys, values, headers) lists of a
    valid batch, for bulk readers (the Spark source) that would otherwise build a tuple per
    record. The same checks and errors as records()."""
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[Headers] = []
    add_offset, add_timestamp, add_key = offsets.append, timestamps.append, keys.append
    add_value, add_headers = values.append, headers.append
    try:
        for record in _plain_batch(batch):
            add_offset(record.offset)
            add_timestamp(record.timestamp)
            add_key(record.key)
            add_value(record.value)
            add_headers(record.headers)
    except (InvalidBatch, EncryptedBatchError):
        raise
    except Exception as exc:
        raise undecodable(exc) from exc
    return offsets, timestamps, keys, values, headers


def column_buffers(readable: bool = False) -> Any | None:
    """A compiled ColumnBuffers (plain batches' records read straight into Arrow buffers,
    _batch_codec.c; readable: telling text from bytes too), or None when the compiled codec
    is not in use: record_columns() then."""
    return None if _codec is None else _codec.ColumnBuffers(readable)

"""EventColumns: record batches decoded column by column into the "weir" source's Arrow
RecordBatches, with no Python object per event.

Why: the source first built an Event per record (PartitionLog.read) and then transposed
the events into columns: 2.5-5 µs of Python per event on the benchmark machine, in a
worker that shares the CPUs with Spark's JVM. Taking record_batch.record_columns() lists
(aiokafka's compiled decoder fills them) straight into Arrow arrays cost about 1 µs; the
compiled codec's ColumnBuffers (_batch_codec.c) goes further: it reads a plain batch's
records straight into the Arrow buffers below, one Python call per record batch, and
pa.Array.from_buffers takes those buffers without a copy.

Two ways in, one result (the tests hold them to equal tables): plain batches go through
ColumnBuffers when the compiled codec is in use (record_batch.column_buffers());
compressed batches, and every batch when the codec is not built or WEIR_PURE_PYTHON_CODEC=1,
through record_columns() lists. A split may mix both: each run of one kind becomes a
RecordBatch of its own, and to_batch() concatenates them in offset order. Both check every
record's offset: offsets that do not increase from one record to the next are damage
(InvalidBatch, worded alike), a run that skips one is an OffsetGap.

The Arrow layout handed to Spark. Spark checks the first batch's schema against
to_arrow_schema(SCHEMA, timezone="UTC") and refuses any difference, so each column is built
with exactly that type:

    column     Arrow type               built from
    ---------  -----------------------  --------------------------------------------------
    channel    string                   the split's channel, repeated
    partition  int32                    the split's partition, repeated
    offset     int64                    record offsets
    timestamp  int64                    record timestamps (ms, CreateTime), not an Arrow
                                        timestamp type: the SQL type is long
    key        binary                   record keys; null where the record has none
                                        (validity bitmap, int32 offsets, data)
    headers    map<string, binary>      int32 entry offsets (n + 1 of them) over
                                        flattened names and values: record i's entries
                                        are [ends[i], ends[i + 1]). A record's headers
                                        go through dict() first, as PartitionLog.read
                                        does: a repeated name keeps its first place and
                                        its last value. A null header value stays null
    body       binary                   record values; a null value reads as b"", as
                                        PartitionLog.read gives it

The source's "readable" columns (source.py's READABLE_SCHEMA, what the export writes in
schema version 2, file_formats.py) split each key, header value and body in two by
whether it is well-formed UTF-8 (Unicode's Table 3-7, as Python's strict decoder and
Spark's is_valid_utf8 judge it): text in a string column, else the raw bytes in a binary
`*_bytes` one, the other null; so each value is in exactly one. The compiled codec sets a
text and a raw bit for each value as it reads it; the column of the kind a run of records
holds is a view of the data buffer, and the other one, when some values are of that kind,
a copy of just those (so Spark is never sent the same bytes twice). Built the same way as
above but:

    column         Arrow type               built from
    -------------  -----------------------  ----------------------------------------------
    key            string                   keys that are UTF-8; null otherwise
    key_bytes      binary                   keys that are not; null otherwise (and no key)
    headers        map<string, string>      each record's header entries whose value is
                                            UTF-8 or null
    headers_bytes  map<string, binary>      the other entries; null when a record has none
    body           string                   bodies that are UTF-8 (a null value: "")
    body_bytes     binary                   bodies that are not

Doing this here rather than in Spark SQL (file_formats.readable's CASE WHEN
is_valid_utf8(CAST(...))) saves the export about 1.7 µs of CPU per event on the
benchmark machine (bench/README.md): Spark's check and casts cost more than reading the
record.

Size: an Arrow binary column's int32 offsets address at most 2 GiB - 1 of data, so a
RecordBatch is cut before a record batch would take any column past that (ready() hands
the cut ones over); a record batch's bytes bound what its records add to each column.

Not thread-safe: one per split, in the worker that reads it.
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate, pairwise
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from aiokafka.errors import CorruptRecordException

from channel_engine.errors import OffsetGap
from channel_engine.event import utf8_text
from channel_engine.log import record_batch
from channel_engine.log.record_batch import (
    ATTRIBUTES_AT,
    CODEC_MASK,
    ENCRYPTED_MASK,
    HEADER_SIZE,
    Headers,
)

MAX_COLUMN_BYTES = 2**31 - 1  # int32 offsets: the data an Arrow binary column can hold
_PLAIN_AT = ATTRIBUTES_AT + 1  # the attributes' low byte: codec and encrypted bits
_NOT_PLAIN = CODEC_MASK | ENCRYPTED_MASK


class EventColumns:
    """Records of one channel partition gathered until to_batch() turns them into one
    RecordBatch of `schema` (see the module doc)."""

    def __init__(self, channel: str, partition: int, schema: Any,
                 readable: bool = False) -> None:
        self.channel = channel
        self.partition = partition
        self.schema = schema
        self.readable = readable  # schema is READABLE_SCHEMA's (module doc)
        # None: the codec is not in use
        self._buffers = record_batch.column_buffers(readable)
        self._lists = _RecordLists()
        self._parts: list[Any] = []  # finished runs of one kind, in offset order
        self._part_rows = 0
        self._bytes = 0  # at least the data bytes any column holds now
        self._ready: list[Any] = []

    def __len__(self) -> int:
        held = len(self._buffers) if self._buffers is not None else 0
        return self._part_rows + len(self._lists) + held

    def add(self, batch: bytes, expected: int, stop: int) -> int:
        """Add the records of a valid, plain or compressed (not sealed) batch with
        expected <= offset < stop and return how many; they must be expected, expected + 1,
        ...: OffsetGap otherwise. InvalidBatch when its records do not decode (as
        record_columns() says) or their offsets do not increase record by record, adding
        none of them."""
        if self._buffers is not None and len(batch) >= HEADER_SIZE \
                and not batch[_PLAIN_AT] & _NOT_PLAIN:
            self._make_room(len(batch))
            self._finish_lists()
            try:
                appended = self._buffers.append(batch, expected, stop)
            except (CorruptRecordException, UnicodeDecodeError) as exc:
                raise record_batch.undecodable(exc) from exc
            if appended is not None:  # None: declined, record_columns() words why
                return self._appended(batch, expected, *appended)
        return self._add_lists(batch, expected, stop)

    def ready(self) -> list[Any]:
        """The RecordBatches cut at the 2 GiB a column holds since the last call."""
        ready, self._ready = self._ready, []
        return ready

    def to_batch(self) -> Any:
        """The gathered records as one RecordBatch; starts gathering afresh."""
        self._finish_lists()
        self._finish_buffers()
        parts, self._parts, self._part_rows, self._bytes = self._parts, [], 0, 0
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return pa.RecordBatch.from_pylist([], schema=self.schema)
        return pa.concat_batches(parts)

    def _appended(self, batch: bytes, expected: int, added: int, gap: int | None) -> int:
        """What ColumnBuffers.append() added, counted for the 2 GiB cut."""
        if added:
            self._bytes += len(batch)
        if gap is not None:
            raise OffsetGap(gap, expected + added)
        return int(added)

    def _add_lists(self, batch: bytes, expected: int, stop: int) -> int:
        offsets, timestamps, keys, values, headers = record_batch.record_columns(batch)
        _check_order(offsets)
        low, high = bisect_left(offsets, expected), bisect_left(offsets, stop)
        if low == high:
            return 0
        # increasing offsets: the first and last in range being right makes the run whole
        if offsets[low] != expected or offsets[high - 1] != expected + high - low - 1:
            got, due = next(((o, expected + i) for i, o in enumerate(offsets[low:high])
                             if o != expected + i), (offsets[high - 1], expected + high - low - 1))
            raise OffsetGap(got, due)
        # a compressed batch's records take more room than its bytes
        size = len(batch) if not batch[_PLAIN_AT] & _NOT_PLAIN \
            else _decoded_size(keys[low:high], values[low:high], headers[low:high])
        self._make_room(size)
        self._finish_buffers()
        if high - low == len(offsets):
            self._lists.extend(offsets, timestamps, keys, values, headers)
        else:
            self._lists.extend(offsets[low:high], timestamps[low:high], keys[low:high],
                               values[low:high], headers[low:high])
        self._bytes += size
        return high - low

    def _make_room(self, size: int) -> None:
        """Cut the gathered records into a ready RecordBatch if `size` more data bytes could
        take a column past what it can hold."""
        if self._bytes + size > MAX_COLUMN_BYTES and len(self):
            self._ready.append(self.to_batch())

    def _finish_lists(self) -> None:
        if len(self._lists):
            self._add_part(self._lists.to_batch(self))

    def _finish_buffers(self) -> None:
        if self._buffers is not None and len(self._buffers):
            self._add_part(_buffers_batch(self, self._buffers.take()))

    def _add_part(self, batch: Any) -> None:
        self._parts.append(batch)
        self._part_rows += batch.num_rows


def _check_order(offsets: list[int]) -> None:
    """InvalidBatch unless a batch's record offsets increase from one record to the next,
    worded as ColumnBuffers words it (_batch_codec.c columns_records)."""
    for previous, offset in pairwise(offsets):
        if offset <= previous:
            raise record_batch.undecodable(CorruptRecordException(
                f"Record offset {offset} after {previous}: offsets must increase"))


def _decoded_size(keys: list[bytes | None], values: list[bytes | None],
                  headers: list[Headers]) -> int:
    """The most data bytes these records add to any one column."""
    names = sum(len(name.encode()) for record in headers if record for name, _ in record)
    header_values = sum(len(value) for record in headers if record for _, value in record
                        if value)
    return max(sum(map(len, filter(None, keys))), sum(map(len, filter(None, values))),
               names, header_values)


def _column(arrow_type: Any, length: int, nulls: int, *buffers: Any) -> Any:
    """An Arrow array over the compiled codec's buffers, without a copy; the validity
    bitmap (the first buffer) only where there are nulls."""
    validity, *rest = buffers
    return pa.Array.from_buffers(arrow_type, length,
                                 [pa.py_buffer(validity) if nulls else None,
                                  *(pa.py_buffer(b) for b in rest)], null_count=nulls)


def _buffers_batch(columns: EventColumns, taken: tuple[Any, ...]) -> Any:
    """The RecordBatch of ColumnBuffers.take()'s buffers (_batch_codec.c's order)."""
    (rows, key_nulls, entries, value_nulls, key_raws, body_raws, hvalue_raws, offsets,
     timestamps, key_valid, key_ends, key_data, body_ends, body_data, header_ends, name_ends,
     name_data, hvalue_valid, hvalue_ends, hvalue_data, key_text, key_raw, body_text, body_raw,
     hvalue_raw) = taken
    ends = _column(pa.int32(), rows + 1, 0, None, header_ends)
    names = _column(pa.string(), entries, 0, None, name_ends, name_data)
    fixed = [pa.repeat(pa.scalar(columns.channel, pa.string()), rows),
             pa.repeat(pa.scalar(columns.partition, pa.int32()), rows),
             _column(pa.int64(), rows, 0, None, offsets),
             _column(pa.int64(), rows, 0, None, timestamps)]
    if columns.readable:
        headers = _split_maps(
            ends, names, _column(pa.binary(), entries, value_nulls, hvalue_valid, hvalue_ends,
                                 hvalue_data),
            hvalue_raws, _column(pa.bool_(), entries, 0, None, hvalue_raw))
        batch = pa.RecordBatch.from_arrays([
            *fixed,
            *_text_and_raw(rows, key_nulls + key_raws, key_text, rows - key_raws, key_raw,
                           key_ends, key_data),
            *headers,
            *_text_and_raw(rows, body_raws, body_text, rows - body_raws, body_raw, body_ends,
                           body_data),
        ], schema=columns.schema)
    else:
        headers = pa.MapArray.from_arrays(
            ends, names,
            _column(pa.binary(), entries, value_nulls, hvalue_valid, hvalue_ends, hvalue_data))
        batch = pa.RecordBatch.from_arrays([
            *fixed,
            _column(pa.binary(), rows, key_nulls, key_valid, key_ends, key_data),
            headers,
            _column(pa.binary(), rows, 0, None, body_ends, body_data),
        ], schema=columns.schema)
    # from_buffers trusts the sizes it is given: a buffer shorter than its rows is an
    # error here rather than a read past its end in Spark
    batch.validate()
    return batch


def _text_and_raw(rows: int, text_nulls: int, text: Any, raw_nulls: int, raw: Any,
                  ends: Any, data: Any) -> tuple[Any, Any]:
    """The string and binary columns of one value (`text` and `raw` its bitmaps), each
    holding only its own values' bytes: a column of nulls where it has none, a view of the
    data for the text ones, a copy of just the raw ones when both kinds are there."""
    if raw_nulls == rows:  # all text (or null): the common case
        return (_column(pa.string(), rows, text_nulls, text, ends, data),
                pa.nulls(rows, pa.binary()))
    raws = _column(pa.binary(), rows, raw_nulls, raw, ends, data)
    if text_nulls == rows:  # no text at all (a channel of images, of protobufs)
        return pa.nulls(rows, pa.string()), raws
    # take() copies just the bytes of the values it keeps (if_else, concat do not)
    return (_column(pa.string(), rows, text_nulls, text, ends, data),
            pc.take(raws, pa.array(range(rows), pa.int32())))


def _split_maps(ends: Any, names: Any, values: Any, raws: int, raw: Any) -> tuple[Any, Any]:
    """The headers and headers_bytes columns of header entries (`ends` per record over
    `names` and binary `values`), `raw` marking the `raws` entries whose value is not
    UTF-8 (module doc)."""
    rows = len(ends) - 1
    if not raws:  # the common case: every value is text (or null); no record has raw ones
        return (pa.MapArray.from_arrays(ends, names, values.view(pa.string())),
                pa.nulls(rows, pa.map_(pa.string(), pa.binary())))
    text = pc.invert(raw)
    text_ends, raw_ends = _kept_ends(ends, text), _kept_ends(ends, raw)
    has_raw = pc.greater(pc.subtract(raw_ends[1:], raw_ends[:-1]), 0)
    return (pa.MapArray.from_arrays(text_ends, pc.filter(names, text),
                                    pc.filter(values, text).view(pa.string())),
            pa.MapArray.from_arrays(raw_ends, pc.filter(names, raw), pc.filter(values, raw),
                                    mask=pc.invert(has_raw)))


def _kept_ends(ends: Any, kept: Any) -> Any:
    """Each record's entry ends once only the `kept` entries are left."""
    before = pc.cumulative_sum(pc.cast(kept, pa.int32()))
    return pc.take(pa.concat_arrays([pa.array([0], pa.int32()), before]), ends)


class _RecordLists:
    """record_columns() lists gathered, for the batches ColumnBuffers does not read."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[Headers] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def extend(self, offsets: list[int], timestamps: list[int], keys: list[bytes | None],
               values: list[bytes | None], headers: list[Headers]) -> None:
        """Add records given column by column (equal lengths, in offset order)."""
        self.offsets += offsets
        self.timestamps += timestamps
        self.keys += keys
        self.values += values
        self.headers += headers

    def to_batch(self, columns: EventColumns) -> Any:
        """The gathered records as one RecordBatch of columns' schema; starts afresh."""
        count = len(self.offsets)
        fixed = [pa.repeat(pa.scalar(columns.channel, pa.string()), count),
                 pa.repeat(pa.scalar(columns.partition, pa.int32()), count),
                 pa.array(self.offsets, pa.int64()),
                 pa.array(self.timestamps, pa.int64())]
        if columns.readable:
            batch = pa.RecordBatch.from_arrays(
                [*fixed, *_readable_columns(self.keys, self.values, self.headers)],
                schema=columns.schema)
        else:
            bodies = pa.array(self.values, pa.binary())
            if bodies.null_count:
                bodies = bodies.fill_null(b"")
            batch = pa.RecordBatch.from_arrays([
                *fixed, pa.array(self.keys, pa.binary()), _header_maps(self.headers), bodies,
            ], schema=columns.schema)
        self._clear()
        return batch


def _readable_columns(keys: list[bytes | None], values: list[bytes | None],
                      headers: list[Headers]) -> list[Any]:
    """key, key_bytes, headers, headers_bytes, body, body_bytes of records given column by
    column (the module doc's readable layout), in Python."""
    key_texts = [utf8_text(key) for key in keys]
    bodies = [b"" if value is None else value for value in values]
    body_texts = [utf8_text(body) for body in bodies]
    text_maps, raw_maps = [], []
    for record in headers:
        entries = dict(record) if record else {}
        texts = {name: utf8_text(value) for name, value in entries.items()}
        raw = [(name, value) for name, value in entries.items()
               if value is not None and texts[name] is None]
        text_maps.append([(name, texts[name]) for name, value in entries.items()
                          if value is None or texts[name] is not None])
        raw_maps.append(raw or None)
    raw_keys = [key if text is None else None for key, text in zip(keys, key_texts, strict=True)]
    raw_bodies = [body if text is None else None
                  for body, text in zip(bodies, body_texts, strict=True)]
    return [pa.array(key_texts, pa.string()), pa.array(raw_keys, pa.binary()),
            pa.array(text_maps, pa.map_(pa.string(), pa.string())),
            pa.array(raw_maps, pa.map_(pa.string(), pa.binary())),
            pa.array(body_texts, pa.string()), pa.array(raw_bodies, pa.binary())]


def _header_maps(headers: list[Headers]) -> Any:
    """One map<string, binary> entry per record (see the module doc)."""
    if not any(headers):  # the common case: no record has headers, every map is empty
        ends = pa.repeat(pa.scalar(0, pa.int32()), len(headers) + 1)
        return pa.MapArray.from_arrays(ends, pa.array([], pa.string()), pa.array([], pa.binary()))
    maps = [dict(h) if h else {} for h in headers]
    names = [name for m in maps for name in m]
    values = [value for m in maps for value in m.values()]
    ends = pa.array(list(accumulate(map(len, maps), initial=0)), pa.int32())
    return pa.MapArray.from_arrays(ends, pa.array(names, pa.string()),
                                   pa.array(values, pa.binary()))

"""The "weir" source's Arrow columns (channel_engine/spark/arrow_decode.py) on both codecs:
the compiled ColumnBuffers (_batch_codec.c) and the pure record_columns path give equal
RecordBatches over any records (null keys and values, empty and large values, headers with
repeated names, null and empty values, non-ASCII names, both timestamp types, cuts),
compressed batches mixed in, in both layouts (the events schema, and the readable one
whose text is split from bytes as Python's strict UTF-8 decoder splits them, at every
edge of UTF-8); damaged batches (CRC recomputed, so the records' own checks
are reached) give the same error on both, and read_split (spark/source.py) turns it into
the error naming the segment and byte, or the batches endpoint's URL and byte. No JVM is
needed, so the tests live here beside the codec fixtures (conftest.py) rather than in
tests/spark."""
from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from channel_engine import Channel, ChannelConfig, LogConfig
from channel_engine.errors import CorruptRecordError, InvalidBatch, OffsetGap, RangeUnavailableError
from channel_engine.log import record_batch as rb
from channel_engine.spark import arrow_decode, source
from channel_engine.spark.arrow_decode import EventColumns
from channel_engine.spark.source import SCHEMA, plan, read_split
from channel_engine.tools.verify import scan_log_file

ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
READABLE_ARROW_SCHEMA = to_arrow_schema(source.READABLE_SCHEMA, timezone="UTC")
Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]
CODECS = ["compiled", "python"]


@contextmanager
def codec_in_use(kind: str, compiled: ModuleType) -> Iterator[None]:
    """record_batch's codec set as WEIR_PURE_PYTHON_CODEC would (each_codec's way, usable
    inside a hypothesis example, which a function-scoped monkeypatch is not)."""
    saved = rb._codec
    rb._codec = compiled if kind == "compiled" else None
    try:
        yield
    finally:
        rb._codec = saved


def make_batch(base: int, records: list[Record], compression: int = 0,
               log_append_time: bool = False, deltas: list[int] | None = None) -> bytes:
    """A batch of `records` (timestamp, key, value, headers) by aiokafka's builder, which
    writes what Weir's build() never does: null values, repeated header names, null
    header values, offset deltas other than 0, 1, 2, ..."""
    builder = DefaultRecordBatchBuilder(2, compression, 0, -1, -1, -1, 2**31 - 1)
    for index, (timestamp, key, value, headers) in enumerate(records):
        builder.append(index if deltas is None else deltas[index], timestamp, key, value,
                       headers)
    batch = builder.build()
    rb.set_base_offset(batch, base)
    if log_append_time:
        attributes = rb.read_header(batch).attributes | rb.TIMESTAMP_TYPE_MASK
        struct.pack_into(">h", batch, rb.ATTRIBUTES_AT, attributes)
        struct.pack_into(">I", batch, rb.CRC_AT, rb.compute_crc(batch))
    return bytes(batch)


def read_columns(batches: list[bytes], start: int, stop: int, schema: Any = ARROW_SCHEMA
                 ) -> tuple[list[Any], int]:
    """The split's RecordBatches in `schema` (read_split's loop: cut ones as they come,
    one at the end) and the offset due after them."""
    columns = EventColumns("orders", 3, schema, readable=schema == READABLE_ARROW_SCHEMA)
    out, expected = [], start
    for batch in batches:
        expected += columns.add(batch, expected, stop)
        out += columns.ready()
    if len(columns):
        out.append(columns.to_batch())
    return out, expected


def expected_rows(batches: list[bytes], start: int, stop: int) -> list[dict[str, Any]]:
    """The rows the module doc promises, from aiokafka's records."""
    rows = []
    for batch in batches:
        for offset, timestamp, key, value, headers in rb.records(batch):
            if start <= offset < stop:
                rows.append({"channel": "orders", "partition": 3, "offset": offset,
                             "timestamp": timestamp, "key": key,
                             "headers": list(dict(headers).items()),
                             "body": b"" if value is None else value})
    return rows


BODIES = (st.none() | st.binary(max_size=40)
          | st.integers(1000, 70_000).map(lambda n: bytes([n % 251]) * n))
HEADERS = st.lists(st.tuples(st.sampled_from(["a", "b", "trace-id", "é", "日本", ""]),
                             st.none() | st.binary(max_size=12)), max_size=24)
RECORDS = st.lists(st.tuples(st.integers(0, 2**41), st.none() | st.binary(max_size=16),
                             BODIES, HEADERS), min_size=1, max_size=12)

# small records, so that most damage lands in their structure rather than in a value
SMALL_RECORDS = st.lists(st.tuples(st.integers(0, 2**41), st.none() | st.binary(max_size=4),
                                   st.none() | st.binary(max_size=8), HEADERS.map(lambda h: h[:3])),
                         min_size=1, max_size=6)


@st.composite
def splits(draw: st.DrawFn) -> tuple[list[bytes], int, int]:
    """Consecutive batches (some gzip'd, some LogAppendTime) and a [start, stop) cut."""
    base = draw(st.integers(0, 2**40))
    batches, offset = [], base
    for records in draw(st.lists(RECORDS, min_size=1, max_size=5)):
        batches.append(make_batch(offset, records, draw(st.sampled_from([0, 0, 0, 1])),
                                  draw(st.integers(0, 5)) == 0))
        offset += len(records)
    start = draw(st.integers(base, offset))
    return batches, start, draw(st.integers(start, offset))


# batch_codec is a module, so sharing it between examples is safe
@settings(max_examples=300, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(split=splits())
def test_both_codecs_give_the_rows_of_the_records_in_equal_tables(
    batch_codec: ModuleType, split: tuple[list[bytes], int, int],
) -> None:
    batches, start, stop = split
    tables = {}
    for kind in CODECS:
        with codec_in_use(kind, batch_codec):
            read, due = read_columns(batches, start, stop)
        assert due == stop
        for batch in read:
            batch.validate(full=True)  # offsets in bounds, names UTF-8, bitmaps sized
            assert batch.schema == ARROW_SCHEMA
        tables[kind] = pa.Table.from_batches(read, ARROW_SCHEMA)
    assert tables["compiled"].equals(tables["python"])
    assert tables["compiled"].to_pylist() == expected_rows(batches, start, stop)


def test_a_record_of_many_headers_keeps_each_name_once_with_its_last_value(
    batch_codec: ModuleType,
) -> None:
    names = [f"h{i % 37}" for i in range(500)]  # past the linear scan: the hash table
    headers: list[tuple[str, bytes | None]] = [
        (name, None if i % 11 == 0 else str(i).encode()) for i, name in enumerate(names)]
    batch = make_batch(0, [(5, None, b"x", headers), (6, b"k", b"y", headers[:3])])
    tables = {}
    for kind in CODECS:
        with codec_in_use(kind, batch_codec):
            [tables[kind]] = read_columns([batch], 0, 2)[0]
    assert tables["compiled"].equals(tables["python"])
    first = tables["compiled"].column("headers")[0].as_py()
    assert first == list(dict(headers).items()) and len(first) == 37


def test_record_batches_are_cut_before_a_column_passes_what_arrow_holds(
    each_codec: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(arrow_decode, "MAX_COLUMN_BYTES", 5000)
    batches = [make_batch(10 * b, [(1, None, bytes([b]) * 200, [])] * 10, b % 2)
               for b in range(8)]  # 2,000 body bytes each, every other one gzip'd
    read, due = read_columns(batches, 0, 80)
    assert due == 80 and len(read) > 3
    for batch in read:
        assert sum(len(body) for body in batch.column("body").to_pylist()) <= 5000
    table = pa.Table.from_batches(read)
    assert table.column("offset").to_pylist() == list(range(80))
    assert table.to_pylist() == expected_rows(batches, 0, 80)


def test_records_that_skip_an_offset_are_an_offset_gap_naming_both(each_codec: str) -> None:
    batches = [make_batch(0, [(1, None, b"a", [])] * 3), make_batch(4, [(1, None, b"b", [])])]
    with pytest.raises(OffsetGap) as raised:
        read_columns(batches, 0, 10)
    assert (raised.value.got, raised.value.due) == (4, 3)


def test_a_batch_whose_records_do_not_decode_appends_none_of_them(
    batch_codec: ModuleType,
) -> None:
    good = make_batch(0, [(1, b"k", b"good", [("a", b"1")])] * 3)
    bad = bytearray(make_batch(3, [(1, b"k", b"bad", [("a", b"1")])] * 3))
    bad[-3] = 0xFF  # a header name byte: not UTF-8
    struct.pack_into(">I", bad, rb.CRC_AT, rb.compute_crc(bad))
    with codec_in_use("compiled", batch_codec):
        columns = EventColumns("orders", 3, ARROW_SCHEMA)
        assert columns.add(good, 0, 10) == 3
        with pytest.raises(InvalidBatch, match="UnicodeDecodeError"):
            columns.add(bytes(bad), 3, 10)
        assert len(columns) == 3
        assert columns.to_batch().column("body").to_pylist() == [b"good"] * 3


@st.composite
def damaged_batches(draw: st.DrawFn) -> bytes:
    """A plain batch with bytes flipped, overwritten or cut off after the CRC field, its
    length and CRC made right again."""
    data = bytearray(make_batch(100, draw(SMALL_RECORDS)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(rb.CRC_START, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "overwrite", "truncate"]))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=8))
            data[at:at + len(chunk)] = chunk
        elif at > rb.HEADER_SIZE:
            del data[at:]
    struct.pack_into(">i", data, 8, len(data) - rb.LOG_OVERHEAD)
    struct.pack_into(">I", data, rb.CRC_AT, rb.compute_crc(data))
    return bytes(data)


def outcome(batch: bytes) -> tuple[str, Any]:
    try:
        read, _ = read_columns([batch], 100, 2**62)
    except OffsetGap as gap:
        return "gap", (gap.got, gap.due)
    except Exception as exc:  # noqa: BLE001 -- the error itself is what is compared
        return "error", (type(exc), str(exc))
    return "rows", pa.Table.from_batches(read, ARROW_SCHEMA).to_pylist()


@settings(max_examples=400, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(batch=damaged_batches())
def test_a_damaged_batch_gives_the_same_error_on_both_codecs(
    batch_codec: ModuleType, batch: bytes,
) -> None:
    found = {}
    for kind in CODECS:
        with codec_in_use(kind, batch_codec):
            found[kind] = outcome(batch)
    event(f"compiled: {found['compiled'][0]}")
    try:
        offsets = [record[0] for record in rb.records(batch)]
    except Exception:  # noqa: BLE001 -- aiokafka refuses the records: both must, alike
        assert found["python"][0] == "error"
        if found["compiled"] != found["python"]:
            # The one difference allowed: a varint cut by the batch's end. aiokafka reads it
            # without a bounds check (the byte past the end: a bytes object's NUL) and fails
            # a check later; the compiled codec checks each varint byte first.
            cls, message = found["compiled"][1]
            assert cls is found["python"][1][0] is InvalidBatch
            assert message.endswith(f"Can't read 1 bytes from pos {len(batch)}")
        return
    # damaged offset deltas included: both check every offset, alike
    assert found["compiled"] == found["python"]
    if found["compiled"][0] == "rows":  # the records in the split's range run on
        assert [row["offset"] for row in found["compiled"][1]] == [o for o in offsets
                                                                  if o >= 100]


@settings(max_examples=500, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(records=SMALL_RECORDS, edits=st.lists(st.tuples(
    st.integers(0, 400), st.sampled_from(["flip", "overwrite", "truncate", "insert"]),
    st.binary(min_size=1, max_size=9)), min_size=1, max_size=4))
def test_any_bytes_give_rows_or_the_codecs_errors_never_more(
    batch_codec: ModuleType, records: list[Record], edits: list[tuple[int, str, bytes]],
) -> None:
    # No CRC here: the buffers' own bounds checks, on any header and records bytes.
    data = bytearray(make_batch(7, records))
    for at, kind, chunk in edits:
        at = at % len(data) if data else 0
        if kind == "flip" and data:
            data[at] ^= chunk[0] or 1
        elif kind == "overwrite":
            data[at:at + len(chunk)] = chunk
        elif kind == "truncate":
            del data[at:]
        else:
            data[at:at] = chunk
    buffers = batch_codec.ColumnBuffers(readable=True)
    try:
        result = buffers.append(bytes(data), 0, 2**62)
    except (CorruptRecordException, UnicodeDecodeError):
        assert len(buffers) == 0  # rolled back whole
        return
    taken = buffers.take()
    if result is None:  # not plain, or too short for a header: the caller's path
        assert taken[0] == 0
        return
    added, _ = result
    rows, key_nulls, entries, value_nulls, key_raws, value_raws, hvalue_raws = taken[:7]
    buffers = taken[7:]
    assert rows == added == len(buffers[0]) // 8 == len(buffers[1]) // 8
    assert len(buffers[3]) == len(buffers[5]) == len(buffers[7]) == 4 * (rows + 1)
    assert len(buffers[8]) == len(buffers[11]) == 4 * (entries + 1)
    # text and raw bitmaps: a bit for each key and value, and each header value
    assert all(len(bitmap) == -(-rows // 8) for bitmap in buffers[13:17])
    assert len(buffers[17]) == -(-entries // 8)
    assert key_raws + key_nulls <= rows and value_raws <= rows
    assert hvalue_raws + value_nulls <= entries


def with_records_refused(batch: bytes, at: int) -> bytes:
    """The batch with byte `at` (a header name's) made invalid UTF-8 and its CRC made right:
    only the records' own checks can refuse it."""
    data = bytearray(batch)
    data[at] = 0xFF
    struct.pack_into(">I", data, rb.CRC_AT, rb.compute_crc(data))
    return bytes(data)


def each_outcome(batch_codec: ModuleType, batches: list[bytes], start: int,
                 stop: int) -> dict[str, tuple[str, Any]]:
    """outcome() of reading the batches, on each codec."""
    found = {}
    for kind in CODECS:
        with codec_in_use(kind, batch_codec):
            try:
                read, _ = read_columns(batches, start, stop)
            except OffsetGap as gap:
                found[kind] = "gap", (gap.got, gap.due)
            except InvalidBatch as exc:
                found[kind] = "error", str(exc)
            else:
                found[kind] = "rows", pa.Table.from_batches(read, ARROW_SCHEMA).to_pylist()
    return found


@pytest.mark.parametrize(("deltas", "stop", "message"), [
    ([0, 1, 6, 3, 4, 5], 200, "Record offset 103 after 106"),
    ([0, 1, 6, 3, 4, 5], 102, "Record offset 103 after 106"),  # past the range: still damage
    ([0, 1, -1], 200, "Record offset 99 after 101"),  # below the split once its run began
    ([0, 2, 2], 200, "Record offset 102 after 102"),
])
def test_offsets_that_do_not_increase_are_damage_on_both_codecs(
    batch_codec: ModuleType, deltas: list[int], stop: int, message: str,
) -> None:
    batch = make_batch(100, [(1, None, b"x", [])] * len(deltas), deltas=deltas)
    found = each_outcome(batch_codec, [batch], 100, stop)
    assert found["compiled"] == found["python"]
    assert found["compiled"][0] == "error"
    assert found["compiled"][1].endswith(f"CorruptRecordException: {message}: offsets must "
                                         "increase")


def test_a_run_broken_inside_a_batch_is_an_offset_gap_on_both_codecs(
    batch_codec: ModuleType,
) -> None:
    batch = make_batch(100, [(1, None, b"x", [])] * 4, deltas=[0, 1, 3, 4])
    found = each_outcome(batch_codec, [batch], 100, 200)
    assert found["compiled"] == found["python"] == ("gap", (103, 102))


@pytest.mark.parametrize("size", [rb.ATTRIBUTES_AT + 2, 40, rb.HEADER_SIZE - 1])
def test_a_plain_batch_shorter_than_its_header_is_invalid_on_both_codecs(
    batch_codec: ModuleType, size: int,
) -> None:
    batch = make_batch(0, [(1, None, b"x", [])])[:size]
    found = each_outcome(batch_codec, [batch], 0, 10)
    assert found["compiled"] == found["python"]
    assert found["compiled"][0] == "error"


@pytest.mark.parametrize("readable", [False, True])
def test_validity_bits_a_rolled_back_batch_set_are_cleared_for_the_next_rows(
    batch_codec: ModuleType, readable: bool,
) -> None:
    good = make_batch(0, [(1, b"k", b"good", [("a", b"1")])])
    # 5 records with keys and header values, all taken back: the last one's name is bad
    refused = with_records_refused(
        make_batch(1, [(1, b"k", b"bad", [("a", b"1"), ("b", b"2")])] * 5), -3)
    # null keys and header values, and (readable) bodies that are not text
    nulls = make_batch(1, [(1, None, b"null\xff", [("a", None), ("b", None)])] * 6)
    tables = {}
    for kind in CODECS:
        with codec_in_use(kind, batch_codec):
            columns = EventColumns("orders", 3,
                                   READABLE_ARROW_SCHEMA if readable else ARROW_SCHEMA, readable)
            columns.add(good, 0, 10)
            with pytest.raises(InvalidBatch, match="UnicodeDecodeError"):
                columns.add(refused, 1, 10)
            columns.add(nulls, 1, 10)
            tables[kind] = columns.to_batch()
            tables[kind].validate(full=True)
    assert tables["compiled"].equals(tables["python"])
    expected = readable_rows if readable else expected_rows
    assert tables["compiled"].to_pylist() == expected([good, nulls], 0, 10)


def allocations_failing(call: Any, attempt: int) -> BaseException | None:
    """Run call() with the `attempt`-th memory allocation from now failing (CPython's own
    test hook); the MemoryError it raised, or None."""
    testcapi = pytest.importorskip("_testcapi")  # CPython's test module, as CI's Python has
    testcapi.set_nomemory(attempt, attempt + 1)
    try:
        call()
    except MemoryError as exc:
        return exc
    finally:
        testcapi.remove_mem_hooks()
    return None


@pytest.mark.parametrize("method", ["append", "take"])
def test_a_failed_allocation_leaves_column_buffers_whole(
    batch_codec: ModuleType, method: str,
) -> None:
    # 300 records, with a key each other one: the counts are not cached small ints
    records: list[Record] = [(1, b"k" if i % 2 else None, b"v" * (i % 7), [("a", b"1")])
                             for i in range(300)]
    first, second = make_batch(0, records), make_batch(300, records)
    failed = 0
    for attempt in range(200):
        buffers = batch_codec.ColumnBuffers()
        buffers.append(first, 0, 600)
        call = partial(buffers.append, second, 300, 600) if method == "append" \
            else buffers.take
        if allocations_failing(call, attempt) is None:
            break
        failed += 1
        assert len(buffers) == 300  # as before the call: nothing half-added, nothing lost
        buffers.append(second, 300, 600)  # and still usable
        columns = EventColumns("orders", 3, ARROW_SCHEMA)
        batch = arrow_decode._buffers_batch(columns, buffers.take())
        batch.validate(full=True)
        assert batch.to_pylist() == expected_rows([first, second], 0, 600)
    else:
        pytest.fail("the call still failed after 200 allocations")
    assert failed > 3  # the hook did reach the call's allocations


def channel_with_refused_records(tmp_path: Path) -> tuple[ChannelConfig, Path, int]:
    """A channel of 12 batches of 10 events whose sixth batch's first record says it is a
    byte longer than it is, its CRC made right (so only the records' checks refuse it);
    the config, the segment and that batch's position."""
    config = ChannelConfig("t", (str(tmp_path / "data"),), str(tmp_path / "home"),
                           partitions=1, minimum_required_space=0)
    with Channel.open(config) as channel:
        for b in range(12):
            with channel.put() as tx:
                for i in range(10):
                    tx.put(f"batch {b} event {i}".encode())
    [segment] = sorted(config.partition_dir(0).glob("*.log"))
    position, header = scan_log_file(segment, None).batches[5]
    data = bytearray(segment.read_bytes())
    batch = data[position:position + header.size]
    batch[rb.HEADER_SIZE] += 2  # the first record's length varint (zigzag): one more
    struct.pack_into(">I", batch, rb.CRC_AT, rb.compute_crc(batch))
    data[position:position + header.size] = batch
    segment.write_bytes(bytes(data))
    return config, segment, position


def test_read_split_over_records_that_do_not_decode_names_the_segment_and_byte(
    each_codec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, segment, position = channel_with_refused_records(tmp_path)
    monkeypatch.setattr(source, "ARROW_BATCH_ROWS", 1)  # hand over each batch at once
    [split] = plan({"home": str(config.home), "ranges": json.dumps({"0": [0, 120]})})
    handed: list[int] = []
    with pytest.raises(CorruptRecordError) as raised:
        for batch in read_split(split):
            handed += batch.column("offset").to_pylist()
    assert (raised.value.path, raised.value.position) == (str(segment), position)
    assert raised.value.reason.startswith("records do not decode: CorruptRecordException")
    assert "Invalid record size" in raised.value.reason
    assert handed == list(range(50))  # the intact batches before it, none past it


def test_read_split_over_a_served_batch_that_does_not_decode_names_the_url_and_byte(
    each_codec: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    record: Record = (1, b"k", b"v", [("a", b"1")])
    first = make_batch(0, [record] * 10)
    refused = with_records_refused(make_batch(10, [record] * 10), -3)
    served = first + refused + make_batch(20, [record] * 10)
    monkeypatch.setattr(source, "_get_batches", lambda split, url, start: (served, 30))
    split = source.WeirSplit("orders", 3, 0, 30, "unused", LogConfig(), None, None,
                             url="http://appliance.test", token="secret")
    with pytest.raises(RangeUnavailableError) as raised:
        list(read_split(split))
    url = "http://appliance.test/api/v1/channels/orders/partitions/3/batches?start=0&end=30"
    assert f"{url}: bad batch at byte {len(first)}: " in str(raised.value)
    assert "UnicodeDecodeError" in str(raised.value)


def names_in_one_slot(count: int, bits: int) -> list[str]:
    """`count` distinct 4-byte ASCII names whose unsalted FNV-1a hashes agree in their low
    `bits` bits: a hash table indexed by those bits would put them all in one chain."""
    prime, mask, names = 0x100000001B3, (1 << 64) - 1, []
    inverse = pow(prime, -1, 1 << bits)
    target = (0x2A * inverse) & ((1 << bits) - 1)  # what the state must be before the last *P
    for prefix in range(128 ** 3):
        state = 0xCBF29CE484222325
        chars = [prefix % 128, prefix // 128 % 128, prefix // 16384]
        for char in chars:
            state = ((state ^ char) * prime) & mask
        last = (state ^ target) & 0xFF
        if last < 0x80 and ((state ^ last) - target) & ((1 << bits) - 1) == 0:
            names.append(bytes([*chars, last]).decode())
            if len(names) == count:
                return names
    raise AssertionError("too few names")


def test_names_made_to_collide_in_a_fixed_hash_cost_no_more_than_any_names(
    batch_codec: ModuleType,
) -> None:
    # A record's headers are deduplicated by a hash table (salted at import): names chosen
    # for one fixed hash must not make it quadratic. 3,000 headers: a table of 2**13 slots.
    colliding = names_in_one_slot(3000, 13)
    plain = [f"{i:04x}" for i in range(3000)]
    seconds = {}
    for kind, names in (("colliding", colliding), ("plain", plain)):
        batch = make_batch(0, [(1, None, b"x", [(n, b"") for n in names])] * 10)
        runs = []
        for _ in range(3):
            buffers = batch_codec.ColumnBuffers()
            began = time.perf_counter()
            buffers.append(batch, 0, 10)
            runs.append(time.perf_counter() - began)
        seconds[kind] = min(runs)
    assert seconds["colliding"] < 10 * seconds["plain"] + 0.002, seconds


def test_read_split_over_plain_and_compressed_batches_gives_every_event_in_order(
    each_codec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = [f"event {i} ".encode() * (i % 5) for i in range(90)]
    for third, compression in enumerate(["none", "gzip", "none"]):  # runs of each kind
        config = ChannelConfig("t", (str(tmp_path / "data"),), str(tmp_path / "home"),
                               partitions=1, minimum_required_space=0,
                               compression=compression)
        with Channel.open(config) as channel:
            for b in range(3):
                with channel.put() as tx:
                    for body in events[30 * third + 10 * b:30 * third + 10 * b + 10]:
                        tx.put(body)
    [segment] = sorted(config.partition_dir(0).glob("*.log"))
    codecs = [header.attributes & rb.CODEC_MASK for _, header in
              scan_log_file(segment, None).batches]
    assert [codec != 0 for codec in codecs] == [False] * 3 + [True] * 3 + [False] * 3
    monkeypatch.setattr(source, "ARROW_BATCH_ROWS", 25)  # handed over past 25 rows
    [split] = plan({"home": str(config.home), "ranges": json.dumps({"0": [5, 85]})})
    read = list(read_split(split))
    assert [batch.num_rows for batch in read] == [25, 30, 25]
    table = pa.Table.from_batches(read)
    assert table.column("offset").to_pylist() == list(range(5, 85))
    assert table.column("body").to_pylist() == events[5:85]


# -- the readable columns (source.py's READABLE_SCHEMA: text split from bytes) -------------
# bytes near UTF-8's edges (Unicode's Table 3-7): lead bytes, continuation bytes, the
# bounds of E0, ED, F0 and F4's second byte, and ASCII around them
UTF8_EDGES = st.lists(st.sampled_from(
    [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
     0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]), max_size=12).map(bytes)
TEXTS = st.text(max_size=20).map(str.encode)  # well-formed, often not ASCII
VALUES = st.none() | st.binary(max_size=16) | TEXTS | UTF8_EDGES
READABLE_RECORDS = st.lists(st.tuples(
    st.integers(0, 2**41), VALUES, VALUES | st.binary(min_size=9, max_size=40).map(
        lambda b: b"ascii run " + b),  # past the 8-byte ASCII stride, then anything
    st.lists(st.tuples(st.sampled_from(["a", "b", "é", ""]), VALUES), max_size=6)),
    min_size=1, max_size=10)


def readable_rows(batches: list[bytes], start: int, stop: int) -> list[dict[str, Any]]:
    """The readable rows arrow_decode's module doc promises, from aiokafka's records, by
    Python's strict UTF-8 decoder."""
    def text(value: bytes | None) -> str | None:
        try:
            return None if value is None else value.decode()
        except UnicodeDecodeError:
            return None

    rows = []
    for batch in batches:
        for offset, timestamp, key, value, headers in rb.records(batch):
            if not start <= offset < stop:
                continue
            body = b"" if value is None else value
            entries = dict(headers)
            raw = [(n, v) for n, v in entries.items() if v is not None and text(v) is None]
            rows.append({"channel": "orders", "partition": 3, "offset": offset,
                         "timestamp": timestamp, "key": text(key),
                         "key_bytes": key if key is not None and text(key) is None else None,
                         "headers": [(n, text(v)) for n, v in entries.items()
                                     if v is None or text(v) is not None],
                         "headers_bytes": raw or None,
                         "body": text(body), "body_bytes": body if text(body) is None else None})
    return rows


def read_readable(batches: list[bytes], start: int, stop: int) -> list[Any]:
    """read_columns' RecordBatches, in the readable schema."""
    read, expected = read_columns(batches, start, stop, READABLE_ARROW_SCHEMA)
    assert expected == stop
    return read


@settings(max_examples=300, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(records=st.lists(READABLE_RECORDS, min_size=1, max_size=3),
       compressed=st.lists(st.booleans(), min_size=3, max_size=3))
def test_both_codecs_split_text_from_bytes_as_pythons_decoder_does(
    batch_codec: ModuleType, records: list[list[Record]], compressed: list[bool],
) -> None:
    batches, offset = [], 0
    for group, gzip in zip(records, compressed, strict=False):
        batches.append(make_batch(offset, group, 1 if gzip else 0))
        offset += len(group)
    tables = {}
    for kind in CODECS:
        with codec_in_use(kind, batch_codec):
            read = read_readable(batches, 0, offset)
        for batch in read:
            batch.validate(full=True)  # offsets in bounds, text UTF-8, bitmaps sized
            assert batch.schema == READABLE_ARROW_SCHEMA
        tables[kind] = pa.Table.from_batches(read, READABLE_ARROW_SCHEMA)
        event("some value not UTF-8" if any(
            row["key_bytes"] is not None or row["body_bytes"] is not None
            or row["headers_bytes"] for row in tables[kind].to_pylist()) else "all text")
    assert tables["compiled"].equals(tables["python"])
    assert tables["compiled"].to_pylist() == readable_rows(batches, 0, offset)


@pytest.mark.parametrize("value", [
    b"", b"plain ascii", "é日本€𝄞".encode(), b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80",
    b"\xed\x9f\xbf", b"\xee\x80\x80", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf",
    b"\xc0\x80", b"\xc1\xbf", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
    b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\x80", b"\xbf",
    b"\xe2\x82", b"\xf0\x9f\x98", b"abcdefgh\xff", b"abcdefg\xc3\xa9", b"\xfe\xff"])
def test_the_compiled_utf8_check_agrees_with_python_at_every_edge(
    batch_codec: ModuleType, value: bytes,
) -> None:
    batch = make_batch(0, [(1, value, value, [("h", value)])])
    with codec_in_use("compiled", batch_codec):
        [read] = read_readable([batch], 0, 1)
    assert read.to_pylist() == readable_rows([batch], 0, 1)


def test_only_records_with_raw_header_values_get_a_headers_bytes_map(
    batch_codec: ModuleType,
) -> None:
    records: list[Record] = [
        (1, None, b"a", [("t", b"text"), ("r", b"\xff"), ("n", None)]),
        (2, None, b"b", []),
        (3, None, b"c", [("t", b"more text")]),
        (4, None, b"d", [("r1", b"\xfe"), ("r2", b"\xc0\x80")])]
    for kind in CODECS:
        with codec_in_use(kind, batch_codec):
            [read] = read_readable([make_batch(0, records)], 0, 4)
        assert read.column("headers").to_pylist() == [
            [("t", "text"), ("n", None)], [], [("t", "more text")], []]
        assert read.column("headers_bytes").to_pylist() == [
            [("r", b"\xff")], None, None, [("r1", b"\xfe"), ("r2", b"\xc0\x80")]]


def test_the_events_layout_sets_no_text_bits_and_each_column_holds_only_its_own_bytes(
    batch_codec: ModuleType,
) -> None:
    texts = make_batch(0, [(1, b"k", b"t" * 100, [])] * 50)
    mixed = make_batch(50, [(1, None, b"\xff" * 100 if i % 10 == 0 else b"t" * 100, [])
                            for i in range(50)])
    plain = batch_codec.ColumnBuffers()
    plain.append(texts, 0, 50)
    taken = plain.take()
    assert taken[0] == 50 and taken[4:7] == (0, 0, 0) and not any(taken[-5:])  # no bits
    with codec_in_use("compiled", batch_codec):
        [all_text] = read_readable([texts], 0, 50)
        [both] = read_readable([mixed], 50, 100)
    # Arrow sends every byte of a buffer: a column of nulls, or of just its own values
    # (offsets and bitmaps aside, about 500 bytes here)
    assert all_text.column("body_bytes").null_count == 50
    assert all_text.column("body_bytes").nbytes < 1000  # no body's bytes
    assert both.column("body_bytes").nbytes < 5 * 100 + 1000  # the 5 raw bodies', not 50
    assert both.column("body").to_pylist()[:2] == [None, "t" * 100]

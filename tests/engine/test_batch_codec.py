"""The compiled record batch codec (_batch_codec.c) against the pure Python path.

Encode: byte for byte the batch aiokafka's builder makes (record_batch.build_python), over
generated events; the same InvalidEventError for bad input. Decode: the same Events as
LogReader._decode's loop over aiokafka's records, over generated batches and start/stop/
limit cuts; the same outcome for damaged records sections (every truncation, random byte
flips, the CRC made right so only the records are wrong). WEIR_PURE_PYTHON_CODEC in a
fresh process. The compiled codec is imported directly (the `batch_codec` fixture,
codec_helpers.py): these tests run under WEIR_PURE_PYTHON_CODEC=1 too, and are skipped
where it was not built unless WEIR_REQUIRE_COMPILED_CODEC=1.
"""
from __future__ import annotations

import mmap
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import codec_helpers
import crc32c
import pytest
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from codec_helpers import compiled_codec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from channel_engine.errors import CorruptRecordError, InvalidEventError
from channel_engine.event import Event, PendingEvent
from channel_engine.log import record_batch
from channel_engine.log.log_read import LogReader

MAX_TS = 2**63 - 1
REPO = Path(__file__).resolve().parents[2]

# -- generated events -----------------------------------------------------------------------
bodies = st.one_of(st.binary(max_size=64), st.binary(min_size=200, max_size=400),
                   st.builds(lambda n, b: bytes([b]) * n, st.integers(16_000, 70_000),
                             st.integers(0, 255)))
keys = st.one_of(st.none(), st.binary(max_size=40))
header_values = st.one_of(st.binary(max_size=30), st.text(max_size=20), st.none(),
                          st.binary(max_size=10).map(bytearray),
                          st.binary(max_size=10).map(memoryview))
headers = st.one_of(st.none(), st.just({}),
                    st.dictionaries(st.text(max_size=12), header_values, max_size=5))
timestamps = st.one_of(st.none(), st.sampled_from([0, 1, MAX_TS, MAX_TS - 1, 1_700_000_000_000]),
                       st.integers(0, MAX_TS))
events = st.lists(st.builds(PendingEvent, bodies, keys, headers, timestamps),
                  min_size=1, max_size=25)
transaction_ids = st.one_of(st.none(), st.integers(0, MAX_TS))
nows = st.one_of(st.sampled_from([0, MAX_TS]), st.integers(0, MAX_TS))


# the fixture is a module, the same for every example
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, *FIXTURE_OK])
@given(events, transaction_ids, nows)
def test_it_encodes_the_bytes_aiokafka_builds(batch_codec: ModuleType, batch: list[PendingEvent],
                                              transaction_id: int | None, now: int) -> None:
    compiled = batch_codec.encode(batch, transaction_id, now)
    assert compiled is not None
    assert bytes(compiled) == bytes(record_batch.build_python(batch, 0, transaction_id, now))


def test_build_goes_through_the_compiled_codec_and_gives_the_same_bytes(
        batch_codec: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = [PendingEvent(b"x" * i, b"k" if i % 2 else None, {"h": str(i)}, 1000 + i)
             for i in range(100)]
    expected = record_batch.build_python(batch, 0, 77, 0)
    monkeypatch.setattr(record_batch, "_codec", batch_codec)
    monkeypatch.setattr(record_batch, "build_python", None)  # a fallback would fail
    built = record_batch.build(batch, 0, 77)
    assert isinstance(built, bytearray)
    assert built == expected


def test_it_takes_now_for_events_without_a_timestamp() -> None:
    batch = record_batch.build([PendingEvent(b"a"), PendingEvent(b"b", timestamp=5)])
    header = record_batch.read_header(batch)
    assert abs(header.first_timestamp - int(time.time() * 1000)) < 60_000
    assert header.max_timestamp == header.first_timestamp


@pytest.mark.parametrize("compression", [1, 2, 3, 4])
def test_compressed_batches_still_go_through_aiokafka(compression: int) -> None:
    batch = [PendingEvent(b"body %d" % i, None, {"n": b"%d" % i}, 7) for i in range(50)]
    built = bytes(record_batch.build(batch, compression))
    assert record_batch.read_header(built).codec == record_batch.CODEC_NAMES[compression]
    assert [(v, h) for _, _, _, v, h in record_batch.records(built)] == [
        (e.body, [("n", e.headers["n"])]) for e in batch]  # type: ignore[index]
    assert record_batch.decode_events(built, 0, 0, 50, 50, []) is False


# -- bad input: the Python path's errors, word for word -----------------------------------
BAD_EVENTS: list[Any] = [
    PendingEvent(None),  # type: ignore[arg-type]
    PendingEvent("text"),  # type: ignore[arg-type]
    PendingEvent(123),  # type: ignore[arg-type]
    PendingEvent(b"x", key="k"),  # type: ignore[arg-type]
    PendingEvent(b"x", key=5),  # type: ignore[arg-type]
    PendingEvent(b"x", headers=[("a", b"b")]),  # type: ignore[arg-type]
    PendingEvent(b"x", headers={1: b"b"}),  # type: ignore[dict-item]
    PendingEvent(b"x", headers={"a": 5}),  # type: ignore[dict-item]
    PendingEvent(b"x", headers={"a": "\ud800"}),
    PendingEvent(b"x", headers={"\ud800": b"v"}),
    PendingEvent(b"x", timestamp=-1),
    PendingEvent(b"x", timestamp=2**63),
    PendingEvent(b"x", timestamp=1.5),  # type: ignore[arg-type]
    PendingEvent(b"x", timestamp=True),
    (b"x", None, None),
    [b"x", None, None, 2],  # not refused: encoded by the Python path
    b"not an event",
    None,
]


@pytest.mark.parametrize("bad", BAD_EVENTS, ids=repr)
def test_bad_input_gives_the_python_paths_error(bad: Any, batch_codec: ModuleType,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    batch = [PendingEvent(b"good", timestamp=1), bad]
    assert batch_codec.encode(batch, None, 1) is None  # declined: the Python path words it
    outcomes = []
    for codec in (batch_codec, None):
        monkeypatch.setattr(record_batch, "_codec", codec)
        try:
            outcomes.append(bytes(record_batch.build(batch)))
        except InvalidEventError as exc:
            outcomes.append((type(exc), exc.index, exc.field, exc.reason))
    assert outcomes[0] == outcomes[1]


def test_a_list_of_four_is_encoded_as_the_python_path_encodes_it(batch_codec: ModuleType
                                                                   ) -> None:
    batch: Any = [[b"x", None, None, 3]]
    assert batch_codec.encode(batch, None, 1) is None  # declined: not a PendingEvent tuple
    assert record_batch.build(batch) == record_batch.build_python(batch, 0, None, 1)


def test_an_empty_put_is_refused_as_before() -> None:
    with pytest.raises(InvalidEventError, match="at least one event"):
        record_batch.build([])


class BytesWithOwnBytes(bytes):
    """A bytes subclass whose __bytes__ differs from its buffer (the Python path's bytes())."""

    def __bytes__(self) -> bytes:
        return b"from __bytes__"


class BytearrayWithOwnBytes(bytearray):
    def __bytes__(self) -> bytes:
        return b"from __bytes__"


SUBCLASSED: list[PendingEvent] = [
    PendingEvent(b"x", headers={"h": BytesWithOwnBytes(b"raw buffer")}),
    PendingEvent(b"x", headers={"h": BytearrayWithOwnBytes(b"raw buffer")}),
    PendingEvent(BytesWithOwnBytes(b"body")),
    PendingEvent(b"x", key=BytearrayWithOwnBytes(b"key")),
    PendingEvent(b"x", headers=type("Headers", (dict,), {})(h=b"v")),
]


@pytest.mark.parametrize("event", SUBCLASSED, ids=repr)
def test_subclasses_of_the_built_in_types_are_left_to_the_python_path(
        event: PendingEvent, batch_codec: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only exact types are read in C: a subclass may define __bytes__ (honoured for header
    values by the Python path) or run Python code when its buffer is taken."""
    batch = [PendingEvent(b"plain", timestamp=1), event._replace(timestamp=2)]
    assert batch_codec.encode(batch, None, 1) is None
    built = []
    for codec in (batch_codec, None):
        monkeypatch.setattr(record_batch, "_codec", codec)
        built.append(bytes(record_batch.build(batch)))
    assert built[0] == built[1]
    if isinstance((event.headers or {}).get("h"), BytesWithOwnBytes | BytearrayWithOwnBytes):
        assert list(record_batch.records(built[0]))[1][4] == [("h", b"from __bytes__")]


def test_a_record_or_batch_of_2_gib_is_declined_without_overflow(batch_codec: ModuleType
                                                                  ) -> None:
    """Sizes summed field by field stop at 2 GiB, before any sum could wrap: the views map
    untouched anonymous memory, so nothing is copied."""
    with mmap.mmap(-1, 1 << 30) as gib:
        view = memoryview(gib)
        try:
            for batch in ([PendingEvent(view, view)],  # one record: key + body
                          [PendingEvent(b"x", None, {"a": view, "b": view, "c": view})],
                          [PendingEvent(view), PendingEvent(view)]):  # two records
                assert batch_codec.encode(batch, None, 1) is None
            assert batch_codec.encode([PendingEvent(view[:1000])], None, 1) is not None
        finally:
            view.release()


def test_it_leaves_no_buffer_held_and_no_reference_behind(batch_codec: ModuleType) -> None:
    """The encoder pins the events' fields (references, held buffers) for its two passes
    only: afterwards a bytearray it read may be resized and the events freed."""
    body = bytearray(b"b" * 100)
    batch = [PendingEvent(body, None, {"h": memoryview(b"header value")}, 1)]
    expected = bytes(record_batch.build_python(batch, 0, None, 1))
    assert bytes(batch_codec.encode(batch, None, 1)) == expected
    body.extend(b"grown after")  # no buffer left held by the encoder: it may resize
    batch.clear()
    assert sys.getrefcount(body) == 2  # no reference leaked either (body, the argument)


def test_a_fresh_process_decodes_with_the_extension_alone(batch_codec: ModuleType) -> None:
    """The extension imports its Event and error classes itself: a process that never
    loaded the compiled codec through record_batch decodes with it all the same."""
    script = (
        "from channel_engine.log import record_batch\n"
        "assert record_batch._codec is None\n"
        "from channel_engine.event import Event, PendingEvent\n"
        "from channel_engine.log import _batch_codec\n"
        "batch = bytes(record_batch.build([PendingEvent(b'v', b'k', {'h': b'1'}, 7)]))\n"
        "out = []\n"
        "assert _batch_codec.decode(batch, 2, 0, 1, 10, out) is True\n"
        "assert out == [(2, 0, 7, b'k', {'h': b'1'}, b'v')] and type(out[0]) is Event, out\n"
        "print('ok')\n"
    )
    run = in_fresh_process(script, "1", timeout=60)
    assert run.stdout.strip() == "ok", run.stderr


# -- decode -----------------------------------------------------------------------------------
RecordSpec = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]

records_strategy = st.lists(
    st.tuples(st.integers(-5, 10**6),  # timestamp delta from the first
              st.one_of(st.none(), st.binary(max_size=20)),
              st.one_of(st.none(), st.binary(max_size=300)),
              st.lists(st.tuples(st.sampled_from(["a", "b", "é", ""]),  # names repeat
                                 st.one_of(st.none(), st.binary(max_size=8))), max_size=4)),
    min_size=1, max_size=20)


def make_batch(records: list[RecordSpec], base_offset: int, first: int = 1_700_000_000_000,
               attributes: int = 0) -> bytes:
    """A plain batch with any records aiokafka can write (null values, repeated names)."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 2**31 - 1)
    for index, (delta, key, value, hdrs) in enumerate(records):
        builder.append(index, first + delta, key, value, hdrs)
    batch = bytearray(builder.build())
    record_batch.set_base_offset(batch, base_offset)
    if attributes:
        struct.pack_into(">h", batch, record_batch.ATTRIBUTES_AT, attributes)
        struct.pack_into(">I", batch, record_batch.CRC_AT, record_batch.compute_crc(batch))
    return bytes(batch)


class Segment:
    """What _decode asks of a segment when it reports damage."""

    log_path = Path("00000000000000000000.log")

    def find_position(self, offset: int, size: int) -> int:
        return 0

    size = 0


def run_decode(batch: bytes, start: int, end: int | None, limit: int, prefix: int,
               codec: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    """LogReader._decode with one codec: ("ok", events) or ("error", (class, reason))."""
    monkeypatch.setattr(record_batch, "_codec", codec)
    reader = LogReader(SimpleNamespace(partition=3, sealer=None))  # type: ignore[arg-type]
    header = record_batch.read_header(batch)
    out: list[Event] = [Event(9, 9, 9, None, {}, b"earlier")] * prefix
    try:
        reader._decode(Segment(), header, batch, start, end, out, limit)  # type: ignore[arg-type]
    except CorruptRecordError as exc:
        codec_error = exc.__cause__.__cause__ if exc.__cause__ else None  # via undecodable()
        return "error", (type(exc), exc.reason.split(":")[0], type(codec_error), exc.reason)
    return "ok", out


def same_on_both(batch: bytes, monkeypatch: pytest.MonkeyPatch, start: int = 0,
                 end: int | None = None, limit: int = 1 << 62, prefix: int = 0) -> tuple[str, Any]:
    compiled = run_decode(batch, start, end, limit, prefix, compiled_codec(), monkeypatch)
    python = run_decode(batch, start, end, limit, prefix, None, monkeypatch)
    if compiled[0] == "error":  # the same CorruptRecordError; the codecs' own errors may
        assert python[0] == "error" and compiled[1][:2] == python[1][:2]  # differ (a length
        return compiled  # of 2**62: aiokafka's MemoryError, the C codec's bounds check)
    assert compiled == python
    return compiled


@settings(max_examples=300, deadline=None, suppress_health_check=FIXTURE_OK)
@given(records_strategy, st.integers(0, 2**40), st.data())
def test_it_decodes_what_the_python_loop_decodes(batch_codec: ModuleType, records: list[RecordSpec],
                                                 base: int, data: st.DataObject) -> None:
    batch = make_batch(records, base)
    n = len(records)
    start = data.draw(st.integers(base - 2, base + n + 2))
    end = data.draw(st.one_of(st.none(), st.integers(base - 1, base + n + 2)))
    limit = data.draw(st.integers(0, n + 3))
    prefix = data.draw(st.integers(0, 3))
    with pytest.MonkeyPatch.context() as monkeypatch:
        outcome, got = same_on_both(batch, monkeypatch, start, end, limit, prefix)
        assert outcome == "ok"
        whole = same_on_both(batch, monkeypatch)[1]
    assert [e.offset for e in whole] == list(range(base, base + n))
    for event, (delta, key, value, hdrs) in zip(whole, records, strict=True):
        assert event == (3, event.offset, 1_700_000_000_000 + delta, key, dict(hdrs),
                         b"" if value is None else value)
        assert type(event) is Event


def test_a_repeated_header_name_keeps_its_last_value(batch_codec: ModuleType,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    batch = make_batch([(0, None, b"v", [("a", b"1"), ("b", None), ("a", b"2")])], 10)
    _, events = same_on_both(batch, monkeypatch)
    assert events == [(3, 10, 1_700_000_000_000, None, {"a": b"2", "b": None}, b"v")]


def test_a_negative_timestamp_reads_as_it_is(batch_codec: ModuleType,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _, events = same_on_both(make_batch([(0, None, b"v", [])], 0, first=-1), monkeypatch)
    assert events[0].timestamp == -1  # aiokafka 0.14 reads no None for -1


def test_log_append_time_gives_the_batchs_max_timestamp(batch_codec: ModuleType,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    batch = make_batch([(0, None, b"a", []), (50, None, b"b", [])], 0,
                       attributes=record_batch.TIMESTAMP_TYPE_MASK)
    _, events = same_on_both(batch, monkeypatch)
    assert [e.timestamp for e in events] == [1_700_000_000_050] * 2


# -- damaged records sections -------------------------------------------------------------
def with_records(batch: bytes, records: bytes) -> bytes:
    """The batch with another records section: its length and CRC made right for it."""
    damaged = bytearray(batch[:record_batch.HEADER_SIZE] + records)
    struct.pack_into(">i", damaged, 8, len(damaged) - record_batch.LOG_OVERHEAD)
    struct.pack_into(">I", damaged, record_batch.CRC_AT, record_batch.compute_crc(damaged))
    return bytes(damaged)


DAMAGE_RECORDS: list[RecordSpec] = [
    (0, None, b"first body", []),
    (3, b"key", None, [("name", b"value"), ("é", None), ("name", b"")]),
    (200, b"", b"x" * 300, [("h", b"v" * 70)]),
    (-7, None, b"last", [("a", b"b")]),
]


def test_every_truncation_of_the_records_fails_alike(batch_codec: ModuleType,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    batch = make_batch(DAMAGE_RECORDS, 1000)
    records = batch[record_batch.HEADER_SIZE:]
    outcomes = set()
    for cut in range(len(records)):
        damaged = with_records(batch, records[:cut])
        outcome, detail = same_on_both(damaged, monkeypatch)
        assert outcome == "error", cut
        outcomes.add(detail[2])
        for start, limit in ((1000, 1), (1002, 1 << 62), (1003, 1)):  # stopped early too
            same_on_both(damaged, monkeypatch, start=start, limit=limit)
    assert outcomes  # what the codec raised, for the message of a failure


@settings(max_examples=500, deadline=None, suppress_health_check=FIXTURE_OK)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, 4))
def test_flipped_bytes_in_the_records_give_the_same_outcome(
        batch_codec: ModuleType, flips: list[tuple[int, int]], start_delta: int) -> None:
    batch = make_batch(DAMAGE_RECORDS, 1000)
    records = bytearray(batch[record_batch.HEADER_SIZE:])
    for at, value in flips:
        records[at % len(records)] = value
    with pytest.MonkeyPatch.context() as monkeypatch:
        same_on_both(with_records(batch, bytes(records)), monkeypatch)
        same_on_both(with_records(batch, bytes(records)), monkeypatch,
                     start=1000 + start_delta, limit=2)


def varint(value: int) -> bytes:
    """Kafka's zig-zag varint."""
    z, out = (value << 1) ^ (value >> 63), bytearray()
    while z >= 0x80:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    return bytes(out + bytes([z]))


def record(fields: bytes, length: int | None = None) -> bytes:
    """A record: its length (of `fields`, unless given), then the fields."""
    return varint(len(fields) if length is None else length) + fields


HEAD = b"\x00\x00\x00" + varint(-1)  # attributes, timestamp delta, offset delta, null key


@pytest.mark.parametrize("records, cause", [
    (record(HEAD + varint(1) + b"a" + varint(1) + varint(2) + b"\xff\xfe" + varint(0)),
     UnicodeDecodeError),  # a header name that is not UTF-8
    (record(HEAD + b"\x82" * 11), CorruptRecordException),  # a varint of 11 bytes
    (b"\xff" * 10 + b"\x01", CorruptRecordException),  # the record's length, likewise
    (record(HEAD + varint(50) + b"v"), CorruptRecordException),  # a value past the end
    (record(HEAD + varint(1) + b"v" + varint(-2)), CorruptRecordException),  # header count
    (record(HEAD + varint(1) + b"v" + varint(0), length=30), CorruptRecordException),
    (record(HEAD + varint(1) + b"v" + varint(0)) + b"\x00", CorruptRecordException),  # extra
    (record(HEAD + varint(1) + b"v" + varint(1) + varint(-3)), CorruptRecordException),
], ids=["utf8", "long-varint", "long-length", "value-past-end", "header-count", "length",
        "bytes-left-over", "negative-name-length"])
def test_malformed_records_are_corrupt_on_both_paths(records: bytes, cause: type,
                                                     batch_codec: ModuleType,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    batch = with_records(make_batch([(0, None, b"v", [])], 0), records)
    outcome, (error, reason, raised, _) = same_on_both(batch, monkeypatch)
    assert (outcome, error, reason) == ("error", CorruptRecordError, "records do not decode")
    assert raised is cause  # the C codec's, as aiokafka raises it, in the same words:
    compiled = run_decode(batch, 0, None, 1 << 62, 0, compiled_codec(), monkeypatch)
    python = run_decode(batch, 0, None, 1 << 62, 0, None, monkeypatch)
    assert compiled[1][3] == python[1][3]


def test_a_record_count_beyond_the_records_is_corrupt(batch_codec: ModuleType,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    batch = bytearray(make_batch([(0, None, b"v", []), (0, None, b"w", [])], 0))
    for count in (1, 3, -1):  # fewer: bytes left over; more: reads past the end
        struct.pack_into(">i", batch, 57, count)
        struct.pack_into(">I", batch, record_batch.CRC_AT, record_batch.compute_crc(batch))
        assert same_on_both(bytes(batch), monkeypatch)[0] == "error"


# -- CRC-32C ------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 7, 8, 63, 767, 768, 769, 4096, 20_021, 200_003])
def test_its_crc32c_is_the_crc32c_packages(size: int, batch_codec: ModuleType) -> None:
    data = os.urandom(size + 8)
    for shift in range(8):  # every alignment
        view = memoryview(data)[shift:shift + size]
        expected = crc32c.crc32c(view)
        assert batch_codec.crc32c(view) == expected
        assert batch_codec.crc32c(view, True) == expected  # the code for CPUs without SSE4.2


def in_fresh_process(script: str | None, pure: str | None,
                     timeout: float) -> subprocess.CompletedProcess[str]:
    """`python -c script` (or `-m channel_engine --version` without one) in a fresh process
    whose WEIR_PURE_PYTHON_CODEC is `pure` (unset for None)."""
    env = {k: v for k, v in os.environ.items() if k != record_batch.PURE_PYTHON_VARIABLE}
    if pure is not None:
        env[record_batch.PURE_PYTHON_VARIABLE] = pure
    argv = ["-c", script] if script is not None else ["-m", "channel_engine", "--version"]
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


# -- choosing the codec -------------------------------------------------------------------
def codec_in_fresh_process(value: str | None) -> subprocess.CompletedProcess[str]:
    return in_fresh_process(None, value, timeout=60)


def test_the_variable_turns_the_compiled_codec_off_and_version_says_so(
        batch_codec: ModuleType) -> None:
    assert "codec: compiled (C, CRC-32C" in codec_in_fresh_process(None).stdout
    assert "codec: compiled (C, CRC-32C" in codec_in_fresh_process("0").stdout
    assert "codec: python (compiled codec turned off)" in codec_in_fresh_process("1").stdout


def test_a_bad_value_of_the_variable_fails_loudly() -> None:
    run = codec_in_fresh_process("yes")
    assert run.returncode != 0
    assert "ConfigError: WEIR_PURE_PYTHON_CODEC: must be 1" in run.stderr
    assert "not 'yes'" in run.stderr


def test_a_channel_in_processes_of_its_own_runs_on_the_pure_python_codec() -> None:
    """The fallback in a fresh process with the variable set, as a machine without a
    compiler runs it: a channel's put, take and read."""
    script = (
        "import sys, tempfile\n"
        "from channel_engine import Channel, PendingEvent\n"
        "from channel_engine.log import record_batch\n"
        "sys.path.insert(0, 'tests/engine')\n"
        "from channel_helpers import make_config\n"
        "assert record_batch._codec is None, record_batch.CODEC\n"
        "from pathlib import Path\n"
        "config = make_config(Path(tempfile.mkdtemp()), transaction_capacity=1000)\n"
        "owner = Channel.open(config)\n"
        "events = [PendingEvent(b'body %d' % i, None, {'n': str(i)}, 5) for i in range(300)]\n"
        "with owner.put() as tx:\n"
        "    tx.put_all(events)\n"
        "with owner.take() as tx:\n"
        "    taken = tx.take(120)\n"
        "assert [e.body for e in taken] == [e.body for e in events[:120]], taken[:2]\n"
        "assert taken[7].headers == {'n': b'7'}\n"
        "read = owner.read(0, 0, 300)\n"
        "assert [e.body for e in read] == [e.body for e in events]\n"
        "owner.close()\n"
        "print('ok')\n"
    )
    run = in_fresh_process(script, "1", timeout=120)
    assert run.stdout.strip() == "ok", run.stderr


@pytest.mark.parametrize("required", [None, "0", "1"])
def test_tests_needing_the_extension_skip_without_it_unless_it_is_required(
        required: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    import channel_engine.log
    monkeypatch.delattr(channel_engine.log, "_batch_codec", raising=False)
    monkeypatch.setitem(sys.modules, "channel_engine.log._batch_codec", None)  # not built
    monkeypatch.delenv(codec_helpers.REQUIRE_COMPILED_VARIABLE, raising=False)
    if required is not None:
        monkeypatch.setenv(codec_helpers.REQUIRE_COMPILED_VARIABLE, required)
    outcome = pytest.fail.Exception if required == "1" else pytest.skip.Exception
    with pytest.raises(outcome, match="the compiled record batch codec is not built"):
        compiled_codec()

"""record_batch: building Kafka v2 batches from events, and the checks that classify bytes."""
from __future__ import annotations

import resource
import struct
import time

import pytest

from channel_engine.errors import (
    BatchTooLargeError,
    ChannelEngineError,
    InvalidBatch,
    InvalidEventError,
)
from channel_engine.event import PendingEvent
from channel_engine.log import record_batch as rb

pytestmark = pytest.mark.usefixtures("each_codec")  # conftest.py: both codecs

EVENTS = [
    PendingEvent(b"first", key=None, headers=None, timestamp=1_700_000_000_000),
    PendingEvent(b"second", key=b"k2", headers={"src": b"seq", "n": b"\x00\x01"},
                 timestamp=1_700_000_000_005),
    PendingEvent(b"", key=b"", headers={}, timestamp=1_700_000_000_003),
    PendingEvent(b"\xff" * 300, key=b"\x00key", headers={"empty": b""},
                 timestamp=1_700_000_000_004),
]


def built(events=EVENTS, compression=0, base_offset=0):
    batch = rb.build(events, compression)
    rb.set_base_offset(batch, base_offset)
    return bytes(batch)


def decoded(batch):
    return [(o, ts, k, v, list(h)) for o, ts, k, v, h in rb.records(batch)]


def expected(events, base_offset=0):
    return [(base_offset + i, e.timestamp, e.key, e.body, list((e.headers or {}).items()))
            for i, e in enumerate(events)]


# -- round trips --------------------------------------------------------------------------


def test_it_round_trips_keys_headers_bodies_and_timestamps():
    batch = built()
    assert decoded(batch) == expected(EVENTS)


def test_it_builds_a_batch_that_passes_every_check():
    batch = built()
    header = rb.check_batch(batch, 0, len(batch), 0, verify_crc=True)
    assert header.size == len(batch)
    assert header.magic == rb.MAGIC
    assert header.record_count == len(EVENTS)
    assert header.last_offset_delta == len(EVENTS) - 1
    assert header.first_timestamp == EVENTS[0].timestamp
    assert header.max_timestamp == max(e.timestamp for e in EVENTS)
    assert header.codec == "none"
    assert header.attributes & rb.TIMESTAMP_TYPE_MASK == 0  # CreateTime
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert header.crc == rb.compute_crc(batch)
    assert rb.check_header(batch, 0, 0) == header
    rb.check_crc(batch, 0, header)


def test_it_reports_offsets_of_the_batch():
    header = rb.read_header(built(base_offset=40))
    assert header.base_offset == 40
    assert header.last_offset == 43
    assert header.next_offset == 44


def test_it_round_trips_a_single_event_with_an_empty_body():
    batch = built([PendingEvent(b"", timestamp=7)])
    assert decoded(batch) == [(0, 7, None, b"", [])]


def test_it_stamps_events_without_a_timestamp_with_the_current_time():
    before = int(time.time() * 1000)
    batch = built([PendingEvent(b"a"), PendingEvent(b"b", timestamp=5), PendingEvent(b"c")])
    after = int(time.time() * 1000)
    stamps = [ts for _, ts, _, _, _ in rb.records(batch)]
    assert before <= stamps[0] <= after
    assert stamps[1] == 5
    assert stamps[2] == stamps[0]


def test_it_accepts_a_bytearray_body():
    batch = built([PendingEvent(bytearray(b"xyz"), timestamp=1)])
    assert decoded(batch) == [(0, 1, None, b"xyz", [])]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_it_round_trips_every_compression_codec(codec):
    events = EVENTS + [PendingEvent(b"abc" * 2000, key=b"k", headers={"h": b"v"}, timestamp=9)]
    batch = built(events, rb.COMPRESSION_CODECS[codec], base_offset=1000)
    header = rb.check_batch(batch, 0, len(batch), 1000, verify_crc=True)
    assert header.codec == codec
    assert header.attributes & rb.CODEC_MASK == rb.COMPRESSION_CODECS[codec]
    assert decoded(batch) == expected(events, base_offset=1000)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_it_really_compresses_with_each_codec(codec):
    events = [PendingEvent(b"abcdefgh" * 1000, timestamp=1)]
    plain = built(events)
    compressed = built(events, rb.COMPRESSION_CODECS[codec])
    assert len(compressed) < len(plain) // 4


def test_it_keeps_the_crc_valid_when_the_base_offset_is_set():
    batch = rb.build(EVENTS)
    crc = rb.read_header(batch).crc
    rb.set_base_offset(batch, 123_456_789_012)
    header = rb.check_batch(batch, 0, len(batch), 123_456_789_012, verify_crc=True)
    assert header.crc == crc
    assert [o for o, *_ in rb.records(bytes(batch))] == [123_456_789_012 + i for i in range(4)]


# -- invalid input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "events, index, field",
    [
        ([PendingEvent(b"ok"), PendingEvent(None)], 1, "body"),
        ([PendingEvent("text")], 0, "body"),
        ([PendingEvent(5)], 0, "body"),
        ([PendingEvent(b"a"), PendingEvent(b"b"), PendingEvent(b"c", key="k")], 2, "key"),
        ([PendingEvent(b"a", headers={"h": 5})], 0, "headers.h"),
        ([PendingEvent(b"a", headers={"h": "\udcff"})], 0, "headers.h"),
        ([PendingEvent(b"a", headers={b"h": b"v"})], 0, "headers"),
        ([PendingEvent(b"a", headers=[("h", b"v")])], 0, "headers"),
        ([PendingEvent(b"a", timestamp=-1)], 0, "timestamp"),
        ([PendingEvent(b"a"), PendingEvent(b"b", timestamp=1.5)], 1, "timestamp"),
        ([PendingEvent(b"a", timestamp=True)], 0, "timestamp"),
        ([PendingEvent(b"a", timestamp="1")], 0, "timestamp"),
        ([(b"not a PendingEvent",)], 0, "event"),
        ([], 0, "events"),
    ],
    ids=["body-None", "body-str", "body-int", "key-str", "header-value-int",
         "header-value-not-utf8",
         "header-name-bytes", "headers-not-mapping", "timestamp-negative", "timestamp-float",
         "timestamp-bool", "timestamp-str", "not-an-event", "empty-list"],
)
def test_it_refuses_invalid_input_naming_the_event_and_field(events, index, field):
    with pytest.raises(InvalidEventError) as info:
        rb.build(events)
    assert info.value.index == index
    assert info.value.field == field
    assert f"event {index}: {field}:" in str(info.value)


def test_it_refuses_a_timestamp_beyond_int64_as_invalid_input():
    with pytest.raises(InvalidEventError) as info:
        rb.build([PendingEvent(b"a", timestamp=2**63)])
    assert (info.value.index, info.value.field) == (0, "timestamp")


def released_view() -> memoryview:
    view = memoryview(b"gone")
    view.release()
    return view


STRIDED = memoryview(b"abcdef")[::2]  # not C-contiguous: its buffer cannot be copied as is


@pytest.mark.parametrize("event, field", [
    (PendingEvent(STRIDED), "body"),
    (PendingEvent(b"a", key=STRIDED), "key"),
    (PendingEvent(released_view()), "body"),
    (PendingEvent(b"a", key=released_view()), "key"),
    (PendingEvent(b"a", headers={"h": released_view()}), "headers.h"),
], ids=["strided-body", "strided-key", "released-body", "released-key", "released-header"])
def test_it_refuses_a_memoryview_it_cannot_copy_naming_the_field(event, field):
    with pytest.raises(InvalidEventError) as info:
        rb.build([PendingEvent(b"ok"), event])
    assert (info.value.index, info.value.field) == (1, field)
    assert "memoryview" in info.value.reason


def test_it_copies_a_strided_memoryview_header_value():
    batch = bytes(rb.build([PendingEvent(b"a", headers={"h": STRIDED})]))
    assert list(rb.records(batch))[0][4] == [("h", b"ace")]


@pytest.mark.parametrize("transaction_id", [2**63, -1, 1.0, "1", True])
def test_it_refuses_a_transaction_id_outside_a_producer_id_naming_it(transaction_id):
    with pytest.raises(InvalidEventError) as info:
        rb.build([PendingEvent(b"a")], 0, transaction_id)
    assert info.value.field == "transaction_id"


def test_it_takes_the_largest_producer_id():
    batch = rb.build([PendingEvent(b"a")], 0, 2**63 - 1)
    assert rb.read_header(batch).transaction_id == 2**63 - 1


def test_it_refuses_records_past_the_batch_limit_instead_of_dropping_them(monkeypatch):
    """aiokafka's builder returns None for a record past its maximum: the record would be
    lost from a batch that says nothing of it."""
    monkeypatch.setattr(rb, "_MAX_BATCH", 400)
    events = [PendingEvent(b"x" * 150, timestamp=1) for _ in range(3)]
    with pytest.raises(BatchTooLargeError) as info:
        rb.build_python(events, 0, None, 1)
    assert (info.value.setting, info.value.limit) == ("max_batch_bytes", 400)
    assert info.value.size > 400
    assert len(rb.build_python(events[:2], 0, None, 1)) < 400


# -- classifying bytes --------------------------------------------------------------------


def test_it_classifies_zeros_as_a_zero_tail():
    buf = bytes(4096)
    with pytest.raises(InvalidBatch) as info:
        rb.check_batch(buf, 0, len(buf), 0, verify_crc=True)
    assert info.value.kind == "zero_tail"


def test_it_classifies_zeros_after_a_valid_batch_as_a_zero_tail():
    batch = built()
    buf = batch + bytes(100)
    assert rb.check_batch(buf, 0, len(buf), 0, True).size == len(batch)
    with pytest.raises(InvalidBatch) as info:
        rb.check_batch(buf, len(batch), len(buf), 4, True)
    assert info.value.kind == "zero_tail"


def test_it_classifies_a_few_zero_bytes_as_a_zero_tail():
    with pytest.raises(InvalidBatch) as info:
        rb.check_batch(bytes(5), 0, 5, 0, True)
    assert info.value.kind == "zero_tail"


@pytest.mark.parametrize("cut", [3, 11, 30, 60, 61, -1])
def test_it_classifies_a_truncated_batch_as_partial(cut):
    base = 2**40 + 1  # non-zero from byte 2 on: a torn header is not mistaken for zeros
    buf = built(base_offset=base)[:cut]
    with pytest.raises(InvalidBatch) as info:
        rb.check_batch(buf, 0, len(buf), base, verify_crc=True)
    assert info.value.kind == "partial"


def test_it_classifies_a_batch_running_past_the_limit_as_partial():
    batch = built() + built(base_offset=4)
    first = rb.read_header(batch).size
    with pytest.raises(InvalidBatch) as info:
        rb.check_batch(batch, first, len(batch) - 1, 4, verify_crc=False)
    assert info.value.kind == "partial"


@pytest.mark.parametrize("where", [rb.CRC_START, 40, 61, -1])
def test_it_classifies_a_flipped_byte_under_the_crc_as_corrupt(where):
    buf = bytearray(built())
    buf[where] ^= 0x01
    with pytest.raises(InvalidBatch) as info:
        rb.check_batch(buf, 0, len(buf), 0, verify_crc=True)
    assert info.value.kind == "corrupt"
    assert "CRC" in info.value.reason


def test_it_skips_the_crc_when_told_to():
    buf = bytearray(built())
    buf[-1] ^= 0x01
    assert rb.check_batch(buf, 0, len(buf), 0, verify_crc=False).record_count == 4
    with pytest.raises(InvalidBatch, match="CRC"):
        rb.check_crc(buf, 0, rb.read_header(buf))


def test_it_classifies_a_bad_magic_as_corrupt():
    buf = bytearray(built())
    buf[16] = 1
    with pytest.raises(InvalidBatch) as info:
        rb.check_batch(buf, 0, len(buf), 0, verify_crc=True)
    assert info.value.kind == "corrupt"
    assert "magic 1" in info.value.reason


def test_it_classifies_a_wrong_base_offset_as_corrupt():
    buf = built(base_offset=10)
    with pytest.raises(InvalidBatch) as info:
        rb.check_batch(buf, 0, len(buf), 11, verify_crc=True)
    assert info.value.kind == "corrupt"
    assert "base offset 10, expected 11" in info.value.reason
    assert rb.check_batch(buf, 0, len(buf), None, verify_crc=True).base_offset == 10


def test_it_classifies_a_too_small_batch_length_as_corrupt():
    buf = bytearray(built())
    struct.pack_into(">i", buf, 8, rb.MIN_BATCH_LENGTH - 1)
    with pytest.raises(InvalidBatch) as info:
        rb.check_header(buf, 0, 0)
    assert info.value.kind == "corrupt"


def test_it_classifies_a_record_count_disagreeing_with_the_last_offset_delta_as_corrupt():
    buf = bytearray(built())
    struct.pack_into(">i", buf, 57, 3)  # recordCount 3, lastOffsetDelta still 3
    with pytest.raises(InvalidBatch) as info:
        rb.check_header(buf, 0, 0)
    assert info.value.kind == "corrupt"


def test_it_checks_a_batch_at_a_position_inside_a_buffer():
    first, second = built(), built(base_offset=4)
    buf = first + second
    header = rb.check_batch(buf, len(first), len(buf), 4, verify_crc=True)
    assert header.base_offset == 4
    assert header.size == len(second)


def test_it_raises_invalid_batch_when_records_do_not_decode():
    buf = bytearray(built([PendingEvent(b"abc", timestamp=1)]))
    buf[rb.HEADER_SIZE] = 0x7F  # record length varint now claims more bytes than there are
    struct.pack_into(">I", buf, 17, rb.compute_crc(buf))
    rb.check_batch(buf, 0, len(buf), 0, verify_crc=True)  # the header and CRC are fine
    with pytest.raises(InvalidBatch) as info:
        list(rb.records(bytes(buf)))
    assert info.value.kind == "corrupt"


# -- records behind a valid CRC that do not decode ----------------------------------------


def restamped(batch: bytearray) -> bytes:
    """The batch with its length and CRC made to match its (damaged) bytes again."""
    struct.pack_into(">i", batch, 8, len(batch) - rb.LOG_OVERHEAD)
    struct.pack_into(">I", batch, 17, rb.compute_crc(batch))
    return bytes(batch)


def damaged_records(codec: str, how: str) -> bytes:
    batch = rb.build(EVENTS, rb.COMPRESSION_CODECS[codec])
    if how == "flip":
        batch[len(batch) - 6] ^= 0x40  # in the compressed stream or its checksum
    elif how == "cut":
        del batch[rb.HEADER_SIZE + 7:]
    elif how == "unknown-codec":
        batch[rb.ATTRIBUTES_AT + 1] = (batch[rb.ATTRIBUTES_AT + 1] & ~rb.CODEC_MASK) | 5
    elif how == "header-key-not-utf8":
        at = bytes(batch).index(b"src")
        batch[at:at + 3] = b"\xff\xfe\xfd"
    return restamped(batch)


@pytest.mark.parametrize(("codec", "how"), [
    ("gzip", "flip"), ("gzip", "cut"), ("snappy", "cut"), ("lz4", "flip"), ("zstd", "flip"),
    ("none", "unknown-codec"), ("none", "header-key-not-utf8"), ("none", "cut")])
def test_records_that_do_not_decode_raise_invalid_batch_whatever_the_codec_says(
        codec: str, how: str) -> None:
    batch = damaged_records(codec, how)
    for decode in (lambda b: list(rb.records(b)), rb.record_columns):
        with pytest.raises(InvalidBatch, match="records do not decode") as info:
            decode(batch)
        assert isinstance(info.value, ChannelEngineError)


def test_records_of_a_cut_header_raise_invalid_batch() -> None:
    for decode in (lambda b: list(rb.records(b)), rb.record_columns,
                   lambda b: rb.unseal(b, None)):
        with pytest.raises(InvalidBatch, match="too few for a batch header"):
            decode(b"\x00" * 20)


def claiming_gigabytes(codec: str) -> bytes:
    """A compressed batch whose codec header claims a decompressed size of gigabytes."""
    batch = rb.build(EVENTS * 20, rb.COMPRESSION_CODECS[codec])
    start = rb.HEADER_SIZE
    if codec == "snappy":  # xerial framing: 16-byte header, chunk length, varint raw length
        varint_at = start + 20
        used = next(i for i in range(varint_at, len(batch)) if batch[i] < 0x80) + 1 - varint_at
        batch[varint_at:varint_at + used] = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F])
        chunk = struct.unpack_from(">i", batch, start + 16)[0]
        struct.pack_into(">i", batch, start + 16, chunk + 5 - used)
    else:  # zstd: frame header descriptor with an 8-byte frame content size
        assert batch[start + 4] >> 6 != 3
        size_bytes = {0: 0, 1: 2, 2: 4}[batch[start + 4] >> 6]
        if size_bytes == 0 and batch[start + 4] & 0x20:
            size_bytes = 1
        batch[start + 4:start + 5 + size_bytes] = bytes([0xE0]) + struct.pack("<Q", 3 << 30)
    return restamped(batch)


@pytest.mark.parametrize("codec", ["snappy", "zstd"])
def test_a_codec_header_claiming_gigabytes_is_refused_without_allocating_them(
        codec: str) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InvalidBatch, match="records do not decode"):
        list(rb.records(claiming_gigabytes(codec)))
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 256 * 1024


# -- opening a sealed batch for a reader without the key ---------------------------------

def test_open_batch_gives_a_sealed_batch_back_as_a_plain_one_with_its_own_crc(
        tmp_path) -> None:
    from channel_engine.encryption import BatchSealer, KeyRing

    KeyRing.write_new(tmp_path / "keys.json", ["k1"])
    sealer = BatchSealer(KeyRing.load(tmp_path / "keys.json", "k1"), "ch", 0)
    plain = built(base_offset=40)
    sealed = bytes(rb.seal(bytearray(plain), sealer))
    opened = rb.open_batch(sealed, sealer)
    header = rb.check_batch(opened, 0, len(opened), 40, True)  # the CRC checks
    assert not header.attributes & rb.ENCRYPTED_MASK and len(opened) == header.size
    assert decoded(opened) == expected(EVENTS, 40)
    assert opened == plain  # the very batch that was sealed
    assert rb.open_batch(plain, sealer) is plain  # a plain batch as it is

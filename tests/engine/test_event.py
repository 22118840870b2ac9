"""Events (event.py): Flume's header values — str stored as UTF-8, None stored as b"" —
are accepted by every put path, and reads return bytes whatever the put gave."""
from __future__ import annotations

from pathlib import Path

import pytest
from channel_helpers import make_config

from channel_engine import Channel, InvalidEventError, PendingEvent
from channel_engine.event import header_value, make_event
from channel_engine.log import record_batch
from channel_engine.queue.put_batch import Partitioner, encode

GIVEN = {"bytes": b"\x00raw", "text": "caf\u00e9", "null": None, "empty": "",
         "array": bytearray(b"arr"), "view": memoryview(b"mem")}
STORED = {"bytes": b"\x00raw", "text": "caf\u00e9".encode(), "null": b"", "empty": b"",
          "array": b"arr", "view": b"mem"}


def test_it_stores_str_as_utf8_and_none_as_empty_bytes() -> None:
    for name, value in GIVEN.items():
        stored = header_value(0, name, value)
        assert type(stored) is bytes and stored == STORED[name]


def test_it_refuses_other_header_value_types_naming_the_header() -> None:
    for bad in (5, 1.5, ["v"], {"v": b""}, "\udcff"):
        with pytest.raises(InvalidEventError) as info:
            make_event(3, b"body", headers={"h": bad})
        assert (info.value.index, info.value.field) == (3, "headers.h")


def test_make_event_refuses_a_body_or_key_memoryview_that_cannot_be_copied() -> None:
    strided = memoryview(b"abcdef")[::2]
    released = memoryview(b"gone")
    released.release()
    for fields, field in (((strided,), "body"), ((b"b", strided), "key"),
                          ((released,), "body"), ((b"b", released), "key")):
        with pytest.raises(InvalidEventError) as info:
            make_event(4, *fields)
        assert (info.value.index, info.value.field) == (4, field)
    with pytest.raises(InvalidEventError) as info:
        make_event(4, b"b", headers={"h": released})
    assert (info.value.index, info.value.field) == (4, "headers.h")
    assert make_event(0, memoryview(b"whole")).body == b"whole"  # a contiguous view is fine


def test_make_event_hands_on_headers_as_bytes() -> None:
    event = make_event(0, b"body", headers=GIVEN)
    assert event.headers == STORED
    assert all(type(value) is bytes for value in event.headers.values())


def test_a_batch_built_from_str_and_none_headers_reads_back_bytes() -> None:
    batch = bytes(record_batch.build([PendingEvent(b"body", headers=GIVEN, timestamp=7)]))
    [(_, _, _, value, headers)] = list(record_batch.records(batch))
    assert value == b"body" and dict(headers) == STORED


def test_encode_accepts_str_and_none_header_values_in_a_multi_partition_put() -> None:
    events = [PendingEvent(b"a", key=b"one", headers={"h": "x"}),
              PendingEvent(b"b", key=b"two", headers={"h": None})]
    put = encode(events, Partitioner(), 4, "none")
    read = [headers for _, batch in put.batches
            for *_, headers in record_batch.records(bytes(batch))]
    assert sorted(dict(h)["h"] for h in read) == [b"", b"x"]


@pytest.mark.parametrize("path", ["put", "put_all"])
def test_it_round_trips_flume_headers_through_a_channel_as_bytes(tmp_path: Path,
                                                                  path: str) -> None:
    with Channel.open(make_config(tmp_path, partitions=2)) as channel:
        with channel.put() as tx:
            if path == "put":
                tx.put(b"plain", headers=GIVEN)
                tx.put(b"keyed", key=b"k", headers={"only": None})
            else:
                tx.put_all([PendingEvent(b"plain", headers=GIVEN),
                            PendingEvent(b"keyed", key=b"k", headers={"only": None})])
        with channel.take() as take:
            events = {event.body: event for event in take.take(10)}
        assert events[b"plain"].headers == STORED
        assert events[b"keyed"].headers == {"only": b""}
        for event in events.values():
            assert all(type(value) is bytes for value in event.headers.values())

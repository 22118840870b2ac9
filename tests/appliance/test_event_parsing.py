"""Produce bodies: Weir's JSON, NDJSON and Flume's HTTP source JSON; every mistake named by
event index and field."""
from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.event_parsing import MAX_TIMESTAMP, EventError, parse
from channel_engine import PendingEvent


def test_weir_json_with_every_field() -> None:
    body = (b'{"events": [{"body": "hi", "key": "k", "headers": {"h": "v"}, "timestamp": 5},'
            b' {"body_base64": "' + base64.b64encode(b"\x00\xff") + b'"}]}')
    assert parse(body, "application/json; charset=utf-8") == [
        PendingEvent(b"hi", b"k", {"h": b"v"}, 5), PendingEvent(b"\x00\xff", None, None, None)]


def test_flume_http_source_json() -> None:
    body = b'[{"headers": {"timestamp": "1", "host": "web1"}, "body": "line one"}]'
    assert parse(body, "application/json") == [
        PendingEvent(b"line one", None, {"timestamp": b"1", "host": b"web1"}, 1)]


@pytest.mark.parametrize(("event", "time"), [
    (b'{"body": "x", "headers": {"timestamp": "1764000000000"}}', 1_764_000_000_000),
    (b'{"body": "x", "headers": {"timestamp": "1764000000000"}, "timestamp": 7}', 7),
    (b'{"body": "x", "headers": {"Timestamp": "12"}}', None),  # another header
    (b'{"body": "x", "headers": {"timestamp": "253402300799999"}}', MAX_TIMESTAMP),
])
def test_flumes_timestamp_header_is_the_time_of_an_event_without_one(event: bytes,
                                                                     time: int | None) -> None:
    """Flume's TimestampInterceptor stamps events so; its HDFS sink buckets by the header."""
    [parsed] = parse(event, "application/x-ndjson")
    assert parsed.timestamp == time and parsed.headers is not None


@pytest.mark.parametrize("value", ['""', "null", '"soon"', '"-5"', '"1.5"', '" 12"',
                                   '"253402300800000"', '"' + "1" * 40 + '"', '"١٢"'])
def test_a_timestamp_header_that_is_not_flumes_millis_is_a_header_only(value: str) -> None:
    """Flume's HTTP source takes any header value; only Flume's milliseconds mean a time."""
    body = b'{"body": "x", "headers": {"timestamp": ' + value.encode() + b"}}"
    [parsed] = parse(body, "application/x-ndjson")
    assert parsed.timestamp is None and "timestamp" in (parsed.headers or {})


@pytest.mark.parametrize("content_type, body", [
    ("application/json", b'{"events": [{"body": "x", "headers": {"h": null, "g": "v"}}]}'),
    ("application/json", b'[{"headers": {"h": null, "g": "v"}, "body": "x"}]'),
    ("application/x-ndjson", b'{"body": "x", "headers": {"h": null, "g": "v"}}\n'),
], ids=["weir-json", "flume-json", "ndjson"])
def test_a_null_header_value_is_stored_as_empty_as_flume_does(content_type: str,
                                                              body: bytes) -> None:
    assert parse(body, content_type) == [PendingEvent(b"x", None, {"h": b"", "g": b"v"}, None)]


def test_ndjson_skips_blank_lines() -> None:
    body = b'{"body": "a"}\n\n{"body": "b", "key": "k"}\n'
    assert [e.body for e in parse(body, "application/x-ndjson")] == [b"a", b"b"]


@pytest.mark.parametrize(("body", "index", "field"), [
    (b'{"events": [{"body": "ok"}, {"body": 5}]}', 1, "body"),
    (b'{"events": [{"key": "k"}]}', 0, "body"),
    (b'{"events": [{"body": "x", "body_base64": "eA=="}]}', 0, "body"),
    (b'{"events": [{"body_base64": "***"}]}', 0, "body_base64"),
    (b'{"events": [{"body": "x", "key": 7}]}', 0, "key"),
    (b'{"events": [{"body": "x", "headers": {"h": 1}}]}', 0, "headers.h"),
    (b'{"events": [{"body": "x", "headers": ["h"]}]}', 0, "headers"),
    (b'{"events": [{"body": "x"}, {"body": "x", "headers": {"%s": "v"}}]}' % (b"h" * 1025), 1,
     "headers"),
    (b'{"events": [{"body": "x", "headers": {%s}}]}'
     % b",".join(b'"h%d": ""' % i for i in range(1001)), 0, "headers"),
    (b'{"events": [{"body": "x", "timestamp": -1}]}', 0, "timestamp"),
    (b'{"events": [{"body": "x", "timestamp": 1.5}]}', 0, "timestamp"),
    (b'{"events": [{"body": "x"}, {"body": "x", "timestamp": 253402300800000}]}', 1,
     "timestamp"),
    (b'{"events": [{"body": "x", "timestamp": 9223372036854775807}]}', 0, "timestamp"),
    (b'{"events": [{"body": "x", "colour": "red"}]}', 0, "colour"),
    (b'{"events": ["x"]}', 0, "event"),
    (b'{"events": []}', None, "events"),
    (b'{"events": {}}', None, "events"),
    (b'{"evens": []}', None, "evens"),
    (b'"text"', None, "events"),
    (b'{"events": [', None, "json"),
])
def test_mistakes_name_the_event_and_field(body: bytes, index: int | None, field: str) -> None:
    with pytest.raises(EventError) as info:
        parse(body, "application/json")
    assert (info.value.index, info.value.field) == (index, field)
    assert info.value.field == field


def test_a_bad_ndjson_line_is_named() -> None:
    with pytest.raises(EventError) as info:
        parse(b'{"body": "a"}\n{oops\n', "application/x-ndjson")
    assert (info.value.index, info.value.field) == (1, "json")


def test_other_content_types_are_refused() -> None:
    with pytest.raises(EventError, match="not supported"):
        parse(b"body", "text/plain")


def test_it_accepts_every_timestamp_a_date_can_show() -> None:
    body = b'{"events": [{"body": "x", "timestamp": 0}, {"body": "x", "timestamp": %d}]}' \
        % MAX_TIMESTAMP
    assert [e.timestamp for e in parse(body, "application/json")] == [0, MAX_TIMESTAMP]
    assert MAX_TIMESTAMP == 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, as documented


def both_readings(body: bytes, kind: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """parse()'s answer (its events, or its error's index, field and reason) with the
    compiled codec, then without it."""
    from channel_engine.log import record_batch

    answers: list[Any] = []
    for codec in (record_batch._codec, None):
        monkeypatch.setattr(record_batch, "_codec", codec)
        try:
            answers.append(parse(body, kind))
        except EventError as exc:
            answers.append((exc.index, exc.field, exc.reason))
    return answers


@pytest.mark.parametrize("body", [
    b'{"events": [{"body": "a"}, {"body": "\\u00e9\\ud83d\\ude00"}, {"body": ""}]}',
    b'[{"body": "flume"}, {"body": "two"}]',
    b'{"body": "one"}\n{"body": "two"}\n',
    b'{"events": [{"body": "a"}, {"body": "b", "key": "k"}]}',  # mixed: read one by one
    b'{"events": [{"body": "a"}, {"body": 5}]}',  # a mistake, named the same either way
])
def test_the_compiled_reading_of_text_events_parses_as_python_does(
        body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Events that are all {"body": "text"} are built in one pass by the compiled codec
    (record_batch.events_from_texts); without it, one by one: the same events, the same
    errors."""
    kind = "application/x-ndjson" if body.count(b"\n") > 1 else "application/json"
    answers = both_readings(body, kind, monkeypatch)
    assert answers[0] == answers[1]
    if body.startswith(b'{"events": [{"body": "a"}, {"body": "\\u00e9'):
        assert answers[0][1] == PendingEvent("é😀".encode())


json_events = st.one_of(
    st.builds(lambda text: {"body": text}, st.text(max_size=20)),
    st.builds(lambda text: {"body": text}, st.text(max_size=20)),
    st.builds(lambda text, key: {"body": text, "key": key}, st.text(max_size=5),
              st.one_of(st.none(), st.text(max_size=5), st.integers())),
    st.builds(lambda value: {"body": value}, st.one_of(st.none(), st.integers(),
                                                        st.lists(st.text(max_size=3)))),
    st.builds(lambda text: {"body_base64": text}, st.sampled_from(["", "eA==", "!"])),
    st.builds(lambda name: {name: "x"}, st.sampled_from(["Body", "body ", "bod", "headers"])),
    st.just({}), st.just("body"), st.just(None), st.just([{"body": "x"}]))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # same each example
@given(events=st.lists(json_events, max_size=10), shape=st.sampled_from(["weir", "flume",
                                                                          "ndjson"]))
def test_both_readings_agree_on_any_body(events: list[Any], shape: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated bodies of Weir's JSON, Flume's and NDJSON: the same events or the same
    error with the compiled codec (events_from_texts first) and without it."""
    if shape == "ndjson":
        body, kind = b"\n".join(json.dumps(e).encode() for e in events), "application/x-ndjson"
    else:
        document: Any = {"events": events} if shape == "weir" else events
        body, kind = json.dumps(document).encode(), "application/json"
    answers = both_readings(body, kind, monkeypatch)
    assert answers[0] == answers[1]

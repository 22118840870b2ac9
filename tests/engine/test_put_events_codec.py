"""A put's events in C (_batch_codec.plain_events, events_from_texts) against the pure
Python path.

record_batch.check_events takes a put's events as they are when the compiled codec says
they are plain, and otherwise checks them one by one; without the codec, type sets decide.
Both must accept the same events and refuse the same ones with the same InvalidEventError.
events_from_texts builds the PendingEvents of a JSON produce request whose every event is
exactly {"body": text}, and declines (None) anything else, which the appliance then reads
one by one: what it builds must be what that reading builds. The compiled codec is
imported directly (codec_helpers.py), so these tests also run under
WEIR_PURE_PYTHON_CODEC=1.
"""
from __future__ import annotations

import collections
import gc
import sys
from types import ModuleType
from typing import Any

import pytest
from codec_helpers import compiled_codec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from channel_engine.errors import InvalidEventError
from channel_engine.event import PendingEvent
from channel_engine.log import record_batch

FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@pytest.fixture(name="batch_codec")
def _batch_codec() -> ModuleType:
    return compiled_codec()


class Bytes(bytes):
    pass


class Text(str):
    pass


class Dict(dict):  # type: ignore[type-arg]
    pass


# fields of every type a caller might hand over, plain or not
field_values = st.one_of(
    st.none(), st.binary(max_size=8), st.binary(max_size=8).map(bytearray),
    st.binary(max_size=8).map(memoryview), st.binary(max_size=8).map(Bytes),
    st.text(max_size=8), st.integers(-1, 5), st.just({}), st.just({"h": b"v"}),
    st.just({"h": None}), st.just({1: b"v"}))
pending = st.builds(PendingEvent, field_values, field_values, field_values, field_values)
plain = st.builds(PendingEvent, st.binary(max_size=8), st.one_of(st.none(), st.binary(max_size=8)))
not_pending = st.one_of(
    st.tuples(st.binary(max_size=4), st.none(), st.none(), st.none()),
    st.lists(st.none(), min_size=4, max_size=4), st.none(), st.binary(max_size=4),
    st.just(tuple.__new__(PendingEvent, (b"x", None))),  # a PendingEvent of two fields
    st.just(tuple.__new__(PendingEvent, (b"x", None, None, None, None))))
# a plain event with exactly one field made something else: what a check must still see
one_field_off = st.builds(lambda event, field, value: event._replace(
    **{PendingEvent._fields[field]: value}), plain, st.integers(0, 3), field_values)
put_events = st.lists(st.one_of(plain, plain, one_field_off, pending, not_pending),
                      max_size=8)
containers = st.sampled_from([list, tuple, collections.deque])


def outcome(events: Any) -> Any:
    """check_events' answer: the events it took, or its error, field for field."""
    try:
        return ("ok", record_batch.check_events(3, events))
    except InvalidEventError as exc:
        return ("error", exc.index, exc.field, exc.reason)
    except TypeError as exc:  # not four fields to unpack: make_event's own TypeError
        return ("type error", str(exc))


@settings(max_examples=400, deadline=None, suppress_health_check=FIXTURE_OK)
@given(events=put_events, container=containers)
def test_check_events_answers_as_the_python_path(batch_codec: ModuleType,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 events: list[Any], container: type) -> None:
    answers = []
    for codec in (batch_codec, None):
        monkeypatch.setattr(record_batch, "_codec", codec)
        answers.append(outcome(container(events)))
    assert answers[0] == answers[1]


@settings(max_examples=300, deadline=None, suppress_health_check=FIXTURE_OK)
@given(events=st.lists(st.one_of(plain, one_field_off, pending, not_pending), max_size=8),
       container=containers)
def test_plain_events_is_true_exactly_for_plain_pending_events(batch_codec: ModuleType,
                                                               events: list[Any],
                                                               container: type) -> None:
    def is_plain(event: Any) -> bool:
        return (type(event) is PendingEvent and len(event) == 4 and type(event[0]) is bytes
                and (event[1] is None or type(event[1]) is bytes)
                and event[2] is None and event[3] is None)

    expected = container in (list, tuple) and all(map(is_plain, events))
    assert batch_codec.plain_events(container(events)) is expected


def test_plain_events_are_taken_as_they_are_and_bad_ones_named(batch_codec: ModuleType
                                                              ) -> None:
    good = [PendingEvent(b"a"), PendingEvent(b"b", b"k")]
    assert batch_codec.plain_events(good) is True
    taken = record_batch.check_events(0, good)
    assert taken == good and taken is not good and taken[0] is good[0]
    for field, value in (("body", "text"), ("body", Bytes(b"sub")), ("key", "k"),
                         ("key", Bytes(b"sub")), ("headers", {}), ("timestamp", 5)):
        odd = PendingEvent(b"x")._replace(**{field: value})
        assert batch_codec.plain_events([*good, odd]) is False, (field, value)
    with pytest.raises(InvalidEventError) as raised:
        record_batch.check_events(10, [*good, PendingEvent("text")])  # type: ignore[arg-type]
    assert (raised.value.index, raised.value.field) == (12, "body")
    with pytest.raises(InvalidEventError) as raised:
        record_batch.check_events(0, [*good, PendingEvent(b"x", timestamp=-1)])
    assert (raised.value.index, raised.value.field) == (2, "timestamp")


def test_what_check_events_checked_is_what_it_returns() -> None:
    """It checks a copy and returns that copy: the caller's list may change meanwhile."""
    events = [PendingEvent(b"a"), PendingEvent(b"b")]
    taken = record_batch.check_events(0, events)
    events[1] = PendingEvent("not bytes")  # type: ignore[arg-type]
    assert taken == [PendingEvent(b"a"), PendingEvent(b"b")]
    queue = collections.deque(taken)
    assert record_batch.check_events(0, queue) == taken


# -- events_from_texts ----------------------------------------------------------------------
texts = st.one_of(st.text(max_size=30), st.sampled_from(["", "é", "\U0001F600", "a\x00b"]))
text_events = st.builds(lambda text: {"body": text}, texts)
other_objects = st.one_of(
    st.builds(lambda text: {"body": text, "key": "k"}, texts),
    st.builds(lambda text: {"body_base64": text}, texts),
    st.builds(lambda text: {"Body": text}, texts),
    st.builds(lambda text: {"body": Text(text)}, texts),
    st.builds(lambda text: Dict(body=text), texts),
    st.builds(lambda text: {Text("body"): text}, texts),
    st.just({"body": "\ud800"}),  # a lone surrogate: str.encode() refuses it
    st.just({"body": None}), st.just({"body": b"bytes"}), st.just({}), st.just("body"),
    st.just(["body"]), st.none(), st.integers())


def python_events(objects: list[Any]) -> list[PendingEvent] | None:
    """What events_from_texts must build: None unless every object is exactly {"body": str}
    whose str encodes."""
    events = []
    for obj in objects:
        if type(obj) is not dict or list(map(type, obj)) != [str] or list(obj) != ["body"] \
                or type(obj["body"]) is not str:
            return None
        try:
            events.append(PendingEvent(obj["body"].encode()))
        except UnicodeEncodeError:
            return None
    return events


@settings(max_examples=400, deadline=None, suppress_health_check=FIXTURE_OK)
@given(objects=st.lists(st.one_of(text_events, text_events, text_events, other_objects),
                       max_size=12))
def test_events_from_texts_builds_what_python_builds(batch_codec: ModuleType,
                                                     objects: list[Any]) -> None:
    built = batch_codec.events_from_texts(objects)
    expected = python_events(objects)
    assert built == expected
    if built is not None:
        assert all(type(event) is PendingEvent and type(event.body) is bytes for event in built)


def test_events_from_texts_declines_what_is_not_a_list(batch_codec: ModuleType) -> None:
    for objects in (({"body": "a"},), collections.deque([{"body": "a"}]), {"body": "a"}, None):
        assert batch_codec.events_from_texts(objects) is None
    assert batch_codec.events_from_texts([]) == []


def test_events_from_texts_leaves_no_reference_behind(batch_codec: ModuleType) -> None:
    objects = [{"body": "x" * 100 + str(i)} for i in range(50)] + [{"body": "last é"}]
    texts = [obj["body"] for obj in objects]

    def counts() -> list[int]:
        return [*map(sys.getrefcount, objects), *map(sys.getrefcount, texts),
                sys.getrefcount(objects)]

    sizes = [*map(sys.getsizeof, texts)]
    gc.collect()
    before, nones = counts(), sys.getrefcount(None)
    for _ in range(100):
        built = batch_codec.events_from_texts(objects)
        declined = (batch_codec.events_from_texts([*objects, {"body": 1}]),
                    batch_codec.events_from_texts([*objects, {"body": "\ud800"}]))
        del built, declined
    gc.collect()
    assert counts() == before
    # three Nones an event: a leak of them would be thousands
    assert abs(sys.getrefcount(None) - nones) < 100
    assert [*map(sys.getsizeof, texts)] == sizes  # no UTF-8 copy left cached in a str


def test_record_batch_declines_without_the_compiled_codec(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(record_batch, "_codec", None)
    assert record_batch.events_from_texts([{"body": "a"}]) is None

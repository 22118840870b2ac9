"""Request bodies of the produce endpoint, parsed straight into the engine's events.

The hot path pays no serializer per event: orjson parses the body, and each
event is checked field by field here; an error names the event's index and the
field, and nothing is written. A body whose every event is {"body": "text"} (the
commonest) is turned into events in one pass by the engine's compiled codec
(record_batch.events_from_texts), which builds what the loop here builds.

Accepted bodies:

    content type            shape
    ----------------------  ----------------------------------------------------------
    application/json        {"events": [event, ...]}                     Weir's own
    application/json        [{"headers": {"k": "v"}, "body": "text"}, ...]  Flume's HTTP
                                                                          source (JSONHandler)
    application/x-ndjson    one event object per line (blank lines skipped)

    event field   type                        meaning
    ------------  --------------------------  -----------------------------------------
    body          string                      the body, UTF-8 encoded
    body_base64   string (base64)             the body as bytes (instead of body)
    key           string or null              the partition key, UTF-8 encoded
    headers       object of string -> string  event headers (Flume's are strings); a
                  or null                     null value is stored as "" (as Flume does);
                                              at most MAX_HEADERS = 1000 an event, names
                                              at most MAX_HEADER_NAME = 1024 bytes (values:
                                              the channel's batch limits, 413)
    timestamp     integer                     milliseconds since the epoch (default: now),
                                              0 .. MAX_TIMESTAMP = 253402300799999, i.e.
                                              up to 9999-12-31T23:59:59.999Z: the range
                                              every page and export can show as a date

Flume's `timestamp` header. An event without a `timestamp` field whose headers hold
`timestamp` as milliseconds since the epoch in decimal digits (what Flume's
TimestampInterceptor writes) takes its time from it, as Flume's HDFS sink buckets by that
header. Any other value (empty, a date, out of range) is a header like any other: Flume's
HTTP source takes such events, and so does Weir (the time is then the put's). The header
always stays among the headers.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from channel_engine import PendingEvent
from channel_engine.log.record_batch import events_from_texts

JSON = "application/json"
NDJSON = "application/x-ndjson"
FIELDS = {"body", "body_base64", "key", "headers", "timestamp"}
MAX_HEADERS = 1000
MAX_HEADER_NAME = 1024  # bytes, UTF-8
MAX_TIMESTAMP = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, Python's datetime.max


class EventError(ValueError):
    """A body that cannot be produced: which event (None: the whole body) and which field
    (the API answers a 400 invalid-event problem: appliance/api/handler.py)."""

    def __init__(self, index: int | None, field: str, reason: str) -> None:
        where = "body" if index is None else f"events[{index}].{field}"
        super().__init__(f"{where}: {reason}")
        self.index = index
        self.field = field
        self.reason = reason


def header_pair(text: str) -> tuple[str, str]:
    """A header typed as name:value (the search's header=, the UI's produce form): split at
    the first ':', name and value as typed; ValueError without a ':' or a name."""
    name, sep, value = text.partition(":")
    if not sep or not name:
        raise ValueError(f"{text!r} is not name:value")
    return name, value


def parse(body: bytes, content_type: str) -> list[PendingEvent]:
    """Parse a produce request body into events; EventError on the first bad thing."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == NDJSON:
        objects = [_loads(line, index) for index, line in
                   enumerate(line for line in body.split(b"\n") if line.strip())]
    elif kind in (JSON, ""):
        document = _loads(body, None)
        if isinstance(document, dict):
            unknown = sorted(set(document) - {"events"})
            if unknown:
                raise EventError(None, unknown[0], "unknown field (expected only 'events')")
            objects = document.get("events")
            if not isinstance(objects, list):
                raise EventError(None, "events", "must be a list of events")
        elif isinstance(document, list):  # Flume's HTTP source JSON
            objects = document
        else:
            raise EventError(None, "events", "expected {\"events\": [...]} or a JSON list")
    else:
        raise EventError(None, "content_type",
                         f"{content_type!r} is not supported (use {JSON} or {NDJSON})")
    if not objects:
        raise EventError(None, "events", "at least one event is needed")
    return _events(objects)


_new_tuple = tuple.__new__


def _events(objects: list[Any]) -> list[PendingEvent]:
    plain = events_from_texts(objects)  # every event {"body": "text"}: one pass in C
    if plain is not None:
        return plain
    out = []
    append = out.append
    for index, obj in enumerate(objects):
        # the common event, {"body": "text"}, takes a short way: a thousand-event request
        # spends most of its parsing time here
        if type(obj) is dict and len(obj) == 1:
            body = obj.get("body")
            if type(body) is str:
                append(_new_tuple(PendingEvent, (body.encode(), None, None, None)))
                continue
        append(_event(index, obj))
    return out


def _loads(data: bytes, index: int | None) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EventError(index, "json", f"not valid JSON ({exc})") from None


def _event(index: int, obj: Any) -> PendingEvent:
    if not isinstance(obj, dict):
        raise EventError(index, "event", "must be a JSON object")
    if not obj.keys() <= FIELDS:
        raise EventError(index, sorted(obj.keys() - FIELDS)[0], "unknown field")
    headers = _headers(index, obj.get("headers"))
    timestamp = _timestamp(index, obj.get("timestamp"))
    if timestamp is None and headers and "timestamp" in headers:
        timestamp = _flume_timestamp(headers["timestamp"])
    return PendingEvent(_body(index, obj), _key(index, obj.get("key")), headers, timestamp)


def _body(index: int, obj: dict[str, Any]) -> bytes:
    if "body" in obj and "body_base64" in obj:
        raise EventError(index, "body", "give body or body_base64, not both")
    if "body_base64" in obj:
        encoded = obj["body_base64"]
        if not isinstance(encoded, str):
            raise EventError(index, "body_base64", "must be a base64 string")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise EventError(index, "body_base64", "is not valid base64") from None
    body = obj.get("body")
    if not isinstance(body, str):
        raise EventError(index, "body", "is required and must be a string "
                                        "(or give body_base64)")
    return body.encode()


def _key(index: int, key: Any) -> bytes | None:
    if key is None:
        return None
    if not isinstance(key, str):
        raise EventError(index, "key", "must be a string or null")
    return key.encode()


def _headers(index: int, headers: Any) -> dict[str, bytes] | None:
    if headers is None:
        return None
    if not isinstance(headers, dict):
        raise EventError(index, "headers", "must be an object of strings")
    if len(headers) > MAX_HEADERS:
        raise EventError(index, "headers", f"at most {MAX_HEADERS} headers an event")
    out = {}
    for name, value in headers.items():
        if len(name) > MAX_HEADER_NAME // 4 and len(name.encode()) > MAX_HEADER_NAME:
            raise EventError(index, "headers", f"a header name is at most {MAX_HEADER_NAME} "
                                               "bytes (UTF-8)")
        if value is None:  # Flume stores a null header value as ""
            out[name] = b""
        elif isinstance(value, str):
            out[name] = value.encode()
        else:
            raise EventError(index, f"headers.{name}", "must be a string or null")
    return out


def _flume_timestamp(value: bytes) -> int | None:
    if value.isdigit() and len(value) <= len(str(MAX_TIMESTAMP)) and int(value) <= MAX_TIMESTAMP:
        return int(value)
    return None  # not Flume's milliseconds: a header like any other (module doc)


def _timestamp(index: int, timestamp: Any) -> int | None:
    if timestamp is None:
        return None
    if type(timestamp) is not int or not 0 <= timestamp <= MAX_TIMESTAMP:
        raise EventError(index, "timestamp", "must be milliseconds since the epoch, an integer "
                                             f"from 0 to {MAX_TIMESTAMP} (year 9999)")
    return timestamp

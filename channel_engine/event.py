"""Events: what producers hand over (PendingEvent) and what readers get back (Event).

A Flume event maps onto a Kafka record: body -> value, headers -> headers,
plus key and timestamp (milliseconds since the epoch, Kafka's CreateTime).

Header values (Flume's headers are strings, sometimes null): a put may give bytes,
str (stored as its UTF-8 bytes) or None (stored as b"", as Flume stores a null
header value as ""). Reads always return bytes: a str comes back as its UTF-8
bytes, None as b"".

Both are NamedTuples: they are created by the million on the hot paths, and a
NamedTuple costs a fraction of a frozen dataclass to build.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from channel_engine.errors import InvalidEventError

HeaderValue = bytes | bytearray | memoryview | str | None  # what a put may give


class PendingEvent(NamedTuple):
    """An event not yet in the log: a body, and optionally key, headers and timestamp."""

    body: bytes
    key: bytes | None = None
    headers: Mapping[str, HeaderValue] | None = None
    timestamp: int | None = None


class Event(NamedTuple):
    """An event read from the log, with its place in it."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    headers: dict[str, bytes]
    body: bytes


_BYTES = (bytes, bytearray, memoryview)
_MAX_TIMESTAMP = 2**63 - 1


def utf8_text(value: bytes | None) -> str | None:
    """`value` as text when it is well-formed UTF-8, else None (and None for None)."""
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


def make_event(index: int, body: object, key: object = None, headers: object = None,
               timestamp: object = None) -> PendingEvent:
    """Check one event's fields and return it as a PendingEvent; raise InvalidEventError
    naming the event's index in its transaction and the field."""
    if not isinstance(body, _BYTES):
        raise InvalidEventError(index, "body", f"must be bytes, not {type(body).__name__}")
    if key is not None and not isinstance(key, _BYTES):
        raise InvalidEventError(index, "key", f"must be bytes or None, not {type(key).__name__}")
    for field, value in (("body", body), ("key", key)):
        problem = view_problem(value)
        if problem is not None:
            raise InvalidEventError(index, field, problem)
    if headers is not None:
        if not isinstance(headers, Mapping):
            raise InvalidEventError(index, "headers", "must be a mapping of str to bytes, str "
                                                      "or None")
        stored = {}
        for name, value in headers.items():
            if not isinstance(name, str):
                raise InvalidEventError(index, "headers", f"names must be str, not {name!r}")
            stored[name] = header_value(index, name, value)
        headers = stored
    if timestamp is not None and (type(timestamp) is not int
                                  or not 0 <= timestamp <= _MAX_TIMESTAMP):
        raise InvalidEventError(index, "timestamp",
                                f"must be milliseconds in [0, 2**63), not {timestamp!r}")
    return PendingEvent(body, key, headers, timestamp)  # type: ignore[arg-type]


def header_value(index: int, name: str, value: object) -> bytes:
    """A header value as stored: bytes as given, str as UTF-8, None as b"" (Flume's "");
    InvalidEventError naming the event and header for anything else."""
    if type(value) is bytes:
        return value
    if value is None:
        return b""
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidEventError(index, f"headers.{name}",
                                    f"str is not valid UTF-8 ({exc.reason})") from None
    if isinstance(value, _BYTES):
        try:
            return bytes(value)  # copies a strided view too
        except ValueError:
            raise InvalidEventError(index, f"headers.{name}", "memoryview was released") from None
    raise InvalidEventError(index, f"headers.{name}",
                            f"must be bytes, str or None, not {type(value).__name__}")


def view_problem(value: object) -> str | None:
    """Why a body or key cannot be stored as given (None when it can): a memoryview must be
    unreleased and C-contiguous, as a record's bytes are copied from its buffer as they lie."""
    if not isinstance(value, memoryview):
        return None
    try:
        contiguous = value.c_contiguous
    except ValueError:
        return "memoryview was released"
    return None if contiguous else "memoryview must be C-contiguous, not a strided slice"

"""Events: what producers hand over (PendingEvent) and what readers get back (Event).

A Flume event maps onto a Kafka record: body -> value, headers -> headers,
plus key and timestamp (milliseconds since the epoch, Kafka's CreateTime).
Both are NamedTuples: they are created by the million on the hot paths, and a
NamedTuple costs a fraction of a frozen dataclass to build.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple


class PendingEvent(NamedTuple):
    """An event not yet in the log: a body, and optionally key, headers and timestamp."""

    body: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] | None = None
    timestamp: int | None = None


class Event(NamedTuple):
    """An event read from the log, with its place in it."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    headers: dict[str, bytes]
    body: bytes

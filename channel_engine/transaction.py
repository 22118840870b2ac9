"""PutTransaction and TakeTransaction: Flume's channel transactions, made stricter.

A put transaction buffers events in memory and writes nothing until commit;
commit makes all of them visible to takes at once, or none (one batch per
partition touched; see channel.py for how several partitions commit as one).
A take transaction reserves events from the head of the queue; commit removes
them for good (journalled), rollback returns them to the head in their order.

Both are context managers: a clean exit commits, an exception rolls back. A
transaction puts or takes, never both, and holds at most transaction_capacity
events. After commit, rollback or an expired lease it is closed; using it
again raises TransactionStateError (TakeExpiredError for a lapsed lease).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from channel_engine.errors import (
    OwnerLostError,
    OwnerUnreachableError,
    TakeExpiredError,
    TransactionCapacityError,
    TransactionStateError,
)
from channel_engine.event import Event, HeaderValue, PendingEvent, make_event
from channel_engine.log.record_batch import check_events

if TYPE_CHECKING:
    from channel_engine.channel import Channel
    from channel_engine.queue.operations import OwnerOperations

OPEN, COMMITTED, ROLLED_BACK = "open", "committed", "rolled back"


class _Transaction:
    """What put and take transactions share: state and the context-manager rules."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.state = OPEN

    def _check_open(self) -> None:
        if self.state != OPEN:
            raise TransactionStateError(f"channel {self._channel.name!r}: transaction is "
                                        f"{self.state}")

    def commit(self) -> None:
        """Make the transaction's work durable (per the channel's durability)."""
        raise NotImplementedError

    def rollback(self) -> None:
        """Undo the transaction's work."""
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.state != OPEN:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()


class PutTransaction(_Transaction):
    """Buffered events, committed atomically; `committed` lists (partition, first, last)."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(channel)
        self._events: list[PendingEvent] = []
        self.committed: list[tuple[int, int, int]] = []

    def __enter__(self) -> PutTransaction:
        return self

    def __len__(self) -> int:
        return len(self._events)

    def put(self, body: bytes, key: bytes | None = None,
            headers: Mapping[str, HeaderValue] | None = None,
            timestamp: int | None = None) -> None:
        """Add one event; checked now (InvalidEventError names the field), written at commit.
        Header values may be bytes, str (stored UTF-8) or None (stored as b"")."""
        self._check_open()
        capacity = self._channel.config.transaction_capacity
        if len(self._events) >= capacity:
            raise TransactionCapacityError(self._channel.name, len(self._events) + 1, capacity)
        self._events.append(make_event(len(self._events), body, key, headers, timestamp))

    def put_all(self, events: list[PendingEvent]) -> None:
        """Add many events at once: all are checked first, none is added if one is bad."""
        self._check_open()
        capacity = self._channel.config.transaction_capacity
        if len(self._events) + len(events) > capacity:
            raise TransactionCapacityError(self._channel.name, len(self._events) + len(events),
                                           capacity)
        checked = check_events(len(self._events), events)
        self._events.extend(checked)

    def commit(self) -> None:
        """Write every buffered event, one batch per partition touched; all or nothing."""
        self._check_open()
        try:
            if self._events:
                self.committed = self._channel.commit_put(self._events)
        except BaseException:
            self.state = ROLLED_BACK
            raise
        self.state = COMMITTED
        self._events = []

    def rollback(self) -> None:
        """Discard the buffered events; nothing was written."""
        self._check_open()
        self.state = ROLLED_BACK
        self._events = []
        try:
            self._channel.count_put_rollback()
        except OwnerLostError:
            pass  # only a counter: the rollback itself needs nobody


class TakeTransaction(_Transaction):
    """Events reserved from the head of the queue until commit or rollback."""

    def __init__(self, channel: Channel, backend: OwnerOperations, take_id: int,
                 lease_ms: int | None) -> None:
        super().__init__(channel)
        self._backend = backend  # the owner (or client of the owner) that holds the take
        self.take_id = take_id
        self.lease_ms = lease_ms
        self.taken = 0

    def __enter__(self) -> TakeTransaction:
        return self

    def take(self, max_events: int) -> list[Event]:
        """Reserve and return up to max_events events, oldest first in each partition;
        an empty list when nothing is queued (never waits)."""
        self._check_open()
        if type(max_events) is not int or max_events < 1:
            raise ValueError(f"max_events must be a positive int, not {max_events!r}")
        capacity = self._channel.config.transaction_capacity
        if self.taken + max_events > capacity:
            raise TransactionCapacityError(self._channel.name, self.taken + max_events,
                                           capacity)
        try:
            events = self._backend.take_events(self.take_id, max_events)
        except (TakeExpiredError, OwnerLostError) as exc:
            self.state = ROLLED_BACK
            raise self._gone(exc) from exc
        self.taken += len(events)
        return events

    def reserve(self, max_events: int) -> list[tuple[int, int, int]]:
        """Reserve up to max_events like take(), without reading them: (partition, start,
        end) ranges, end exclusive, for a reader of the segment files such as the Spark
        exporter. Not bounded by transaction_capacity (a take holds ranges, not events)."""
        self._check_open()
        if type(max_events) is not int or max_events < 1:
            raise ValueError(f"max_events must be a positive int, not {max_events!r}")
        try:
            ranges = self._backend.reserve_ranges(self.take_id, max_events)
        except (TakeExpiredError, OwnerLostError) as exc:
            self.state = ROLLED_BACK
            raise self._gone(exc) from exc
        self.taken += sum(end - start for _, start, end in ranges)
        return ranges

    def commit(self) -> None:
        """Remove the taken events for good; durable on return in fsync durability."""
        self._check_open()
        try:
            self._backend.commit_take(self.take_id)
        except OwnerUnreachableError as exc:
            self.state = ROLLED_BACK
            raise self._gone(exc) from exc
        except BaseException:
            self.state = ROLLED_BACK
            raise
        self.state = COMMITTED

    def rollback(self) -> None:
        """Return the taken events to the head of the queue, in their order."""
        self._check_open()
        self.state = ROLLED_BACK
        try:
            self._backend.rollback_take(self.take_id)
        except OwnerLostError:
            pass  # the owner went away: the take is returned by the next owner's replay

    def _gone(self, cause: Exception) -> Exception:
        """The error for a take whose owner went away before it committed: its events are
        queued again (the owner returns a closed connection's takes; a new owner replays)."""
        if isinstance(cause, TakeExpiredError):
            return cause
        return TakeExpiredError(f"channel {self._channel.name!r}: take {self.take_id} was "
                                f"returned to the queue: its owner process went away ({cause})")


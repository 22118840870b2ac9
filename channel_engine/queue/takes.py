"""Takes: the owner's take transactions — reserve from the partitions' heads, read,
commit (journalled), roll back, and leases that roll a take back by themselves.

A take belongs to one subscription (subscription.py; `default` unless named) and
reserves offsets round-robin over the partitions, up to each one's last
stable offset (ChannelState.visible_end), and holds them in its subscription's
queues (partition_queue.py) until it commits (removed for good: a TAKE record
in the commit journal, synced in fsync durability) or rolls back (returned to
the head, in order). A take returns only offsets it still holds after its
read's losses are counted (losses.py), and offsets it held but could not read
are counted lost too, so a take commit never marks taken an event it did not
return.

Takes by id (commit_take / rollback_take, for takes begun in another process):
the owner remembers how its last FINISHED_TAKES takes ended, so a repeated
commit or a rollback after commit raises TakeCommittedError, and a commit after
rollback or expiry a TakeExpiredError that says which (older takes, or after
an owner change: "gone"). Leased takes wait in a heap by deadline; expire()
returns the lapsed ones (every take and put path calls it). Take ids never
repeat across owners (start_ids).

Concurrency: thread-safe; the reservations are changed under the channel lock
(channel_state.py); reads and journal syncs happen outside it.
"""
from __future__ import annotations

import contextlib
import heapq
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from channel_engine.errors import (
    ChannelEngineError,
    SubscriptionBusyError,
    TakeCommittedError,
    TakeExpiredError,
    TransactionCapacityError,
)
from channel_engine.event import Event
from channel_engine.queue import commit_journal
from channel_engine.queue.channel_state import ChannelState
from channel_engine.queue.home_lock import HomeLock
from channel_engine.queue.loss_ledger import deliverable
from channel_engine.queue.losses import Losses
from channel_engine.queue.subscription import DEFAULT, Subscription

FINISHED_TAKES = 10_000  # takes whose ending is remembered (a few hundred KiB)
COMMITTED, ROLLED_BACK, EXPIRED = "committed", "rolled back", "expired"


@dataclass
class _Take:
    """A take transaction's reservation: its subscription, partitions and lease deadline."""

    subscription: Subscription
    partitions: set[int] = field(default_factory=set)
    deadline_ms: int | None = None
    lease_ms: int | None = None
    taken: int = 0


class Takes:
    """The owner's take side: take transactions and their leases; see the module doc."""

    def __init__(self, state: ChannelState, home_lock: HomeLock, losses: Losses) -> None:
        self._state = state
        self._home_lock = home_lock
        self._losses = losses
        self.config = state.config
        self.name = state.name
        self._takes: dict[int, _Take] = {}
        # how the last FINISHED_TAKES takes ended, so a repeated commit or a late rollback
        # is answered truly (committed / rolled back / expired), not guessed
        self._finished: OrderedDict[int, str] = OrderedDict()
        # per partition: the last batch decoded, (base, next offset, events)
        self._last_batch: dict[int, tuple[int, int, list[Event]]] = {}
        self._lease_heap: list[tuple[int, int]] = []  # (deadline_ms, take id)
        self._take_ids = 0
        self._next_take_partition = 0

    def start_ids(self, generation: int) -> None:
        """Number this owner's takes from `generation` up: a stale id from a previous owner
        (an HTTP consumer's, say) must not address a new take."""
        self._take_ids = generation << 32

    def open_takes(self) -> int:
        """How many take transactions are open. Caller holds the lock."""
        return len(self._takes)

    def begin_take(self, lease_ms: int | None = None, subscription: str = DEFAULT) -> int:
        """Start a take transaction of a subscription; return its id. With lease_ms, it
        rolls back by itself unless committed or rolled back within that time."""
        self._state.check_writable()
        if lease_ms is not None and (type(lease_ms) is not int or lease_ms < 1):
            raise ValueError(f"lease_ms must be a positive int or None, not {lease_ms!r}")
        self._home_lock.check()  # its commit would be journalled into a file no open will read
        with self._state.lock:
            sub = self._state.subscription(subscription)
            if sub.changing:
                raise SubscriptionBusyError(self.name, subscription,
                                            "it is being reset or removed")
            self.expire()
            self._take_ids += 1
            take_id = self._take_ids
            deadline = None if lease_ms is None else self._state.now_ms() + lease_ms
            self._takes[take_id] = _Take(sub, deadline_ms=deadline, lease_ms=lease_ms)
            if deadline is not None:
                heapq.heappush(self._lease_heap, (deadline, take_id))
        return take_id

    def take_events(self, take_id: int, max_events: int) -> list[Event]:
        """Reserve up to max_events from the partitions' heads, round-robin; read them."""
        with self._state.lock:
            take = self._live_take(take_id)
            if take.taken + max_events > self.config.transaction_capacity:
                raise TransactionCapacityError(self.name, take.taken + max_events,
                                               self.config.transaction_capacity)
        reserved = self.reserve_ranges(take_id, max_events)
        try:
            events = [event for p, start, end in reserved for event in self._read(p, start, end)]
            return self._delivered(take_id, reserved, events)
        except BaseException:
            with self._state.lock:
                self._count(self._takes.get(take_id), "take_errors", 1)
            with contextlib.suppress(ChannelEngineError):  # a read that reported, then raised:
                self._losses.count()  # the next take must not reserve those offsets again
            raise

    def reserve_ranges(self, take_id: int, max_events: int) -> list[tuple[int, int, int]]:
        """Reserve up to max_events from the partitions' heads, round-robin, without reading
        them: (partition, start, end) ranges, end exclusive, for a reader of the segment
        files (the exporter). A take holds ranges, not events, so transaction_capacity
        bounds only take_events."""
        reserved: list[tuple[int, int, int]] = []
        self._losses.count()  # what other reads found lost is not reserved now
        with self._state.lock:
            take = self._live_take(take_id)
            self._count(take, "take_attempts", max_events)
            queues = take.subscription.queues
            partitions = self.config.partitions
            first = self._next_take_partition
            self._next_take_partition = (first + 1) % partitions
            want = max_events
            for i in range(partitions):
                p = (first + i) % partitions
                got = queues[p].reserve(take_id, want, self._state.visible_end(p))
                if got:
                    take.partitions.add(p)
                    reserved += [(p, start, end) for start, end in got]
                    want -= sum(end - start for start, end in got)
                    if want == 0:
                        break
            take.taken += max_events - want
        return reserved

    def _read(self, partition: int, start: int, end: int) -> list[Event]:
        """Events [start, end) of a partition. The last batch decoded is kept, so takes
        smaller than the producers' batches decode each batch once, not once per take."""
        events: list[Event] = []
        cached = self._last_batch.get(partition)
        if cached is not None and cached[0] <= start < cached[1]:
            base, _next, decoded = cached
            events = decoded[start - base:end - base]
            start = min(end, cached[1])
        if start >= end:
            return events
        log = self._state.logs[partition]
        for segment, header, data in log.read_batches(start, end, 1 << 62):
            decoded = log.decode_batch(segment, header, data)
            base = header.base_offset
            events += decoded[max(start, base) - base:end - base]
            if header.next_offset > end:
                self._last_batch[partition] = (base, header.next_offset, decoded)
        return events

    def _delivered(self, take_id: int, reserved: list[tuple[int, int, int]],
                   events: list[Event]) -> list[Event]:
        """What a take may return: the events read whose offsets it still holds once this
        read's losses left the queue. Held offsets the read did not return are lost too (the
        take must not commit them)."""
        self._losses.count()
        with self._state.lock:
            take = self._takes.get(take_id)
            queues = take.subscription.queues if take is not None else None
            held = {p: list(queues[p].in_flight.get(take_id, ())) if queues else []
                    for p in {p for p, _, _ in reserved}}
        if len(events) == sum(end - start for _, start, end in reserved) and all(
                (start, end) in held[p] for p, start, end in reserved):
            return events  # no loss touched it, the read missed nothing (the usual case)
        kept, missed = deliverable(reserved, held, events,
                                   [log.directory for log in self._state.logs])
        self._losses.count([(p, lost, None) for p, lost in missed])
        return kept

    def commit_take(self, take_id: int) -> None:
        """Remove a take's events for good; durable on return in fsync durability."""
        durable = self.begin_commit_take(take_id)
        if durable is not None:
            durable()

    def begin_commit_take(self, take_id: int) -> Callable[[], None] | None:
        """commit_take but its wait for the fsync of its journal record: returns that wait,
        to call before the commit is acknowledged (None when there is nothing to wait for:
        policy durability, or a take of no events). Commits begun together then share one
        fsync, the first wait covering the others (the journal's group sync): the owner's
        loop begins a round's commits and waits once (owner/server.py)."""
        self._home_lock.check()  # never acknowledge a commit journalled into an unlinked file
        with self._state.room:
            self._live_take(take_id)
            take = self._takes.pop(take_id)
            self._finish(take_id, COMMITTED)
            sub = take.subscription
            entries = []
            taken = 0
            for p in sorted(take.partitions):
                ranges = list(sub.queues[p].in_flight.get(take_id, ()))
                entries += [(p, start, end) for start, end in ranges]
                taken += sub.queues[p].commit(take_id)  # lost offsets left its ranges
            sub.untaken -= taken
            journal = self._state.live_journal()
            ticket = journal.append(commit_journal.TAKE, take_id, entries,
                                    subscription=sub.id) if entries else 0
            self._count(take, "take_successes", taken)
            self._state.room.notify_all()
        if entries and self.config.durability == "fsync":
            return partial(journal.sync, ticket)
        return None

    def rollback_take(self, take_id: int) -> None:
        """Return a take's events to the head of their partitions, in order; nothing for a
        take already returned; TakeCommittedError for a committed one."""
        with self._state.lock:
            if self._state.closing:
                return  # closing returned every take already
            take = self._takes.pop(take_id, None)
            if take is not None:
                for p in take.partitions:
                    take.subscription.queues[p].rollback(take_id)
                self._finish(take_id, ROLLED_BACK)
            elif self._finished.get(take_id) == COMMITTED:
                raise TakeCommittedError(f"channel {self.name!r}: take {take_id} was already "
                                         "committed: its events cannot be returned")
            self._count(take, "rollbacks", 1)

    def _live_take(self, take_id: int) -> _Take:
        """The take's reservation, unless its lease ran out or the channel closed (its
        takes returned to the queue then). Caller holds the lock."""
        if self._state.closing:
            raise TakeExpiredError(f"channel {self.name!r}: take {take_id} is gone: the "
                                   "channel was closed and its events returned to the queue")
        self.expire()
        take = self._takes.get(take_id)
        if take is None:
            ended = self._finished.get(take_id)
            if ended == COMMITTED:
                raise TakeCommittedError(f"channel {self.name!r}: take {take_id} was already "
                                         "committed: its events are gone for good")
            why = {ROLLED_BACK: "it was rolled back", EXPIRED: "its lease expired"}.get(
                ended or "", "its lease expired or its channel owner restarted")
            raise TakeExpiredError(f"channel {self.name!r}: take {take_id} is gone: {why}, "
                                   "and its events were returned to the queue")
        return take

    def in_flight_of(self, subscription: Subscription) -> int:
        """How many open takes the subscription has. Caller holds the lock."""
        return sum(1 for take in self._takes.values() if take.subscription is subscription)

    def _count(self, take: _Take | None, counter: str, amount: int) -> None:
        """Add to the channel's counter and to the take's subscription's (a take gone
        already counts for the channel only). Caller holds the lock."""
        self._state.counters[counter] += amount
        if take is not None:
            take.subscription.counters[counter] += amount

    def _finish(self, take_id: int, how: str) -> None:
        """Remember how a take ended (bounded). Caller holds the lock."""
        self._finished[take_id] = how
        if len(self._finished) > FINISHED_TAKES:
            self._finished.popitem(last=False)

    def expire(self) -> None:
        """Roll back takes whose lease ran out. Caller holds the lock. O(log n) per expiry:
        leases wait in a heap by deadline, so takes without one cost nothing here."""
        heap = self._lease_heap
        if not heap or heap[0][0] > self._state.now_ms():
            return
        now = self._state.now_ms()
        while heap and heap[0][0] <= now:
            _, take_id = heapq.heappop(heap)
            take = self._takes.pop(take_id, None)
            if take is None:
                continue  # committed or rolled back before its lease ran out
            for p in take.partitions:
                take.subscription.queues[p].rollback(take_id)
            self._finish(take_id, EXPIRED)
            self._count(take, "takes_expired", 1)
            self._count(take, "rollbacks", 1)



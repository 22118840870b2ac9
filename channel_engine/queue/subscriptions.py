"""Subscriptions: the owner's add, remove, reset and list of a channel's subscriptions
(subscription.py holds one subscription's state).

Each change is made with a checkpoint (Checkpointer.run's `change`): under the channel
lock it is made just before the snapshot, so the checkpoint written next holds it, and
it is durable when the call returns; if that write fails it is undone and the call
raises. While the write is on, the subscription is `changing`: no take may begin on it
(a take committed into the journal of a subscription no checkpoint holds would be
replayed into nothing).

Positions (Kafka's `kafka-consumer-groups --reset-offsets` choices), per partition:
  "earliest"             the log start: every event still stored;
  "latest"               the last stable offset: only events put from now on;
  "slowest"              where the subscription with the most events untaken stands (its
                         taken-through offset): no event the channel does not hold for a
                         consumer already, so an add never makes the channel fuller;
  {"timestamp_ms": t}    the first event with a timestamp >= t (the time index), or the
                         last stable offset when there is none;
  {partition: offset}    that offset, within [log start, last stable offset]; the
                         partitions not named start at "earliest" (add) or keep their
                         position (reset).
A subscription starts with nothing in flight or committed above its position: its head
is the position. A reset or removal is refused while the subscription has takes open
(SubscriptionBusyError), and `default` cannot be removed.

Concurrency: thread-safe; called on the owner (clients forward it, owner/protocol.py).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from channel_engine.errors import SubscriptionBusyError, SubscriptionExistsError
from channel_engine.queue.channel_state import ChannelState
from channel_engine.queue.checkpointer import Checkpointer
from channel_engine.queue.losses import Losses
from channel_engine.queue.partition_queue import PartitionQueue
from channel_engine.queue.subscription import DEFAULT, Subscription, check_name
from channel_engine.queue.takes import Takes

Position = str | Mapping[str, int] | Mapping[int, int]


class Subscriptions:
    """The owner's subscription changes; see the module doc."""

    def __init__(self, state: ChannelState, takes: Takes, checkpointer: Checkpointer,
                 losses: Losses) -> None:
        self._state = state
        self._takes = takes
        self._losses = losses
        self._checkpointer = checkpointer
        self.name = state.name

    def names(self) -> list[str]:
        """The subscriptions' names, `default` first, then in the order they were added."""
        with self._state.lock:
            return list(self._state.subscriptions)

    def add(self, name: str, start: Position = "earliest") -> None:
        """Add a subscription starting at `start` (see the module doc); durable on return."""
        self._state.check_writable()
        check_name(name)

        def change() -> Callable[[bool], None]:
            if name in self._state.subscriptions:
                raise SubscriptionExistsError(self.name, name)
            heads = [h for h in self._positions(start, None) if h is not None]  # all given
            sub = Subscription(self._state.next_subscription_id, name,
                               [self._new_queue(p, head) for p, head in enumerate(heads)],
                               changing=True)
            # room given to puts not yet appended counts for every subscription (puts.py)
            default = self._state.default
            reserved = default.untaken - self._queued_untaken(default.queues)
            sub.untaken = self._queued_untaken(sub.queues) + reserved
            self._state.subscriptions[name] = sub
            self._state.next_subscription_id += 1

            def settle(written: bool) -> None:
                sub.changing = False
                if not written:
                    del self._state.subscriptions[name]
            return settle

        self._checkpointer.run(change)

    def remove(self, name: str) -> None:
        """Remove a subscription (not `default`, none of its takes open); what only it held
        may then be deleted; durable on return."""
        self._state.check_writable()
        if name == DEFAULT:
            raise ValueError("subscription 'default' cannot be removed")

        def change() -> Callable[[bool], None]:
            # It stays live while the checkpoint without it is written: puts, aborts and
            # retention meanwhile keep it right, should the write fail.
            sub = self._idle(name, "removed")
            sub.changing = sub.removing = True

            def settle(written: bool) -> None:
                sub.changing = sub.removing = False
                if written:
                    del self._state.subscriptions[name]
            return settle

        self._checkpointer.run(change)

    def reset(self, name: str, to: Position) -> None:
        """Move a subscription's position (none of its takes open): its events from there
        on are queued again, those before it taken; durable on return."""
        self._state.check_writable()

        def change() -> Callable[[bool], None]:
            # The checkpoint saves the new queues; the live ones stay the old until it is
            # written (puts, aborts and retention meanwhile change those), and the new ones
            # are made again then, from the state at that moment (no take changed them:
            # `changing` refuses takes).
            sub = self._idle(name, "reset")
            heads = self._positions(to, sub)
            sub.saved_queues = self._reset_queues(sub, heads)
            sub.changing = True

            def settle(written: bool) -> None:
                sub.changing, sub.saved_queues = False, None
                if written:
                    reserved = sub.untaken - self._queued_untaken(sub.queues)
                    sub.queues = self._reset_queues(sub, heads)
                    for p, queue in enumerate(sub.queues):
                        queue.skip_to(self._state.logs[p].log_start_offset)
                    sub.untaken = self._queued_untaken(sub.queues) + reserved
            return settle

        self._checkpointer.run(change)

    def _reset_queues(self, sub: Subscription, heads: list[int | None]
                      ) -> list[PartitionQueue]:
        """The queues of `sub` reset to `heads` (None: that partition's kept as it is)."""
        return [queue if head is None else self._new_queue(p, head)
                for p, (queue, head) in enumerate(zip(sub.queues, heads, strict=True))]

    def _new_queue(self, partition: int, head: int) -> PartitionQueue:
        """A queue from `head` on, with the offsets no subscription may ever take already
        taken: aborted puts' (their batches stay in the log) and those recorded lost (the
        log cannot deliver them). Caller holds the lock."""
        queue = PartitionQueue(head)
        gone = self._state.aborted[partition] + [
            (r.start, r.end) for r in self._losses.ledger.records if r.partition == partition]
        end = self._state.visible_end(partition)
        queue.mark_committed(sorted((max(a, head), min(b, end)) for a, b in gone
                                    if b > head and a < end))
        return queue

    def _queued_untaken(self, queues: list[PartitionQueue]) -> int:
        """The untaken events of these queues, up to each partition's appended end (not
        the room reserved by puts still appending). Caller holds the lock."""
        return sum(q.untaken(end) for q, end in zip(queues, self._state.ends, strict=True))

    def _idle(self, name: str, doing: str) -> Subscription:
        """The subscription, if no take of it is open. Caller holds the lock."""
        sub = self._state.subscription(name)
        if sub.changing:
            raise SubscriptionBusyError(self.name, name, "it is being changed already")
        open_takes = self._takes.in_flight_of(sub)
        if open_takes:
            raise SubscriptionBusyError(self.name, name, f"{open_takes} of its takes are open: "
                                        f"commit or roll them back before it is {doing}")
        return sub

    def _positions(self, where: Position, current: Subscription | None) -> list[int | None]:
        """The head on every partition that `where` names (module doc); None for a
        partition a reset of `current` leaves as it is. Caller holds the lock."""
        state = self._state
        partitions = range(state.config.partitions)
        starts = [state.logs[p].log_start_offset for p in partitions]
        ends = [state.visible_end(p) for p in partitions]
        if where == "earliest":
            return list(starts)
        if where == "latest":
            return list(ends)
        if where == "slowest":
            slowest = max(state.subscriptions.values(), key=lambda sub: sub.untaken)
            return [max(starts[p], min(q.taken_through, ends[p]))
                    for p, q in enumerate(slowest.queues)]
        if not isinstance(where, Mapping):
            raise ValueError(f'a position is "earliest", "latest", "slowest", '
                             f'{{"timestamp_ms": t}} or {{partition: offset}}, not {where!r}')
        if set(where) == {"timestamp_ms"}:
            stamp = where["timestamp_ms"]  # type: ignore[index]
            if type(stamp) is not int or stamp < 0:
                raise ValueError(f"timestamp_ms must be an int >= 0, not {stamp!r}")
            found = [state.logs[p].offsets_for_time(stamp) for p in partitions]
            return [ends[p] if f is None else max(starts[p], min(f, ends[p]))
                    for p, f in enumerate(found)]
        heads: list[int | None] = [None] * len(starts) if current is not None else list(starts)
        for key, offset in where.items():
            p = _partition(key)
            state.check_partition(p)
            if type(offset) is not int or not starts[p] <= offset <= ends[p]:
                raise ValueError(f"partition {p}: offset {offset!r} is outside "
                                 f"[{starts[p]}, {ends[p]}] (log start, last stable offset)")
            heads[p] = offset
        return heads


def _partition(key: Any) -> int:
    """A partition number from a position's key ("0" in JSON, 0 in Python)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.isdigit():
        return int(key)
    raise ValueError(f"a position names partitions by number, not {key!r}")

"""Subscription: one named reader of a channel — its queue on every partition and its take
figures. A channel stores each event once (its partition logs); each subscription takes
each event once, at its own pace, as Kafka's consumer groups read one log. `default`
(id 0) always exists: a channel of the release before subscriptions is a channel with
that one, and every caller that names none takes from it.

The queue of a subscription on a partition is a PartitionQueue (partition_queue.py): its
head, out-of-order commits, takes in flight and returned ranges. What is shared is the
log: a put adds its events to every subscription's queue (by moving the log end), a loss
or an aborted put takes offsets out of every subscription's queue, and a segment is
deleted only once every subscription has taken it (checkpointer.py).

Ids are given out in order and never reused, so a journal record of a removed
subscription (commit_journal.py's kind 3) can never be applied to a new one.

Pure data, not thread-safe: the channel lock (channel_state.py) guards every field.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from channel_engine.queue.checkpoint import (
    DEFAULT_SUBSCRIPTION,
    QueueCheckpoint,
    SubscriptionCheckpoint,
)
from channel_engine.queue.partition_queue import PartitionQueue, union_count

DEFAULT = DEFAULT_SUBSCRIPTION
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")  # whole name: fullmatch; fits a u8 length
# Flume's take figures, per subscription (the channel's are their sums)
COUNTERS = ("take_attempts", "take_successes", "take_errors", "rollbacks", "takes_expired",
            "dropped_events", "lost_events")


def check_name(name: object) -> str:
    """The name, if it is a valid subscription name; else ValueError saying the rule."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"a subscription name is 1-64 of a-z, 0-9, '_' and '-', starting "
                         f"with a letter or digit, not {name!r}")
    return name


@dataclass
class Subscription:
    """One subscription's state; see the module doc."""

    id: int
    name: str
    queues: list[PartitionQueue]
    untaken: int = 0  # events in its queues not taken and committed (capacity counts these)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    changing: bool = False  # being added, removed or reset: no take may begin
    removing: bool = False  # left out of the checkpoint being written (subscriptions.py)
    saved_queues: list[PartitionQueue] | None = None  # what that checkpoint saves instead

    def count_untaken(self, ends: list[int]) -> int:
        """Recount `untaken` from the queues, given each partition's end."""
        self.untaken = sum(q.untaken(end) for q, end in zip(self.queues, ends, strict=True))
        return self.untaken

    def in_flight_events(self) -> int:
        """Events reserved by its takes not yet committed or rolled back."""
        return sum(q.in_flight_events() for q in self.queues)

    def to_checkpoint(self) -> SubscriptionCheckpoint:
        """Its queues as a checkpoint saves them (not for `default`: the partition records
        hold its queues)."""
        return SubscriptionCheckpoint(self.id, self.name, tuple(
            QueueCheckpoint(q.taken_through, tuple(q.committed),
                            tuple(sorted(r for ranges in q.in_flight.values() for r in ranges)))
            for q in self.saved()))

    def saved(self) -> list[PartitionQueue]:
        """The queues a checkpoint saves: a reset's new ones while it is being written."""
        return self.saved_queues if self.saved_queues is not None else self.queues


def take_out(subscriptions: Iterable[Subscription], partition: int, low: int, high: int,
             end: int, change: Callable[[PartitionQueue], object],
             counter: str | None = None) -> int:
    """Apply `change` to every subscription's queue of `partition`, where it takes offsets
    of [low, high) out (an aborted put, a loss, retention; `end`: the partition's end);
    keep each one's untaken (and its `counter`, if given, counts what left it); return how
    many events left at least one queue (each counted once, however many queues held it)."""
    gone = []
    for sub in subscriptions:
        queue = sub.queues[partition]
        its = queue.untaken_in(low, high)  # what leaves this queue (counted in `counter`)
        gone += its
        before = queue.untaken(end)  # the cache follows untaken(end), which clip_to's
        change(queue)  # offsets beyond the end never were in
        sub.untaken -= before - queue.untaken(end)
        if counter is not None:
            sub.counters[counter] += union_count(its)
    return union_count(gone)

"""ChannelState: what the parts of a ChannelOwner share — the partitions' logs and
queues, the appends registered and not yet resolved, the commit journal, the counters.

ChannelOwner (channel_owner.py) makes one and hands it to its parts: puts
(puts.py), takes and leases (takes.py), losses (losses.py), checkpoints
(checkpointer.py) and status (channel_status.py). It holds data and the few
questions every part asks of it (the last stable offset, the live journal, is
the channel writable, how full is it); the rules live in the parts.

The queues are per subscription (subscription.py): `subscriptions` by name, `default`
first. A change every subscription sees (an aborted put, a loss, retention) goes through
`on_every_queue`, which keeps each one's `untaken` and counts the events once.

Concurrency: `lock` guards every field below it (`room` is a condition on the
same lock, notified when capacity is freed); appends to one partition are
serialised by `append_locks[p]`, taken before `lock`; `checkpoint_lock`
serialises checkpoints and loss marking, taken before both. No fsync is done
under `lock`. Failures: ChannelClosedError once the owner is closing,
ReadOnlyLogError for a write to a read-only open.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from channel_engine.disk_space import FreeSpace
from channel_engine.errors import ChannelClosedError, ReadOnlyLogError, UnknownSubscriptionError
from channel_engine.log.partition_log import PartitionLog
from channel_engine.offset_ranges import subtract
from channel_engine.queue.channel_config import ChannelConfig
from channel_engine.queue.channel_recovery import ChannelRecovery
from channel_engine.queue.commit_journal import CommitJournal
from channel_engine.queue.partition_queue import PartitionQueue
from channel_engine.queue.subscription import DEFAULT, Subscription, take_out

COUNTERS = ("put_attempts", "put_successes", "put_errors", "take_attempts", "take_successes",
            "take_errors", "rollbacks", "takes_expired", "aborted_events", "dropped_events",
            "lost_events", "checkpoint_write_errors", "checkpoint_backup_write_errors",
            "disk_full_errors")


@dataclass
class UnresolvedPut:
    """A put appended to one partition and not yet resolved (committed or aborted)."""

    start: int
    end: int
    transaction_id: int | None
    segment_base_offset: int
    position: int
    journalled: bool = False  # its commit record is written: decided, not pending


class ChannelState:
    """The owner's shared state; see the module doc for its locks."""

    def __init__(self, config: ChannelConfig, read_only: bool, clock: Callable[[], float],
                 free_space: FreeSpace) -> None:
        self.config = config
        self.name = config.name
        self.read_only = read_only
        self.clock = clock
        self.free_space = free_space
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)  # capacity freed
        self.checkpoint_lock = threading.Lock()
        self.logs: list[PartitionLog] = []
        self.subscriptions: dict[str, Subscription] = {}  # `default` first
        self.next_subscription_id = 1
        # per partition: offsets of puts that never committed, taken in every queue (and in
        # a subscription added or reset later: checkpoint.py's aborted ranges)
        self.aborted: list[list[tuple[int, int]]] = []
        self.append_locks: list[threading.Lock] = []
        self.ends: list[int] = []  # per partition: end of the appends registered here
        self.unresolved: list[dict[int, UnresolvedPut]] = []
        self.journal: CommitJournal | None = None
        self.recovery = ChannelRecovery()
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.closing = False  # from here on, takes are gone and puts are refused
        self.closed = False

    def now_ms(self) -> int:
        """The channel clock, in milliseconds."""
        return int(self.clock() * 1000)

    def subscription(self, name: str) -> Subscription:
        """The subscription of that name; UnknownSubscriptionError naming the ones there are."""
        found = self.subscriptions.get(name)
        if found is None:
            raise UnknownSubscriptionError(self.name, name, list(self.subscriptions))
        return found

    @property
    def default(self) -> Subscription:
        """Subscription `default`: every caller that names none takes from it."""
        return self.subscriptions[DEFAULT]

    def backlog(self) -> int:
        """The untaken events of the slowest subscription: what capacity bounds."""
        return max((s.untaken for s in self.subscriptions.values()), default=0)

    def add_untaken(self, count: int) -> None:
        """`count` events were put (or their put is in doubt): every subscription has them
        to take."""
        for sub in self.subscriptions.values():
            sub.untaken += count

    def on_every_queue(self, partition: int, low: int, high: int,
                       change: Callable[[PartitionQueue], object],
                       counter: str | None = None) -> int:
        """subscription.take_out on every subscription: the events that left at least one
        queue of [low, high), each counted once."""
        return take_out(self.subscriptions.values(), partition, low, high, self.ends[partition],
                        change, counter)

    def visible_end(self, partition: int) -> int:
        """The last stable offset: the end of the prefix every put of which resolved."""
        unresolved = self.unresolved[partition]
        if unresolved:
            return min(put.start for put in unresolved.values())
        return self.ends[partition]

    def committed_spans(self, partition: int, start: int, end: int) -> list[tuple[int, int]]:
        """[start, end) of a partition less the offsets of aborted puts, in order: their
        batches stay in the log, and no reader may see them (Kafka's read_committed)."""
        with self.lock:
            aborted = [r for r in self.aborted[partition] if r[1] > start and r[0] < end]
        if not aborted:
            return [(start, end)] if end > start else []
        return subtract((start, end), sorted(aborted))

    def live_journal(self) -> CommitJournal:
        """The commit journal; ChannelClosedError once the owner closed it."""
        if self.journal is None:
            raise ChannelClosedError(f"channel {self.name!r} is closed")
        return self.journal

    def check_writable(self) -> None:
        """ChannelClosedError when closing, ReadOnlyLogError when opened read-only."""
        if self.closing:
            raise ChannelClosedError(f"channel {self.name!r} is closed")
        if self.read_only:
            raise ReadOnlyLogError(f"channel {self.name!r} is open read-only")

    def check_partition(self, partition: int) -> None:
        """ValueError unless `partition` is one of the channel's."""
        if type(partition) is not int or not 0 <= partition < self.config.partitions:
            raise ValueError(f"channel {self.name!r} has partitions 0..."
                             f"{self.config.partitions - 1}, not {partition!r}")

    def guarded_dirs(self) -> list[Path]:
        """The directories the disk-space guard checks (those that exist)."""
        dirs = [Path(d) for d in self.config.data_dirs] + [self.config.home]
        return [d for d in dirs if os.path.isdir(d)]


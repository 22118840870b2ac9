"""ChannelStatus: what an operator sees of a channel — counters, per-partition
offsets and sizes, checkpoints, recovery, losses and health — as plain
JSON-serialisable data (the CLI's `stat`, the appliance's API and UI).

The channel's queue figures (events_untaken, _queued, _in_flight; each partition's
taken_through and the same) are its slowest subscription's, the one with the most events
untaken: what capacity counts ("slowest_subscription" names it). `subscriptions` gives
every subscription's own, with its take counters.

Health is the first of: "unhealthy" (a partition offline — also one whose directory
was deleted, unmounted or replaced under the running owner, found by a stat of each at
every status (PartitionLog.verify_directory) —, the channel closed,
its home deleted or replaced, the disk guard failing), "degraded" (a put failed
for a full disk, unacknowledged losses, a failed backup checkpoint, the channel
full, no checkpoint for three intervals), else "healthy"; with the reason.

Concurrency: thread-safe; the counts are read together under the channel lock
(channel_state.py), segment tables and free space outside it. Failure: none of
its own; losses that cannot be recorded yet show as unacknowledged.
"""
from __future__ import annotations

import contextlib
from typing import Any

from channel_engine.disk_space import check_free_space
from channel_engine.errors import ChannelEngineError, LogOfflineError
from channel_engine.queue.channel_state import ChannelState
from channel_engine.queue.checkpointer import Checkpointer
from channel_engine.queue.home_lock import HomeLock
from channel_engine.queue.losses import Losses
from channel_engine.queue.partition_queue import PartitionQueue
from channel_engine.queue.puts import Puts
from channel_engine.queue.subscription import Subscription
from channel_engine.queue.takes import Takes


class ChannelStatus:
    """The owner's status report, read from its parts; see the module doc."""

    def __init__(self, state: ChannelState, home_lock: HomeLock, puts: Puts, takes: Takes,
                 losses: Losses, checkpointer: Checkpointer) -> None:
        self._state = state
        self._home_lock = home_lock
        self._puts = puts
        self._takes = takes
        self._losses = losses
        self._checkpointer = checkpointer
        self.config = state.config
        self.name = state.name

    def status(self, segments: bool = False) -> dict[str, Any]:
        """Everything an operator looks at, as plain JSON-serialisable data (with each
        partition's segment table when `segments`)."""
        with contextlib.suppress(ChannelEngineError):  # unwritten records show, unacknowledged
            self._losses.count()
        lost = self._losses.ledger.events_by_partition()
        self._verify_directories()  # first: each partition's "offline" says it too
        with self._state.lock:
            if not self._state.read_only:
                self._takes.expire()
            slowest = max(self._state.subscriptions.values(), key=lambda s: s.untaken)
            partitions = [self._partition_status(p, slowest.queues[p])
                          for p in range(self.config.partitions)]
            for part in partitions:
                part["lost_events"] = lost.get(part["partition"], 0)
            counters = dict(self._state.counters)
            untaken = slowest.untaken
            in_flight = slowest.in_flight_events()
            open_takes = self._takes.open_takes()
            subscriptions = {s.name: self._subscription_status(s)
                             for s in self._state.subscriptions.values()}
        if segments:
            for part, log in zip(partitions, self._state.logs, strict=True):
                part["segment_table"] = [vars(info) for info in log.segment_infos()]
        capacity = self.config.capacity
        journal = self._state.journal  # its zeros ahead (fsync durability), in the home
        health, reason = self.health()
        return {
            "name": self.name,
            "home": str(self.config.home),
            "read_only": self._state.read_only,
            "durability": self.config.durability,
            "capacity": capacity,
            "events_queued": untaken - in_flight,
            "events_untaken": untaken,
            "events_in_flight": in_flight,
            "slowest_subscription": slowest.name,
            "open_takes": open_takes,
            "fill_percent": round(100 * untaken / capacity, 3),
            "unflushed_events": sum(p["unflushed_events"] for p in partitions),
            # the space taken, preallocated zeros included (bytes_preallocated of it)
            "bytes_on_disk": sum(p["size_bytes"] + p["preallocated_bytes"] for p in partitions),
            "bytes_preallocated": sum(p["preallocated_bytes"] for p in partitions),
            "journal_bytes_preallocated": journal.preallocated_bytes if journal else 0,
            "counters": counters,
            "checkpoint": self._checkpointer.status(),
            "recovery": self._state.recovery.to_dict(),
            "losses": self._losses.ledger.summary(),
            "health": health,
            "health_reason": reason,
            "partitions": partitions,
            "subscriptions": subscriptions,
        }

    def _subscription_status(self, sub: Subscription) -> dict[str, Any]:
        """One subscription's queue figures, per partition too, and take counters. Caller
        holds the lock."""
        in_flight = sub.in_flight_events()
        return {
            "id": sub.id,
            "events_untaken": sub.untaken,  # Kafka's consumer lag, summed over partitions
            "events_queued": sub.untaken - in_flight,
            "events_in_flight": in_flight,
            "open_takes": self._takes.in_flight_of(sub),
            "counters": dict(sub.counters),
            "partitions": [self._queue_status(p, q) for p, q in enumerate(sub.queues)],
        }

    def _queue_status(self, p: int, queue: PartitionQueue) -> dict[str, Any]:
        """A subscription's queue on partition p. Caller holds the lock."""
        return {
            "partition": p,
            "taken_through": queue.taken_through,
            "events_queued": queue.queued(self._state.visible_end(p)),
            "events_untaken": queue.untaken(self._state.ends[p]),
            "events_in_flight": queue.in_flight_events(),
        }

    def _partition_status(self, p: int, queue: PartitionQueue) -> dict[str, Any]:
        """One partition's offsets and sizes, and `queue`'s figures. Caller holds the lock."""
        log = self._state.logs[p]
        stats = log.stats()
        return {
            "partition": p,
            "directory": str(log.directory),
            "log_start_offset": log.log_start_offset,
            "log_end_offset": log.log_end_offset,
            # which storage the offsets belong to (log/incarnation.py): for the drains
            "incarnation": log.incarnation.id,
            "incarnation_start_offset": log.incarnation.start_offset,
            "incarnation_pending": log.incarnation.pending,  # a recreate cut short
            "last_stable_offset": self._state.visible_end(p),
            "recovery_point": log.recovery_point,
            "unflushed_events": log.unflushed_events,
            **{k: v for k, v in self._queue_status(p, queue).items() if k != "partition"},
            "size_bytes": log.size_bytes,
            "preallocated_bytes": stats["preallocated_bytes"],  # zeros ahead: disk, not data
            "segments": len(log.segments),
            "offline": stats["offline"],
            "index_rebuilds": stats["index_rebuilds"],  # derived files found wrong at use
            "read_damage": stats["read_damage"],  # damage reads met since open
        }

    def _verify_directories(self) -> None:
        """Take offline each partition whose directory went or was replaced under it (one
        stat each): an owner with nothing to write would not notice otherwise."""
        for log in self._state.logs:
            with contextlib.suppress(LogOfflineError):  # told by the log's stats
                log.verify_directory()

    def health(self) -> tuple[str, str]:
        """The channel's health and why (see the module doc)."""
        self._verify_directories()
        for log in self._state.logs:
            offline = log.stats()["offline"]
            if offline:
                return "unhealthy", f"partition {log.partition} is offline: {offline}"
        if self._state.closed:
            return "unhealthy", "channel is closed"
        if self._home_lock.replaced():
            return "unhealthy", (f"{self.config.home} was deleted or replaced: takes and "
                                 "checkpoints fail until the channel is opened again")
        try:
            check_free_space(self._state.guarded_dirs(), self.config.minimum_required_space,
                             self._state.free_space)
        except ChannelEngineError as exc:
            return "unhealthy", str(exc)
        full = self._puts.disk_full_reason()
        if full is not None:
            return "degraded", full
        unacknowledged = self._losses.ledger.health_reason()
        if unacknowledged is not None:
            return "degraded", unacknowledged
        last = self._checkpointer.last
        if last is not None and last.backup.startswith("failed"):
            return "degraded", f"backup checkpoint {last.backup}"
        if self._state.backlog() >= self.config.capacity:
            return "degraded", "channel is full: puts wait and then fail"
        age = self._state.now_ms() - self._checkpointer.last_ms
        if not self._state.read_only and age > 3 * self.config.checkpoint_interval_ms:
            return "degraded", f"last checkpoint {age} ms ago (interval " \
                               f"{self.config.checkpoint_interval_ms} ms)"
        return "healthy", "ok"



"""OwnerOperations: every operation the owner of a channel offers, written once.

Channel (channel.py) and the transactions send all their work through this
protocol, to whichever satisfies it in the process: the ChannelOwner itself
(channel_owner.py) when this process owns the channel, or an OwnerClient
(owner/client.py) that sends each call over the owner socket. The server
(owner/server.py) answers every call with the ChannelOwner method of the same
name, through the wire codec table in owner/protocol.py;
tests/engine/test_owner_operations.py checks that the protocol, the client and
that table name the same operations with the same parameters.

Concurrency: implementations are thread-safe (the owner under its channel
lock; the client with a connection per thread). Failures are the engine's
errors (errors.py), raised alike in and out of process; over the socket a
lost owner adds OwnerUnreachableError (the call was not sent) and
OwnerLostError (its outcome is unknown).
"""
from __future__ import annotations

from typing import Any, Protocol

from channel_engine.event import Event
from channel_engine.queue.checkpointer import CheckpointResult
from channel_engine.queue.put_batch import Batches


class OwnerOperations(Protocol):
    """The owner's operations, in process (ChannelOwner) or over the socket (OwnerClient)."""

    # -- puts (queue/puts.py) --
    def commit_batches(self, transaction_id: int | None, batches: Batches,
                       partitions: int, movable: bool = False) -> list[tuple[int, int, int]]:
        """Append a put encoded by its producer, in another partition if `movable` and the
        owner chooses so; (partition, first, last) per batch."""
        ...

    def count_rollback(self) -> None:
        """Count a put rolled back before commit (nothing was written)."""
        ...

    def count_failed_put(self, count: int) -> None:
        """Count a put of `count` events that failed in its producer."""
        ...

    # -- takes and leases (queue/takes.py) --
    def begin_take(self, lease_ms: int | None = None, subscription: str = "default") -> int:
        """Start a take transaction (leased if lease_ms); return its id."""
        ...

    def take_events(self, take_id: int, max_events: int) -> list[Event]:
        """Reserve and read up to max_events for a take."""
        ...

    def reserve_ranges(self, take_id: int, max_events: int) -> list[tuple[int, int, int]]:
        """Reserve up to max_events for a take without reading: (partition, start, end)."""
        ...

    def commit_take(self, take_id: int) -> None:
        """Remove a take's events for good."""
        ...

    def rollback_take(self, take_id: int) -> None:
        """Return a take's events to the head of their partitions."""
        ...

    # -- inspection --
    def read(self, partition: int, offset: int, max_events: int = 100) -> list[Event]:
        """Committed events of a partition from `offset` (takes do not move)."""
        ...

    def offsets_for_time(self, partition: int, timestamp: int) -> int | None:
        """Earliest offset of a partition with a timestamp >= `timestamp`."""
        ...

    def list_offsets(self) -> list[tuple[int, int]]:
        """Each partition's (log start offset, last stable offset): what a reader may see."""
        ...

    def status(self, segments: bool = False) -> dict[str, Any]:
        """Everything an operator looks at, as JSON-serialisable data."""
        ...

    # -- maintenance (queue/checkpointer.py, the scheduler's hooks) --
    def flush(self) -> None:
        """Make every committed put and take durable now."""
        ...

    def flush_if_due(self) -> bool:
        """Flush partitions whose flush_ms passed; True if one was."""
        ...

    def checkpoint(self) -> CheckpointResult:
        """Write a checkpoint now (primary, then backup)."""
        ...

    def checkpoint_if_due(self) -> CheckpointResult | None:
        """Checkpoint when checkpoint_interval_ms has passed."""
        ...

    def apply_retention(self) -> dict[str, Any]:
        """Delete what retention allows; what was deleted and dropped."""
        ...

    # -- subscriptions (queue/subscriptions.py) --
    def subscriptions(self) -> list[str]:
        """The channel's subscriptions, `default` first."""
        ...

    def add_subscription(self, name: str, start: Any = "earliest") -> None:
        """Add a subscription starting at `start`; durable on return."""
        ...

    def remove_subscription(self, name: str) -> None:
        """Remove a subscription with no take open (never `default`); durable on return."""
        ...

    def reset_subscription(self, name: str, to: Any) -> None:
        """Move a subscription with no take open to `to`; durable on return."""
        ...

    # -- losses (queue/losses.py) --
    def acknowledge_losses(self) -> int:
        """Acknowledge every loss record, durably; return how many."""
        ...

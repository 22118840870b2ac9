"""Channel: the public handle on a channel, in whichever process opens it.

    from channel_engine import Channel, ChannelConfig

    with Channel.open(ChannelConfig("orders", ["/data/a"], "/data/orders")) as channel:
        with channel.put() as tx:
            tx.put(b"body", key=b"k", headers={"h": b"v"})
        with channel.take() as tx:
            events = tx.take(100)

Many processes open the same channel at once: gunicorn workers, Celery
workers, the Spark driver, the CLI. Exactly one of them owns the channel's
files — the first to take `.lock` in the home with flock — and runs the
channel (ChannelOwner, queue/channel_owner.py, where the semantics live); it also
answers the others on `owner.sock` (owner/server.py). Every other process is a
client of the owner (owner/client.py). This is how a Kafka broker owns its
partitions and serves many producers and consumers, brought to one machine:
one writer per file, so no two processes ever append to one segment, and the
owner shares each fsync among all processes' commits (group commit).

When the owner exits or dies, its flock is released by the kernel, its open
connections close (the takes of a dead client roll back the same way), and the
next operation of any other process elects a new owner, which replays the
checkpoint and journal as after any crash: nothing committed is lost, no
committed take comes back, in-flight takes return to the head of the queue. A
request in flight when the owner died raises OwnerLostError (its outcome is
unknown; a producer retries, as a Kafka producer does after a broker failure).
Channel.create makes a new channel (Kafka's create-topic; ChannelExistsError if one is
there): the creator's word that no channel was there, so its open reports no missing
checkpoint and writes the first one at once. Only it and Channel.open(create=True, the
default) make a missing home or partition directory: a re-election never does. An open
cannot tell a new channel from one whose home and data were wiped together, so
Channel.open(create=True) on an empty place reports the checkpoint missing; with
existed=True (the caller knows the channel was there) it also records the loss of its
state in the loss ledger (queue/channel_owner.py). When the channel was deleted (its home's
channel.json or a partition directory gone) the next operation raises
ChannelGoneError and nothing is written or recreated; the same handle tries the
election again at its next operation.

A Channel belongs to the process that opened it: after fork(), open it again
in the child (using the parent's raises ChannelEngineError).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from channel_engine.disk_space import FreeSpace, free_bytes
from channel_engine.errors import (
    ChannelClosedError,
    ChannelEngineError,
    ChannelExistsError,
    ChannelLockedError,
    InvalidEventError,
    OwnerLostError,
    OwnerUnreachableError,
    PartitionCountError,
    StorageMissingError,
    TransactionStateError,
    UnknownOperationError,
)
from channel_engine.event import Event, PendingEvent
from channel_engine.incarnations import PartitionIncarnation
from channel_engine.log import incarnation as incarnation_file
from channel_engine.log.fetch import DEFAULT_FETCH_BYTES, FetchData
from channel_engine.owner.client import OwnerClient
from channel_engine.owner.server import OwnerServer
from channel_engine.queue.channel_config import ChannelConfig
from channel_engine.queue.channel_owner import ChannelOwner
from channel_engine.queue.checkpointer import CheckpointResult
from channel_engine.queue.home_files import missing_places, missing_saved_places
from channel_engine.queue.operations import OwnerOperations
from channel_engine.queue.put_batch import EncodedPut, Partitioner, encode
from channel_engine.transaction import PutTransaction, TakeTransaction

T = TypeVar("T")


class Channel:
    """A channel opened by this process, as its owner or as a client of its owner."""

    def __init__(self, config: ChannelConfig, read_only: bool, clock: Callable[[], float],
                 free_space: FreeSpace, owner_wait_ms: int) -> None:
        self.config = config
        self.name = config.name
        self.read_only = read_only
        self._clock = clock
        self._free_space = free_space
        self._owner_wait_ms = owner_wait_ms
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._owner: ChannelOwner | None = None
        self._server: OwnerServer | None = None
        self._client: OwnerClient | None = None
        self._partitioner = Partitioner()
        self._partitions: int | None = None  # the owner's count, once it said otherwise
        self._closed = False

    @classmethod
    def open(cls, config: ChannelConfig | str | os.PathLike[str], *, read_only: bool = False,
             clock: Callable[[], float] = time.time, free_space: FreeSpace = free_bytes,
             owner_wait_ms: int = 30_000, create: bool = True,
             existed: bool = False, next_offsets: dict[int, int] | None = None) -> Channel:
        """Open the channel of `config` (or of the home holding its channel.json): as its
        owner if no process owns it, else as a client of the owner. read_only=True opens a
        snapshot of the files instead (for inspection while another process owns them).
        create=False (the drains, the tools: they never make a channel):
        StorageMissingError (a ChannelGoneError) naming what is missing of the channel's
        home (its channel.json) and partition directories, instead of making a new channel
        there (on the root filesystem, under a volume not mounted, say).
        existed=True: the channel was there before, so a missing checkpoint is a lost state,
        recorded in the loss ledger (module doc). next_offsets: partition -> the lowest
        offset a partition directory this open makes again hands out next (the operator's
        recreate above what drains sent: queue/channel_owner.py); applied only when this
        process becomes the owner."""
        if not isinstance(config, ChannelConfig):
            config = ChannelConfig.load(Path(config))
        if not (create or read_only):
            missing = missing_saved_places(config)
            if missing:
                raise StorageMissingError(config.name, missing)
        channel = cls(config, read_only, clock, free_space, owner_wait_ms)
        if read_only:
            channel._owner = ChannelOwner.open(config, read_only=True, clock=clock,
                                               free_space=free_space)
        else:
            channel._elect(create, existed=existed, next_offsets=next_offsets)
        return channel

    @classmethod
    def create(cls, config: ChannelConfig, *, clock: Callable[[], float] = time.time,
               free_space: FreeSpace = free_bytes, owner_wait_ms: int = 30_000) -> Channel:
        """Make a new channel and open it as its owner: its directories, channel.json and
        first checkpoint. ChannelExistsError (nothing written) if its home or a partition
        directory holds a channel's files, or another process owns it; any other failure
        removes what it wrote, so a retry is a create like the first
        (queue/new_channel.py)."""
        channel = cls(config, False, clock, free_space, owner_wait_ms)
        channel._elect(True, new=True)
        return channel

    @staticmethod
    def missing_places(config: ChannelConfig) -> list[Path]:
        """What this channel, if it exists, must have and has not: its home (or its
        channel.json) and each partition directory (queue/home_files.py). A caller that
        knows the channel exists refuses to open it with create=True while any is missing:
        that would make an empty channel in their place (a volume not mounted, say)."""
        return missing_places(config)

    @property
    def role(self) -> str:
        """The role of this process: owner, client, read-only, or electing (changing owner)."""
        if self.read_only:
            return "read-only"
        if self._client is not None:
            return "client"
        return "owner" if self._owner is not None else "electing"

    @property
    def owner(self) -> ChannelOwner | None:
        """The ChannelOwner when this process owns the channel (for tools and tests)."""
        return self._owner

    def _elect(self, create: bool, new: bool = False, existed: bool = False,
               next_offsets: dict[int, int] | None = None) -> None:
        """Become the owner if nobody is, else connect to the owner; wait while a new
        owner is still replaying (up to owner_wait_ms). Only `create` makes missing
        directories: ChannelGoneError otherwise (the channel was deleted)."""
        deadline = time.monotonic() + self._owner_wait_ms / 1000
        while True:
            try:
                owner = ChannelOwner.open(self.config, clock=self._clock,
                                          free_space=self._free_space, create=create, new=new,
                                          existed=existed, next_offsets=next_offsets)
            except ChannelLockedError as exc:
                if new:
                    raise ChannelExistsError(self.config.home, f"owned by {exc.holder}") \
                        from exc
                locked: ChannelLockedError = exc
            else:
                try:
                    server = OwnerServer(owner)
                    server.start()
                except BaseException as exc:
                    if new:  # a create that failed leaves nothing to block a retry
                        owner.discard_created(exc)
                    else:
                        owner.close()
                    raise
                self._owner, self._server, self._client = owner, server, None
                return
            try:
                # a put may wait keep_alive_ms for room in the owner: wait longer for replies
                timeout_s = max(60.0, self.config.keep_alive_ms / 1000 + 30)
                self._client = OwnerClient.connect(self.config, timeout_s)
                return
            except (OSError, OwnerLostError):
                pass
            if time.monotonic() > deadline:
                raise ChannelLockedError(self.config.home, f"{locked.holder}, which does not "
                                         f"answer on owner.sock after "
                                         f"{self._owner_wait_ms} ms")
            time.sleep(0.02)

    def _backend(self) -> OwnerOperations:
        """The owner to send work to, electing a new one if the old one went away."""
        if os.getpid() != self._pid:
            raise ChannelEngineError(f"channel {self.name!r} was opened in process {self._pid} "
                                     f"and used in forked process {os.getpid()}: open it again "
                                     "in this process")
        if self._closed:
            raise ChannelClosedError(f"channel {self.name!r} is closed")
        with self._lock:
            if self._client is not None and self._client.lost:
                self._client.close()
                self._client = None
            if self._client is None and self._owner is None:
                # the owner went away, maybe because its channel was deleted: a new owner
                # replays an existing channel but never makes a deleted one again
                self._elect(create=False)
            backend = self._owner if self._client is None else self._client
            assert backend is not None
            return backend

    def _retrying(self, op: Callable[[OwnerOperations], T],
                  idempotent: bool = True) -> T:
        """Run an operation against the owner; after an owner change, once more — always when
        the request never reached the old owner, else only if the operation is idempotent."""
        try:
            return op(self._backend())
        except OwnerUnreachableError:
            return op(self._backend())
        except OwnerLostError:
            if not idempotent:
                raise
            return op(self._backend())

    # -- transactions -----------------------------------------------------------------------
    def put(self) -> PutTransaction:
        """Begin a put transaction (events are buffered here until commit)."""
        self._check_writable()
        return PutTransaction(self)

    def take(self, lease_ms: int | None = None, subscription: str = "default"
             ) -> TakeTransaction:
        """Begin a take transaction of a subscription (`default` unless named); with
        lease_ms it rolls back by itself unless committed or rolled back within that time."""
        self._check_writable()
        backend = self._backend()
        try:
            take_id = backend.begin_take(lease_ms, subscription)
        except OwnerLostError:  # a take begun in a dead owner holds nothing: start afresh
            backend = self._backend()
            take_id = backend.begin_take(lease_ms, subscription)
        return TakeTransaction(self, backend, take_id, lease_ms)

    # -- subscriptions (queue/subscriptions.py: positions, durability, refusals) --------------
    def subscriptions(self) -> list[str]:
        """The channel's subscriptions, `default` first."""
        return self._retrying(lambda b: b.subscriptions())

    def add_subscription(self, name: str, start: Any = "earliest") -> None:
        """Add a subscription starting at `start` ("earliest", "latest",
        {"timestamp_ms": t} or {partition: offset}); durable on return."""
        self._check_writable()
        self._retrying(lambda b: b.add_subscription(name, start), idempotent=False)

    def remove_subscription(self, name: str) -> None:
        """Remove a subscription with no take open (never `default`); durable on return."""
        self._check_writable()
        self._retrying(lambda b: b.remove_subscription(name), idempotent=False)

    def reset_subscription(self, name: str, to: Any) -> None:
        """Move a subscription with no take open to `to` (as `start` above); durable on
        return (Kafka's kafka-consumer-groups --reset-offsets)."""
        self._check_writable()
        self._retrying(lambda b: b.reset_subscription(name, to), idempotent=False)

    def commit_take(self, take_id: int) -> None:
        """Commit a leased take begun elsewhere (another process of this channel) by its id;
        TakeExpiredError if its lease ran out or its owner changed meanwhile."""
        self._check_writable()
        self._retrying(lambda b: b.commit_take(take_id), idempotent=False)

    def rollback_take(self, take_id: int) -> None:
        """Roll back a leased take begun elsewhere, by its id (nothing if it is gone)."""
        self._check_writable()
        self._retrying(lambda b: b.rollback_take(take_id))

    def commit_put(self, events: Sequence[PendingEvent]) -> list[tuple[int, int, int]]:
        """Commit a put transaction's events (PutTransaction.commit calls this; all or
        nothing): encoded here, committed in the owner, retried only if never sent or refused
        unwritten for another partition count. Returns (partition, first, last) per batch."""
        partitions = self._partitions or self.config.partitions
        for _ in range(3):
            try:
                put = encode(events, self._partitioner, partitions, self.config.compression)
            except InvalidEventError:
                try:
                    self._retrying(lambda b: b.count_failed_put(len(events)))
                except OwnerLostError:
                    pass  # only counters: the failure is the caller's to see
                raise
            try:
                return self._send_put(put)
            except PartitionCountError as exc:  # the owner's count decides where keys go
                partitions = self._partitions = exc.partitions
        raise ChannelEngineError(f"channel {self.name!r}: the partition count kept changing "
                                 "during a put; nothing was written")

    def _send_put(self, put: EncodedPut) -> list[tuple[int, int, int]]:
        return self._retrying(lambda b: b.commit_batches(put.transaction_id, put.batches,
                                                         put.partitions, put.movable),
                              idempotent=False)

    def count_put_rollback(self) -> None:
        """Count a put transaction rolled back before commit (PutTransaction.rollback calls
        this; nothing was written, so only the owner's counters change)."""
        self._retrying(lambda b: b.count_rollback())

    def _check_writable(self) -> None:
        if self.read_only:
            raise TransactionStateError(f"channel {self.name!r} is open read-only")

    # -- maintenance (the Celery tasks call these) ---------------------------------------------
    def flush(self) -> None:
        """Make every committed put and take durable now."""
        self._retrying(lambda b: b.flush())

    def flush_if_due(self) -> bool:
        """The flusher's hook (see ChannelOwner.flush_if_due)."""
        return self._retrying(lambda b: b.flush_if_due())

    def checkpoint(self) -> CheckpointResult:
        """Write a queue checkpoint now (primary, then backup)."""
        return self._retrying(lambda b: b.checkpoint())

    def checkpoint_if_due(self) -> CheckpointResult | None:
        """The checkpointer's hook: checkpoint when checkpoint_interval_ms has passed."""
        return self._retrying(lambda b: b.checkpoint_if_due())

    def apply_retention(self) -> dict[str, Any]:
        """Delete what retention allows (taken segments; untaken data only if opted in)."""
        return self._retrying(lambda b: b.apply_retention())

    def status(self, segments: bool = False) -> dict[str, Any]:
        """Everything an operator looks at, as plain JSON-serialisable data (with each
        partition's segment table when `segments`, from whichever process owns it)."""
        if self.read_only and self._owner is not None:
            status = self._owner.status(segments)
        else:
            status = self._retrying(lambda b: b.status(segments))
        status["role"] = self.role
        status["owner_pid"] = os.getpid() if self._client is None else self._client.owner_pid
        return status

    def acknowledge_losses(self) -> int:
        """An operator has seen every loss in status()["losses"]: acknowledge them all,
        durably, in whichever process owns the channel; return how many records that was."""
        self._check_writable()
        return self._retrying(lambda b: b.acknowledge_losses())

    def read(self, partition: int, offset: int, max_events: int = 100) -> list[Event]:
        """Committed events of one partition from `offset` (inspection: takes do not move)."""
        return self._retrying(lambda b: b.read(partition, offset, max_events))

    def fetch(self, partition: int, start: int, end: int,
              max_bytes: int = DEFAULT_FETCH_BYTES) -> FetchData:
        """Committed batches of one segment from the one holding `start` (log/fetch.py)."""
        backend = self._backend()
        if self._owner is None or backend is not self._owner:  # a client: the files are the
            # owner's, and a descriptor does not travel over the owner socket
            raise ChannelEngineError(f"channel {self.name!r}: fetch reads the files; this "
                                     "process is a client of their owner: open the channel "
                                     "read_only=True to fetch")
        return self._owner.fetch(partition, start, end, max_bytes)

    def offsets_for_time(self, partition: int, timestamp: int) -> int | None:
        """Earliest offset of a partition with a timestamp >= `timestamp` (Kafka's)."""
        return self._retrying(lambda b: b.offsets_for_time(partition, timestamp))

    def list_offsets(self) -> list[tuple[int, int]]:
        """Each partition's (log start offset, last stable offset): the offsets a read may
        ask for, at the cost of one small round trip (not status())."""
        try:
            return self._retrying(lambda b: b.list_offsets())
        except UnknownOperationError:  # an owner older than the op (a rolling upgrade)
            return [(p["log_start_offset"], p["last_stable_offset"])
                    for p in self.status()["partitions"]]

    def incarnations(self) -> list[PartitionIncarnation]:
        """Each partition's incarnation and log end (status()), for the drains' check
        (incarnations.py); an owner older than incarnations says none: the partition
        directories' own files are read instead."""
        parts = self.status()["partitions"]
        return [PartitionIncarnation(
            p["partition"], *self._incarnation_of(p), p["log_end_offset"], p["directory"])
            for p in parts]

    def _incarnation_of(self, part: dict[str, Any]) -> tuple[str, int]:
        """(incarnation, start offset) of a partition's status; read from its directory
        when the owner is older than incarnations and its status names none."""
        if "incarnation" in part:
            return str(part["incarnation"]), int(part["incarnation_start_offset"])
        found = incarnation_file.read(Path(part["directory"]))
        return found.id, found.start_offset

    # -- closing ----------------------------------------------------------------------------
    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close: an owner stops answering, checkpoints (checkpoint_on_close) and releases the
        lock, so another process becomes the owner; a client closes its connections (its
        open takes roll back)."""
        if self._closed or os.getpid() != self._pid:
            return
        self._closed = True
        if self._client is not None:
            self._client.close()
        if self._server is not None:
            self._server.stop()
        if self._owner is not None:
            self._owner.close()

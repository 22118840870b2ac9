"""Puts: how the owner commits a put transaction — limits, appends, the commit point,
durability, and the disk-full state.

The producing process groups a transaction's events by partition (by the
murmur2 hash of the key, as Kafka does, or all keyless events to one partition
chosen round-robin per transaction) and encodes one record batch per partition
(put_batch.py). A movable put (keyless, one partition) may be appended to another
partition, where concurrent puts share its fsync (put_placement.py). Commit here:
check every batch, check the disk guard, encrypt, wait up to keep_alive_ms for
room under `capacity`, then append them; bad input fails before anything is
written. A put the disk cannot hold (DiskFullError:
ENOSPC/EDQUOT, undone) is counted (disk_full_errors) and keeps the channel
"degraded" until a put succeeds or the space it needed is free again. A put
that touches one partition is one plain batch: atomic by itself. A put that
touches several writes one transactional batch per partition, then a commit
record to the journal; that record is the commit point (recovery aborts
transactional batches without one). Takes see, per partition, the prefix of
the log up to the first put not yet committed — Kafka's last stable offset —
so no uncommitted event is ever taken. An aborted put's batches stay in the log;
its offsets leave every queue and are kept (ChannelState.aborted, in the
checkpoint), and reads and fetches skip them (Kafka's read_committed).

Durability. In fsync mode a put commit returns after its batches (and, for a
multi-partition put, its journal record) are fsynced; concurrent committers
share fsyncs (group commit). In policy mode, flush_messages / flush_ms bound
what a crash may lose; flush() and the scheduler's flush_if_due() make the
rest durable. In both modes a multi-partition put's batches are fsynced before
its commit record and stamps are written (those may reach the disk at any time
after), so a power loss never keeps part of a committed put: it keeps all, or
(record lost, policy mode) aborts all. So in policy mode the events of
multi-partition puts whose record is not yet synced count toward
flush_messages in each partition they touch, with the log's unflushed appends:
a put that brings a partition to flush_messages syncs the journal before it
returns (_bound_loss_window), and a power loss loses fewer than flush_messages
committed events of a partition, as in a partition log.

A put commits in two halves, begin (checks, room, appends) and finish (durability,
the commit point, the put resolved): commit_batches runs both; the owner's socket loop
begins every put that arrived together, then finishes each, so one fsync serves them
all without a thread per put (owner/server.py). A multi-partition put is flushed batch
by batch as begin writes it, as its commit point needs anyway: the batches written
before an append that fails are then on disk, as the log's end says, and readable.
The loop never waits for room: begin(wait=False) raises RoomWouldWait instead, having
written and counted nothing.

Concurrency: thread-safe. A batch is appended under its partition's append
lock, registered under the channel lock (channel_state.py); fsyncs happen
outside both. A put that fails part way takes its batches out of the queue
(aborted, as recovery would) and gives its room back.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from channel_engine.disk_space import check_free_space
from channel_engine.errors import (
    ChannelFullError,
    DiskFullError,
    PartitionCountError,
    RoomWouldWait,
    TransactionCapacityError,
)
from channel_engine.log.record_batch import BatchHeader, record_objects
from channel_engine.queue import commit_journal, put_batch
from channel_engine.queue.channel_state import ChannelState, UnresolvedPut
from channel_engine.queue.put_batch import Batches
from channel_engine.queue.put_placement import PutPlacement
from channel_engine.queue.takes import Takes


@dataclass(eq=False)
class PendingPut:
    """A put between Puts.begin and Puts.finish: written, not yet durable or committed."""

    transaction_id: int | None
    batches: Batches  # where it is written: the producer's, or the placement's partition
    count: int  # events
    placed: int | None = None  # the partition PutPlacement placed it in (finished() owed)
    written: list[tuple[int, int]] = field(default_factory=list)  # (partition, put id)
    # (partition, flush to, truncation epoch written in): finish's flushes
    flushes: list[tuple[int, int, int]] = field(default_factory=list)


class Puts:
    """The owner's put side: commit_batches and its counters; see the module doc."""

    def __init__(self, state: ChannelState, takes: Takes) -> None:
        self._state = state
        self._takes = takes  # expires lapsed leases while a put waits for room
        self.config = state.config
        self.name = state.name
        self._put_ids = 0
        self._placement = PutPlacement(self.config.partitions, self._may_place_in)
        # policy durability: multi-partition put records not known synced, (journal, ticket,
        # events per partition), which count toward flush_messages (_bound_loss_window)
        self._unsynced_puts: deque[tuple[commit_journal.CommitJournal, int, dict[int, int]]] \
            = deque()
        # the last put refused for a full disk: (directory, bytes it needed, why), until a
        # put succeeds or that much space is free again; health is degraded meanwhile
        self._disk_full: tuple[Path, int, str] | None = None

    def commit_batches(self, transaction_id: int | None, batches: Batches,
                       partitions: int, movable: bool = False) -> list[tuple[int, int, int]]:
        """Append a put transaction encoded by its producer (put_batch.encode) for
        `partitions` partitions; return (partition, first, last) per batch. Every batch is
        checked before any is written. A `movable` put (keyless, one batch) may go to
        another partition than its producer's pick, in fsync durability (put_placement.py)."""
        return self.finish(self.begin(transaction_id, batches, partitions, movable))

    def begin(self, transaction_id: int | None, batches: Batches, partitions: int,
              movable: bool = False, wait: bool = True) -> PendingPut:
        """The first half of commit_batches: check the put, reserve its room and write its
        batches; finish() makes it durable and committed. Puts begun one after another and
        then finished share their fsync (owner/server.py's loop). With `wait` False, a put
        that would wait for room raises RoomWouldWait instead, having written and counted
        nothing (the caller begins it again where it may wait)."""
        self._state.check_writable()
        if partitions != self.config.partitions:  # keys must land where everyone puts them
            raise PartitionCountError(self.name, self.config.partitions, partitions)
        headers = self._check_put(transaction_id, batches)
        put = PendingPut(transaction_id, batches, sum(h.record_count for h in headers))
        if movable and len(batches) == 1 and self.config.durability == "fsync":
            # (policy durability: the put returns before any fsync, so none to share)
            (wanted, batch), = batches
            put.placed = self._placement.place(wanted, len(batch))
            if put.placed != wanted and _has_keys(batch):  # a key's order: never the client's
                self._placement.finished(put.placed)
                put.placed = None
            else:
                put.batches = [(put.placed, batch)]
        try:
            self._write(put, wait)
        except RoomWouldWait:
            if put.placed is not None:
                self._placement.finished(put.placed)
            raise
        except BaseException as exc:
            self._failed(put, exc)
            raise
        return put

    def finish(self, put: PendingPut) -> list[tuple[int, int, int]]:
        """The second half of commit_batches: make a begun put durable (per the durability)
        and committed; return (partition, first, last) per batch."""
        try:
            for partition, flush_to, epoch in put.flushes:
                self._state.logs[partition].flush_to(flush_to, epoch)
            if put.transaction_id is not None:
                self._flush_parts(put.written)
                self._journal_put(put.transaction_id, put.written)
            if self._unsynced_puts:
                self._bound_loss_window([p for p, _ in put.written])
        except BaseException as exc:
            self._abort_put(put.written, put.count)
            self._failed(put, exc)
            raise
        with self._state.lock:
            committed = []
            for partition, put_id in put.written:
                resolved = self._state.unresolved[partition].pop(put_id)
                committed.append((partition, resolved.start, resolved.end - 1))
            self._state.counters["put_attempts"] += put.count
            self._state.counters["put_successes"] += put.count
        self._disk_full = None
        if put.placed is not None:
            self._placement.finished(put.placed)
        return committed

    def _may_place_in(self, partition: int) -> bool:
        """Whether a movable put may be moved to `partition`: its log is not offline and
        its data dir is not the one of the last DiskFullError (put_placement.py)."""
        if self._state.logs[partition].state.offline is not None:
            return False
        full = self._disk_full
        if full is None:
            return True
        data_dir = self.config.partition_dir(partition).parent
        return full[0] != data_dir and data_dir not in full[0].parents

    def _failed(self, put: PendingPut, exc: BaseException) -> None:
        """Count a put that failed (nothing of it is left in any queue)."""
        with self._state.lock:
            self._state.counters["put_attempts"] += put.count
            self._state.counters["put_errors"] += 1
            self._state.counters["rollbacks"] += 1
            if isinstance(exc, DiskFullError):
                self._state.counters["disk_full_errors"] += 1
                needed = sum(len(batch) for _, batch in put.batches)
                self._disk_full = (Path(exc.directory), needed, str(exc))
        if put.placed is not None:
            self._placement.finished(put.placed, failed=True)

    def _check_put(self, transaction_id: int | None,
                   batches: Batches) -> list[BatchHeader]:
        partitions = [partition for partition, _ in batches]
        if not batches or partitions != sorted(set(partitions)):
            raise ValueError(f"channel {self.name!r}: a put needs one batch per partition it "
                             f"touches, in partition order, not {partitions}")
        if (transaction_id is None) != (len(batches) == 1):
            raise ValueError(f"channel {self.name!r}: a put across partitions needs a "
                             "transaction id, and only such a put has one")
        return [put_batch.check(batch, partition, self.config.partitions, transaction_id)
                for partition, batch in batches]

    def _write(self, put: PendingPut, wait: bool) -> None:
        """Reserve the put's room and append its batches (their fsync deferred to finish)."""
        count = put.count
        if count > self.config.transaction_capacity:  # clients check too; the owner decides
            raise TransactionCapacityError(self.name, count, self.config.transaction_capacity)
        if self.config.minimum_required_space > 0:  # else no stat per put for nothing
            check_free_space(self._state.guarded_dirs(), self.config.minimum_required_space,
                             self._state.free_space)
        ready = [(p, self._state.logs[p].prepare_batch(bytearray(batch)))
                 for p, batch in put.batches]
        self._wait_for_room(count, wait)
        try:
            for partition, batch in ready:
                put_id, flush = self._append(partition, batch, put.transaction_id)
                put.written.append((partition, put_id))
                if flush is None:
                    continue
                if put.transaction_id is None:  # finish flushes: puts begun together share it
                    put.flushes.append((partition, *flush))
                else:  # each as written, so the batches before a refused one are on disk
                    self._state.logs[partition].flush_to(*flush)  # (aborted: below the HW)
        except BaseException:
            self._abort_put(put.written, count)
            raise

    def count_rollback(self) -> None:
        """A put transaction was rolled back before commit (nothing was written)."""
        with self._state.lock:
            self._state.counters["rollbacks"] += 1

    def count_failed_put(self, count: int) -> None:
        """A put of `count` events failed in its producer before reaching the owner."""
        with self._state.lock:
            self._state.counters["put_attempts"] += count
            self._state.counters["put_errors"] += 1
            self._state.counters["rollbacks"] += 1

    def _wait_for_room(self, count: int, wait: bool = True) -> None:
        """Reserve room for `count` events, waiting up to keep_alive_ms (Flume keep-alive);
        RoomWouldWait at once if it would wait and `wait` is False."""
        capacity = self.config.capacity
        deadline = time.monotonic() + self.config.keep_alive_ms / 1000
        with self._state.room:  # the slowest subscription's backlog is what must fit
            while self._state.backlog() + count > capacity:
                self._takes.expire()
                if not wait and self._state.backlog() + count > capacity:
                    raise RoomWouldWait(self.name)
                left = deadline - time.monotonic()
                if left <= 0 or self._state.closing:
                    raise ChannelFullError(self.name, count, self._state.backlog(), capacity,
                                           self.config.keep_alive_ms)
                self._state.room.wait(min(left, 0.05))
            self._state.add_untaken(count)

    def _append(self, partition: int, batch: bytearray,
                transaction_id: int | None) -> tuple[int, tuple[int, int] | None]:
        """Append one batch and register it as unresolved; return its put id and the offset
        to flush to with the truncation epoch it was written in, if the durability or flush
        policy asks for a flush (the caller flushes
        outside the locks, sharing the fsync with concurrent committers)."""
        log = self._state.logs[partition]
        with self._state.append_locks[partition]:
            result = log.append_batch(batch, defer_flush=True)
            with self._state.lock:
                self._put_ids += 1
                put_id = self._put_ids
                self._state.unresolved[partition][put_id] = UnresolvedPut(
                    result.first_offset, result.next_offset, transaction_id,
                    result.segment_base_offset, result.position)
                self._state.ends[partition] = result.next_offset
        return put_id, (result.next_offset, result.epoch) if result.flush_due else None

    def _flush_parts(self, written: list[tuple[int, int]]) -> None:
        """Make a multi-partition put's batches durable before its commit decision. The
        record and the stamps may reach the disk at any time once written (page writeback),
        so in policy durability too: else a power loss may keep the decision and one
        partition's batch and lose another's, and deliver part of a committed put."""
        if self.config.durability == "fsync":
            return  # _append's flush_due flushed every batch already
        with self._state.lock:
            ends = [(p, self._state.unresolved[p][put_id].end) for p, put_id in written]
        for partition, end in ends:
            self._state.logs[partition].flush_to(end)

    def _journal_put(self, transaction_id: int, written: list[tuple[int, int]]) -> None:
        """The commit point of a multi-partition put: its journal record (synced in fsync
        mode). Then each batch is stamped committed, so the decision outlives the journal."""
        with self._state.lock:
            puts = [(p, self._state.unresolved[p][put_id]) for p, put_id in written]
            for _, put in puts:
                put.journalled = True  # a checkpoint from now on counts it committed
            journal = self._state.live_journal()
            ticket = journal.append(commit_journal.PUT, transaction_id,
                                    [(p, put.start, put.end) for p, put in puts])
            if self.config.durability != "fsync":
                self._unsynced_puts.append(
                    (journal, ticket, {p: put.end - put.start for p, put in puts}))
        if self.config.durability == "fsync":
            journal.sync(ticket)
        for p, put in puts:
            self._state.logs[p].mark_committed(put.segment_base_offset, put.position)

    def _bound_loss_window(self, partitions: Sequence[int]) -> None:
        """Policy durability: a multi-partition put is lost with its commit record, which
        only a flush syncs; so the events of puts whose record is not known synced count
        toward a partition's flush_messages with the log's unflushed events. Sync the journal
        before a put returns that brought a partition it touched to flush_messages: a power
        loss then loses fewer than flush_messages committed events of a partition, puts of
        one partition or of several alike."""
        limit = self.config.flush_messages
        if limit is None:
            return
        with self._state.lock:
            unsynced = self._unsynced_puts
            while unsynced and unsynced[0][0].synced(unsynced[0][1]):
                unsynced.popleft()
            pending = dict.fromkeys(partitions, 0)
            for _, _, events in unsynced:
                for p in pending:
                    pending[p] += events.get(p, 0)
            if not any(n and n + self._state.logs[p].unflushed_events >= limit
                       for p, n in pending.items()):
                return
            upto = {journal: ticket for journal, ticket, _ in unsynced}  # the last, each
        for journal, ticket in upto.items():
            journal.sync(ticket)

    def _abort_put(self, written: list[tuple[int, int]], count: int) -> None:
        """A put failed part way: its written batches leave the queue, undelivered (recovery
        aborts them the same way: no commit record), and its room is given back."""
        with self._state.room:
            for partition, put_id in written:
                put = self._state.unresolved[partition].pop(put_id, None)
                if put is not None:  # out of every queue; the room given back below
                    for sub in self._state.subscriptions.values():
                        sub.queues[partition].mark_committed([(put.start, put.end)])
                    self._state.aborted[partition].append((put.start, put.end))
                    self._state.counters["aborted_events"] += put.end - put.start
            self._state.add_untaken(-count)
            self._state.room.notify_all()

    def disk_full_reason(self) -> str | None:
        """Why puts fail for a full disk, until a put succeeds or the space it needed (above
        minimum_required_space) is free again."""
        full = self._disk_full
        if full is None:
            return None
        directory, needed, why = full
        try:
            free = self._state.free_space(directory)
        except OSError:
            free = 0
        if free >= needed + self.config.minimum_required_space:
            self._disk_full = None
            return None
        return f"the disk is full: a put failed ({why}); {free} bytes free, it needed {needed}"


def _has_keys(batch: bytes | bytearray) -> bool:
    """Whether a record of a plain batch has a key (one that does not decode counts as
    keyed: it stays where its producer put it)."""
    try:
        return any(record.key is not None for record in record_objects(bytes(batch)))
    except Exception:  # undecodable: the producer's pick, as without placement
        return True

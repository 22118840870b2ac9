"""ChannelOwner: the channel as run by the one process that owns its files —
Flume's FileChannel on Kafka's log: put and take transactions over 1..N
partition logs, with queue checkpoints, a commit journal and crash replay.

Other processes reach it through the owner socket (owner/server.py); callers
use Channel (channel.py), which picks the role. The owner holds `.lock` in the
home with flock for as long as it has the channel open.

Files: partition i is a PartitionLog in `partition_dir(i)`; the home
(checkpoint_dir) holds channel.json, `checkpoint` (checkpoint.py), the commit
journals `commits-<G>.journal` (commit_journal.py) and `.lock`, which the
owner holds with flock (so a second would-be owner gets ChannelLockedError and
becomes a client instead); a lock taken on a `.lock` unlinked meanwhile (by an open
letting go of a deleted channel) is dropped and taken again on the file there now, so
that two owners never share one home. read_only=True opens a snapshot without the lock.
Only an open with create=True (a new channel; Channel.open's first election) makes
a missing home or partition directory; create=False (every re-election) raises
ChannelGoneError when the home holds no channel.json or a saved partition's
directory is missing — the channel was deleted — and creates nothing (new
partitions of a grown channel are still made).
A writable open, under the lock: moves anything but a regular file in place of
channel.json, the checkpoints or losses.json to `<name>.stray`
(home_files.not_regular); keeps a channel.json that fails to load (its crc32c,
say) aside as `channel.json.damaged` and saves the given config; moves strays
aside; then loads the key file (a ConfigError naming it if it is missing or
damaged: it cannot be rebuilt) and the partitions. Each move is a line in
`recovery.problems`.

Puts. The producing process groups a transaction's events by partition (by
the murmur2 hash of the key, as Kafka does, or all keyless events to one
partition chosen round-robin per transaction) and encodes one record batch per
partition (put_batch.py). Commit here: check every batch, check the disk
guard, encrypt, wait up to keep_alive_ms for room under `capacity`, then append
them; bad input fails before anything is written. A put the disk cannot hold
(DiskFullError: ENOSPC/EDQUOT, undone) is counted (disk_full_errors) and keeps the
channel "degraded" until a put succeeds or the space it needed is free again.
A put that touches one partition is one plain batch: atomic by itself. A put
that touches several writes one transactional batch per partition, then a
commit record to the journal; that record is the commit point (recovery
aborts transactional batches without one). Takes see, per partition, the
prefix of the log up to the first put not yet committed — Kafka's last stable
offset — so no uncommitted event is ever taken.

Durability. In fsync mode a put commit returns after its batches (and, for a
multi-partition put, its journal record) are fsynced, and a take commit after
its journal record is; concurrent committers share fsyncs (group commit). In
policy mode, flush_messages / flush_ms bound what a crash may lose; flush()
and the scheduler's flush_if_due() make the rest durable. In both modes a
multi-partition put's batches are fsynced before its commit record and stamps
are written (those may reach the disk at any time after), so a power loss
never keeps part of a committed put: it keeps all, or (record lost, policy
mode) aborts all. So in policy mode the events of multi-partition puts whose
record is not yet synced count toward flush_messages in each partition they
touch, with the log's unflushed appends: a put that brings a partition to
flush_messages syncs the journal before it returns (_bound_loss_window), and a
power loss loses fewer than flush_messages committed events of a partition, as
in a partition log.

Losses. Offsets a log can no longer deliver (PartitionLog.take_new_losses: at open,
and whenever a read meets damage) and offsets the queue knew beyond a log's end
leave the queue as if taken (PartitionQueue.mark_lost); the events among them not
yet taken are counted lost and recorded in the loss ledger, `losses.json` in the
home (loss_ledger.py), durably before the marking is: at open by the checkpoint
that follows, later by a take-commit journal record with take id 0 (so a crash
neither delivers nor counts them again). A take returns only offsets it still
holds after its read's losses are counted, and offsets it held but could not read
are counted lost too, so a take commit never marks taken an event it did not
return. Counts never under-count; when they can over-count (an offset a take returned
and has not yet committed, met damaged by another read) is in loss_ledger.py. A
checkpoint's commit journal found missing or headless at open is recorded
there too (no event lost, but committed takes may come back: at most the
events_may_come_back_at_most of the recovery report). Health stays "degraded"
until an operator acknowledges every record (acknowledge_losses).

Takes by id (commit_take / rollback_take, for takes begun in another process): the
owner remembers how its last FINISHED_TAKES takes ended, so a repeated commit or a
rollback after commit raises TakeCommittedError, and a commit after rollback or expiry
a TakeExpiredError that says which (older takes, or after an owner change: "gone").

Checkpoints copy the queue state (a few ranges per partition) under the
channel lock, rotate the journal, and write primary then backup outside the
lock. Then segments every event of which is taken (by both checkpoint copies)
are deleted, and journals older than both copies removed.

Thread-safe. One lock guards the queue state; appends to one partition are
serialised by that partition's lock; fsyncs happen outside both.
"""
from __future__ import annotations

import contextlib
import fcntl
import heapq
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from channel_engine.atomic_file import move_aside, open_lock_file
from channel_engine.disk_space import FreeSpace, check_free_space, free_bytes
from channel_engine.encryption import BatchSealer, KeyRing
from channel_engine.errors import (
    ChannelClosedError,
    ChannelEngineError,
    ChannelFullError,
    ChannelGoneError,
    ChannelLockedError,
    ConfigError,
    DiskFullError,
    PartitionCountError,
    ReadOnlyLogError,
    StorageError,
    TakeCommittedError,
    TakeExpiredError,
    TransactionCapacityError,
    UnusableFileError,
)
from channel_engine.event import Event
from channel_engine.filenames import DAMAGED_SUFFIX, STRAY_SUFFIX
from channel_engine.log.partition_log import PartitionLog
from channel_engine.log.record_batch import ENCRYPTED_MASK, BatchHeader, unseal
from channel_engine.log.recovery import LostRange
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal, put_batch
from channel_engine.queue.channel_config import CONFIG_FILE, ChannelConfig
from channel_engine.queue.channel_recovery import ChannelRecovery, restore
from channel_engine.queue.checkpointer import CheckpointResult
from channel_engine.queue.home_files import find_strays, not_regular
from channel_engine.queue.loss_ledger import LEDGER_FILE, LossLedger, deliverable
from channel_engine.queue.partition_queue import PartitionQueue
from channel_engine.queue.put_batch import Batches

LOCK_FILE = ".lock"
CHECKPOINT_HISTORY = 20
FINISHED_TAKES = 10_000  # takes whose ending is remembered (a few hundred KiB)
COMMITTED, ROLLED_BACK, EXPIRED = "committed", "rolled back", "expired"


@dataclass
class _Put:
    """A put appended to one partition and not yet resolved (committed or aborted)."""

    start: int
    end: int
    transaction_id: int | None
    segment_base_offset: int
    position: int
    journalled: bool = False  # its commit record is written: decided, not pending


@dataclass
class _Take:
    """A take transaction's reservation: its partitions and lease deadline."""

    partitions: set[int] = field(default_factory=set)
    deadline_ms: int | None = None
    lease_ms: int | None = None
    taken: int = 0


class ChannelOwner:
    """The channel in the process that owns its files; see the module doc."""

    def __init__(self, config: ChannelConfig, read_only: bool, clock: Any,
                 free_space: FreeSpace) -> None:
        self.config = config
        self.name = config.name
        self.read_only = read_only
        self._clock = clock
        self._free_space = free_space
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # capacity freed
        self._checkpoint_lock = threading.Lock()
        self._lock_fd = -1
        self._logs: list[PartitionLog] = []
        self._queues: list[PartitionQueue] = []
        self._append_locks: list[threading.Lock] = []
        self._ends: list[int] = []  # per partition: end of the appends registered here
        self._unresolved: list[dict[int, _Put]] = []
        self._put_ids = 0
        self._takes: dict[int, _Take] = {}
        # how the last FINISHED_TAKES takes ended, so a repeated commit or a late rollback
        # is answered truly (committed / rolled back / expired), not guessed
        self._finished: OrderedDict[int, str] = OrderedDict()
        self._last_batch: list[tuple[int, int, list[Event]] | None] = []
        self._lease_heap: list[tuple[int, int]] = []  # (deadline_ms, take id)
        self._take_ids = 0
        self._next_take_partition = 0
        self._untaken = 0  # committed or in-doubt puts not yet taken and committed
        self._journal: commit_journal.CommitJournal | None = None
        # policy durability: multi-partition put records not known synced, (journal, ticket,
        # events per partition), which count toward flush_messages (_bound_loss_window)
        self._unsynced_puts: deque[tuple[commit_journal.CommitJournal, int, dict[int, int]]] \
            = deque()
        self._sequence = 0
        self._backup_sequence = 0
        self._backup_taken: list[int] | None = None
        self._checkpoint_taken: list[int] = []  # taken_through per partition, last checkpoint
        self._last_checkpoint: CheckpointResult | None = None
        self._checkpoint_history: deque[CheckpointResult] = deque(maxlen=CHECKPOINT_HISTORY)
        self._last_checkpoint_ms = 0
        self._closing = False
        self._closed = False
        self.recovery = ChannelRecovery()
        self._ledger = LossLedger(config.home / LEDGER_FILE, writable=False)
        self.counters = dict.fromkeys(
            ("put_attempts", "put_successes", "put_errors", "take_attempts", "take_successes",
             "take_errors", "rollbacks", "takes_expired", "aborted_events", "dropped_events",
             "lost_events", "checkpoint_write_errors", "checkpoint_backup_write_errors",
             "disk_full_errors"), 0)
        # the last put refused for a full disk: (directory, bytes it needed, why), until a
        # put succeeds or that much space is free again; health is degraded meanwhile
        self._disk_full: tuple[Path, int, str] | None = None

    # -- opening and closing ----------------------------------------------------------------
    @classmethod
    def open(cls, config: ChannelConfig | str | os.PathLike[str], *, read_only: bool = False,
             clock: Any = time.time, free_space: FreeSpace = free_bytes,
             force_recovery: bool = False, create: bool = True) -> ChannelOwner:
        """Open the channel of `config`, or of the home directory holding its channel.json;
        replay whatever followed the last checkpoint. A writable open with `create` makes
        missing directories (a new channel); create=False raises ChannelGoneError instead
        (the channel was deleted: an owner re-elected after it must not bring it back).
        force_recovery: CRC-check every batch of every partition (`recover`'s repair)."""
        if not isinstance(config, ChannelConfig):
            config = ChannelConfig.load(Path(config))
        channel = cls(config, read_only, clock, free_space)
        try:
            channel._open(force_recovery, create)
        except BaseException:
            channel._abandon()
            raise
        return channel

    def _open(self, force_recovery: bool = False, create: bool = True) -> None:
        config = self.config
        home = config.home
        strays: list[str] = []
        saved_partitions = config.partitions  # partitions whose directory must exist
        if self.read_only:
            if not home.is_dir():
                raise FileNotFoundError(f"{home}: no channel home here")
        elif create:
            try:
                home.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a file in its place, say
                raise UnusableFileError(home, "the channel's home directory", exc) from exc
            strays = self._take_channel_lock()
        else:
            self._check_not_deleted()
            try:
                strays = self._take_channel_lock()
            except UnusableFileError:
                self._check_not_deleted()  # the home went meanwhile
                raise
            self._check_not_deleted()  # deleted while the lock was taken: let go of it
        if not self.read_only:
            strays += _move_not_regular(config)
            saved_strays, saved_partitions = self._check_against_saved()
            strays += saved_strays
            try:
                config.save(create=create)
            except FileNotFoundError:
                self._check_not_deleted()
                raise
            strays += _move_home_strays(config)
        log_config = config.log_config()
        keys = None
        if config.encryption_key_file is not None:
            keys = KeyRing.load(config.encryption_key_file, str(config.encryption_active_key))
        for partition in range(config.partitions):
            sealer = None if keys is None else BatchSealer(keys, config.name, partition)
            self._logs.append(PartitionLog.open(
                config.partition_dir(partition), log_config, partition=partition,
                read_only=self.read_only, clock=self._clock, sealer=sealer,
                force_recovery=force_recovery,
                create=create or partition >= saved_partitions))  # a new partition: grown
            self._append_locks.append(threading.Lock())
            self._unresolved.append({})
            self._last_batch.append(None)
        for log in self._logs:
            _check_last_batch_opens(log)
        if not self.read_only:
            for log in self._logs:
                if log.unflushed_events:
                    log.flush()
        backup = self._backup_dir()
        restored = restore(home, backup if backup is not None and backup.is_dir() else None,
                           self._logs)
        self._queues = restored.queues
        self._ends = [log.log_end_offset for log in self._logs]
        self._untaken = sum(q.untaken(end) for q, end in zip(self._queues, self._ends,
                                                                strict=True))
        self._sequence = self._backup_sequence = restored.sequence
        if not self.read_only:
            for p, segment_base, position in restored.to_mark:
                self._logs[p].mark_committed(segment_base, position)
        self.recovery = restored.report
        if not self.read_only:
            self.recovery.problems += strays
        self.counters["aborted_events"] += restored.report.aborted_events
        self.counters["dropped_events"] += restored.report.dropped_events
        self._last_checkpoint_ms = self._now_ms()
        # a checkpoint written before ledgers existed (v1, v2) has none beside it: an upgrade
        keeps_ledger = restored.report.checkpoint_version >= checkpoint_file.LEDGER_VERSION
        self._ledger = LossLedger.load(home, not self.read_only, keeps_ledger, self._now_ms())
        self._count_losses(restored.lost, at_open=True)  # before the checkpoint below
        self._count_unknown_journals()  # recorded before the checkpoint below hides it
        if not self.read_only:
            self._sequence = restored.next_generation - 1
            # take ids never repeat across owners: a stale id from a previous owner (an HTTP
            # consumer's, say) must not address a new take
            self._take_ids = restored.next_generation << 32
            self.checkpoint()  # the replayed state becomes the new base; old journals go

    def _backup_dir(self) -> Path | None:
        config = self.config
        if config.use_dual_checkpoints and config.backup_checkpoint_dir:
            return Path(config.backup_checkpoint_dir)
        return None

    def _take_channel_lock(self) -> list[str]:
        """Take `.lock`; return a line for the recovery report if a non-regular file in its
        place was moved aside (atomic_file.open_lock_file)."""
        path = self.config.home / LOCK_FILE
        while True:
            fd, moved = open_lock_file(path, "the channel's lock file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown pid"
                os.close(fd)
                raise ChannelLockedError(self.config.home, holder) from None
            if _names_file(path, fd):
                break
            # the file was unlinked between our open and our flock (an open of a deleted
            # channel lets go of the lock file it made): a lock on it excludes no one
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode(), 0)
        self._lock_fd = fd
        return [] if moved is None else [f"{path}: not a regular file, moved aside to {moved}; "
                                         "the engine writes a new one"]

    def _check_not_deleted(self) -> None:
        """ChannelGoneError unless the home still holds channel.json (an open that may not
        create: the channel's directories are being or were removed)."""
        if not os.path.lexists(self.config.home / CONFIG_FILE):
            if self._lock_fd >= 0:
                _unlink_if_same(self.config.home / LOCK_FILE, self._lock_fd)
            raise ChannelGoneError(f"channel {self.name!r}: {self.config.home} holds no "
                                   f"{CONFIG_FILE} (the channel was deleted); not recreated, "
                                   "nothing written")

    def _check_against_saved(self) -> tuple[list[str], int]:
        """Refuse changes that would strand events: another name or other data dirs (the
        partitions live where they are), fewer partitions (keys would move). Everything
        else may change between opens, capacity included. A damaged channel.json is kept
        aside (`channel.json.damaged`) for the save of the given config; return a line
        for the recovery report then, and the saved partition count (the given one if
        none was saved)."""
        path = self.config.home / CONFIG_FILE
        try:
            saved = ChannelConfig.load(path)
        except ConfigError as exc:
            if not path.is_file():
                return [], self.config.partitions
            target = move_aside(path, DAMAGED_SUFFIX)
            return [f"{path}: damaged ({exc.reason}); kept aside as {target}, rewritten from "
                    "the given config"], self.config.partitions
        for name in ("name", "data_dirs"):
            if getattr(saved, name) != getattr(self.config, name):
                raise ConfigError(name, f"channel in {self.config.home} has {name}="
                                        f"{getattr(saved, name)!r}; it cannot change (its "
                                        "partition logs live there)")
        if saved.partitions > self.config.partitions:
            raise ConfigError("partitions", f"channel {self.name!r} has {saved.partitions} "
                                            f"partitions; it cannot shrink to "
                                            f"{self.config.partitions}")
        return [], saved.partitions

    def _abandon(self, clean: bool = True) -> None:
        """Release what a failed open acquired (clean=False: write nothing while at it)."""
        for log in self._logs:
            try:
                log.close(clean=clean)
            except ChannelEngineError:
                pass
        if self._journal is not None:
            self._journal.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> ChannelOwner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Checkpoint (if checkpoint_on_close), close the logs cleanly, release the lock.
        Open take transactions roll back: their events stay queued."""
        with self._lock:
            if self._closing:
                return
            self._closing = True  # from here on, takes are gone and puts are refused
        gone = not self.read_only and self._home_replaced()
        try:
            if not self.read_only and self.config.checkpoint_on_close and not gone:
                self._checkpoint()
        finally:
            self._closed = True
            with self._room:
                self._room.notify_all()
            # a home deleted or replaced under us is not ours: no checkpoint, no clean flags
            self._abandon(clean=not gone)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _check_writable(self) -> None:
        if self._closing:
            raise ChannelClosedError(f"channel {self.name!r} is closed")
        if self.read_only:
            raise ReadOnlyLogError(f"channel {self.name!r} is open read-only")

    # -- put --------------------------------------------------------------------------------
    def commit_batches(self, transaction_id: int | None, batches: Batches,
                       partitions: int) -> list[tuple[int, int, int]]:
        """Append a put transaction encoded by its producer (put_batch.encode) for
        `partitions` partitions; return (partition, first, last) per batch. Every batch is
        checked before any is written."""
        self._check_writable()
        if partitions != self.config.partitions:  # keys must land where everyone puts them
            raise PartitionCountError(self.name, self.config.partitions, partitions)
        headers = self._check_put(transaction_id, batches)
        count = sum(header.record_count for header in headers)
        with self._lock:
            self.counters["put_attempts"] += count
        try:
            committed = self._commit_batches(transaction_id, batches, count)
        except BaseException as exc:
            with self._lock:
                self.counters["put_errors"] += 1
                self.counters["rollbacks"] += 1
                if isinstance(exc, DiskFullError):
                    self.counters["disk_full_errors"] += 1
                    needed = sum(len(batch) for _, batch in batches)
                    self._disk_full = (Path(exc.directory), needed, str(exc))
            raise
        self._disk_full = None
        return committed

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

    def _commit_batches(self, transaction_id: int | None,
                        batches: Batches,
                        count: int) -> list[tuple[int, int, int]]:
        if count > self.config.transaction_capacity:  # clients check too; the owner decides
            raise TransactionCapacityError(self.name, count, self.config.transaction_capacity)
        check_free_space(self._guarded_dirs(), self.config.minimum_required_space,
                         self._free_space)
        ready = [(p, self._logs[p].prepare_batch(bytearray(batch))) for p, batch in batches]
        self._wait_for_room(count)
        written: list[tuple[int, int]] = []  # (partition, put id)
        try:
            for partition, batch in ready:
                put_id, flush_to = self._append(partition, batch, transaction_id)
                written.append((partition, put_id))
                if flush_to is not None:
                    self._logs[partition].flush_to(flush_to)
            if transaction_id is not None:
                self._flush_parts(written)
                self._journal_put(transaction_id, written)
            if self._unsynced_puts:
                self._bound_loss_window([p for p, _ in written])
        except BaseException:
            self._abort_put(written, count)
            raise
        with self._lock:
            committed = []
            for partition, put_id in written:
                put = self._unresolved[partition].pop(put_id)
                committed.append((partition, put.start, put.end - 1))
            self.counters["put_successes"] += count
        return committed

    def count_rollback(self) -> None:
        """A put transaction was rolled back before commit (nothing was written)."""
        with self._lock:
            self.counters["rollbacks"] += 1

    def count_failed_put(self, count: int) -> None:
        """A put of `count` events failed in its producer before reaching the owner."""
        with self._lock:
            self.counters["put_attempts"] += count
            self.counters["put_errors"] += 1
            self.counters["rollbacks"] += 1

    def _guarded_dirs(self) -> list[Path]:
        dirs = [Path(d) for d in self.config.data_dirs] + [self.config.home]
        return [d for d in dirs if d.is_dir()]

    def _wait_for_room(self, count: int) -> None:
        """Reserve room for `count` events, waiting up to keep_alive_ms (Flume keep-alive)."""
        capacity = self.config.capacity
        deadline = time.monotonic() + self.config.keep_alive_ms / 1000
        with self._room:
            while self._untaken + count > capacity:
                self._expire_takes()
                left = deadline - time.monotonic()
                if left <= 0 or self._closing:
                    raise ChannelFullError(self.name, count, self._untaken, capacity,
                                           self.config.keep_alive_ms)
                self._room.wait(min(left, 0.05))
            self._untaken += count

    def _append(self, partition: int, batch: bytearray,
                transaction_id: int | None) -> tuple[int, int | None]:
        """Append one batch and register it as unresolved; return its put id and the offset
        to flush to if the durability or flush policy asks for it (the caller flushes
        outside the locks, sharing the fsync with concurrent committers)."""
        log = self._logs[partition]
        with self._append_locks[partition]:
            result = log.append_batch(batch, defer_flush=True)
            with self._lock:
                self._put_ids += 1
                put_id = self._put_ids
                self._unresolved[partition][put_id] = _Put(
                    result.first_offset, result.next_offset, transaction_id,
                    result.segment_base_offset, result.position)
                self._ends[partition] = result.next_offset
        return put_id, result.next_offset if result.flush_due else None

    def _flush_parts(self, written: list[tuple[int, int]]) -> None:
        """Make a multi-partition put's batches durable before its commit decision. The
        record and the stamps may reach the disk at any time once written (page writeback),
        so in policy durability too: else a power loss may keep the decision and one
        partition's batch and lose another's, and deliver part of a committed put."""
        if self.config.durability == "fsync":
            return  # _append's flush_due flushed every batch already
        with self._lock:
            ends = [(p, self._unresolved[p][put_id].end) for p, put_id in written]
        for partition, end in ends:
            self._logs[partition].flush_to(end)

    def _journal_put(self, transaction_id: int, written: list[tuple[int, int]]) -> None:
        """The commit point of a multi-partition put: its journal record (synced in fsync
        mode). Then each batch is stamped committed, so the decision outlives the journal."""
        with self._lock:
            puts = [(p, self._unresolved[p][put_id]) for p, put_id in written]
            for _, put in puts:
                put.journalled = True  # a checkpoint from now on counts it committed
            journal = self._live_journal()
            ticket = journal.append(commit_journal.PUT, transaction_id,
                                    [(p, put.start, put.end) for p, put in puts])
            if self.config.durability != "fsync":
                self._unsynced_puts.append(
                    (journal, ticket, {p: put.end - put.start for p, put in puts}))
        if self.config.durability == "fsync":
            journal.sync(ticket)
        for p, put in puts:
            self._logs[p].mark_committed(put.segment_base_offset, put.position)

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
        with self._lock:
            unsynced = self._unsynced_puts
            while unsynced and unsynced[0][0].synced(unsynced[0][1]):
                unsynced.popleft()
            pending = dict.fromkeys(partitions, 0)
            for _, _, events in unsynced:
                for p in pending:
                    pending[p] += events.get(p, 0)
            if not any(n and n + self._logs[p].unflushed_events >= limit
                       for p, n in pending.items()):
                return
            upto = {journal: ticket for journal, ticket, _ in unsynced}  # the last, each
        for journal, ticket in upto.items():
            journal.sync(ticket)

    def _abort_put(self, written: list[tuple[int, int]], count: int) -> None:
        """A put failed part way: its written batches leave the queue, undelivered (recovery
        aborts them the same way: no commit record), and its room is given back."""
        with self._room:
            for partition, put_id in written:
                put = self._unresolved[partition].pop(put_id, None)
                if put is not None:
                    self._queues[partition].mark_committed([(put.start, put.end)])
                    self.counters["aborted_events"] += put.end - put.start
            self._untaken -= count
            self._room.notify_all()

    def _live_journal(self) -> commit_journal.CommitJournal:
        if self._journal is None:
            raise ChannelClosedError(f"channel {self.name!r} is closed")
        return self._journal

    # -- take -------------------------------------------------------------------------------
    def begin_take(self, lease_ms: int | None = None) -> int:
        """Start a take transaction; return its id. With lease_ms, it rolls back by itself
        unless committed or rolled back within that time."""
        self._check_writable()
        if lease_ms is not None and (type(lease_ms) is not int or lease_ms < 1):
            raise ValueError(f"lease_ms must be a positive int or None, not {lease_ms!r}")
        self._check_home()  # its commit would be journalled into a file no open will read
        with self._lock:
            self._expire_takes()
            self._take_ids += 1
            take_id = self._take_ids
            deadline = None if lease_ms is None else self._now_ms() + lease_ms
            self._takes[take_id] = _Take(deadline_ms=deadline, lease_ms=lease_ms)
            if deadline is not None:
                heapq.heappush(self._lease_heap, (deadline, take_id))
        return take_id

    def _visible_end(self, partition: int) -> int:
        """The last stable offset: the end of the prefix every put of which resolved."""
        unresolved = self._unresolved[partition]
        if unresolved:
            return min(put.start for put in unresolved.values())
        return self._ends[partition]

    def _live_take(self, take_id: int) -> _Take:
        """The take's reservation, unless its lease ran out or the channel closed (its
        takes returned to the queue then). Caller holds the lock."""
        if self._closing:
            raise TakeExpiredError(f"channel {self.name!r}: take {take_id} is gone: the "
                                   "channel was closed and its events returned to the queue")
        self._expire_takes()
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

    def _finish(self, take_id: int, how: str) -> None:
        """Remember how a take ended (bounded). Caller holds the lock."""
        self._finished[take_id] = how
        if len(self._finished) > FINISHED_TAKES:
            self._finished.popitem(last=False)

    def take_events(self, take_id: int, max_events: int) -> list[Event]:
        """Reserve up to max_events from the partitions' heads, round-robin; read them."""
        with self._lock:
            take = self._live_take(take_id)
            if take.taken + max_events > self.config.transaction_capacity:
                raise TransactionCapacityError(self.name, take.taken + max_events,
                                               self.config.transaction_capacity)
        reserved = self.reserve_ranges(take_id, max_events)
        try:
            events = [event for p, start, end in reserved for event in self._read(p, start, end)]
            return self._delivered(take_id, reserved, events)
        except BaseException:
            with self._lock:
                self.counters["take_errors"] += 1
            with contextlib.suppress(ChannelEngineError):  # a read that reported, then raised:
                self._count_losses()  # the next take must not reserve those offsets again
            raise

    def reserve_ranges(self, take_id: int, max_events: int) -> list[tuple[int, int, int]]:
        """Reserve up to max_events from the partitions' heads, round-robin, without reading
        them: (partition, start, end) ranges, end exclusive, for a reader of the segment
        files (the exporter). A take holds ranges, not events, so transaction_capacity
        bounds only take_events."""
        reserved: list[tuple[int, int, int]] = []
        self._count_losses()  # what other reads found lost is not reserved now
        with self._lock:
            take = self._live_take(take_id)
            self.counters["take_attempts"] += max_events
            partitions = self.config.partitions
            first = self._next_take_partition
            self._next_take_partition = (first + 1) % partitions
            want = max_events
            for i in range(partitions):
                p = (first + i) % partitions
                got = self._queues[p].reserve(take_id, want, self._visible_end(p))
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
        cached = self._last_batch[partition]
        if cached is not None and cached[0] <= start < cached[1]:
            base, _next, decoded = cached
            events = decoded[start - base:end - base]
            start = min(end, cached[1])
        if start >= end:
            return events
        log = self._logs[partition]
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
        self._count_losses()
        with self._lock:
            held = {p: list(self._queues[p].in_flight.get(take_id, ()))
                    for p in {p for p, _, _ in reserved}}
        if len(events) == sum(end - start for _, start, end in reserved) and all(
                (start, end) in held[p] for p, start, end in reserved):
            return events  # no loss touched it, the read missed nothing (the usual case)
        kept, missed = deliverable(reserved, held, events, [log.directory for log in self._logs])
        self._count_losses([(p, lost, None) for p, lost in missed])
        return kept

    def commit_take(self, take_id: int) -> None:
        """Remove a take's events for good; durable on return in fsync durability."""
        self._check_home()  # never acknowledge a commit journalled into an unlinked file
        with self._room:
            self._live_take(take_id)
            take = self._takes.pop(take_id)
            self._finish(take_id, COMMITTED)
            entries = []
            taken = 0
            for p in sorted(take.partitions):
                ranges = list(self._queues[p].in_flight.get(take_id, ()))
                entries += [(p, start, end) for start, end in ranges]
                taken += self._queues[p].commit(take_id)  # lost offsets left its ranges
            self._untaken -= taken
            journal = self._live_journal()
            ticket = journal.append(commit_journal.TAKE, take_id, entries) if entries else 0
            self.counters["take_successes"] += taken
            self._room.notify_all()
        if entries and self.config.durability == "fsync":
            journal.sync(ticket)

    def rollback_take(self, take_id: int) -> None:
        """Return a take's events to the head of their partitions, in order; nothing for a
        take already returned; TakeCommittedError for a committed one."""
        with self._lock:
            if self._closing:
                return  # closing returned every take already
            take = self._takes.pop(take_id, None)
            if take is not None:
                for p in take.partitions:
                    self._queues[p].rollback(take_id)
                self._finish(take_id, ROLLED_BACK)
            elif self._finished.get(take_id) == COMMITTED:
                raise TakeCommittedError(f"channel {self.name!r}: take {take_id} was already "
                                         "committed: its events cannot be returned")
            self.counters["rollbacks"] += 1

    def _expire_takes(self) -> None:
        """Roll back takes whose lease ran out. Caller holds the lock. O(log n) per expiry:
        leases wait in a heap by deadline, so takes without one cost nothing here."""
        heap = self._lease_heap
        if not heap or heap[0][0] > self._now_ms():
            return
        now = self._now_ms()
        while heap and heap[0][0] <= now:
            _, take_id = heapq.heappop(heap)
            take = self._takes.pop(take_id, None)
            if take is None:
                continue  # committed or rolled back before its lease ran out
            for p in take.partitions:
                self._queues[p].rollback(take_id)
            self._finish(take_id, EXPIRED)
            self.counters["takes_expired"] += 1
            self.counters["rollbacks"] += 1

    # -- flushing ---------------------------------------------------------------------------
    def flush(self) -> None:
        """Make every committed put and take durable now (policy mode's explicit flush)."""
        self._check_writable()
        for log in self._logs:
            log.flush()
        self._live_journal().sync()

    def flush_if_due(self) -> bool:
        """The flusher's hook: flush each partition whose flush_ms passed, sync the commit
        journal, expire lapsed take leases. True if a partition was flushed."""
        self._check_writable()
        with self._lock:
            self._expire_takes()
        flushed = False
        for log in self._logs:
            flushed = log.flush_if_due() or flushed
        self._live_journal().sync()  # free when nothing was appended since the last sync
        return flushed

    # -- checkpoints and deletion -----------------------------------------------------------
    def checkpoint_if_due(self) -> CheckpointResult | None:
        """The checkpointer's hook: checkpoint when checkpoint_interval_ms has passed."""
        if self._now_ms() - self._last_checkpoint_ms < self.config.checkpoint_interval_ms:
            return None
        return self.checkpoint()

    def checkpoint(self) -> CheckpointResult:
        """Write a checkpoint (primary, then backup) and delete what it makes unneeded."""
        self._check_writable()
        return self._checkpoint()

    def _home_replaced(self) -> bool:
        """Is the home's .lock no longer the file this owner holds? (An operator may delete
        a channel and create another of the same name while a process has the old open.)"""
        if self._lock_fd < 0:
            return False
        try:
            current = os.stat(self.config.home / LOCK_FILE)
        except FileNotFoundError:
            return True
        held = os.fstat(self._lock_fd)
        return (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino)

    def _check_home(self) -> None:
        if self._home_replaced():
            raise ChannelGoneError(f"channel {self.name!r}: {self.config.home} was deleted or "
                                   "replaced since this process opened it; nothing written")

    def _checkpoint(self) -> CheckpointResult:
        home, backup = self.config.home, self._backup_dir()
        self._check_home()
        with self._checkpoint_lock:
            started = time.perf_counter()
            self._save_ledger()  # a loss record is durable before the marking it counts
            sequence = self._sequence + 1
            next_journal = commit_journal.CommitJournal(home, sequence)  # before the lock
            locked = time.perf_counter()
            with self._lock:
                self._expire_takes()
                saved, journalled = self._snapshot(sequence)
                old_journal, self._journal = self._journal, next_journal
            lock_held_ms = (time.perf_counter() - locked) * 1000
            if old_journal is not None:
                old_journal.close()  # its commits are in the snapshot; sync before it goes
            self._sync_commit_marks(journalled)
            try:
                checkpoint_file.write(saved, home, None, create=False)  # never a new home
            except OSError as exc:
                with self._lock:
                    self.counters["checkpoint_write_errors"] += 1
                raise StorageError(home, exc, "writing the checkpoint") from exc
            self._sequence = sequence
            backup_state = self._write_backup(saved, backup)
            self._check_home()  # deleted meanwhile: its journals are not ours to remove
            oldest = min(sequence, self._backup_sequence) if backup else sequence
            journals_removed = commit_journal.remove_before(home, oldest)
            self._checkpoint_taken = [p.taken_through for p in saved.partitions]
            segments_deleted = self._delete_taken_segments()
            result = CheckpointResult(
                sequence, saved.written_at_ms, round((time.perf_counter() - started) * 1000, 3),
                round(lock_held_ms, 3), backup_state, segments_deleted, journals_removed)
            self._last_checkpoint = result
            self._checkpoint_history.append(result)
            self._last_checkpoint_ms = self._now_ms()
            return result

    def _snapshot(self, sequence: int) -> tuple[checkpoint_file.Checkpoint,
                                                list[tuple[int, _Put]]]:
        """The queue state now (a few numbers per partition), and the multi-partition puts
        whose commit record is written but whose batches may not be stamped yet. Caller
        holds the lock."""
        parts = []
        journalled = []
        for p, (log, queue) in enumerate(zip(self._logs, self._queues, strict=True)):
            saved = queue.to_checkpoint(log.log_start_offset, log.recovery_point, self._ends[p])
            pending = []
            for put in self._unresolved[p].values():
                if put.transaction_id is None:
                    continue
                if put.journalled:
                    journalled.append((p, put))
                else:
                    pending.append((put.transaction_id, put.start, put.end))
            parts.append(replace(saved, pending_puts=tuple(sorted(pending))) if pending
                         else saved)
        return checkpoint_file.Checkpoint(sequence, self._now_ms(), tuple(parts)), journalled

    def _sync_commit_marks(self, journalled: list[tuple[int, _Put]]) -> None:
        """Before journals go: every multi-partition put whose record is in them has its
        batches stamped committed, durably (so even without any checkpoint, recovery knows)."""
        for p, put in journalled:
            self._logs[p].mark_committed(put.segment_base_offset, put.position)
        for log in self._logs:
            log.sync_marks()

    def _write_backup(self, saved: checkpoint_file.Checkpoint, backup: Path | None) -> str:
        if backup is None:
            return "off"
        try:
            # a backup dir that vanished with a deleted home is not made again
            checkpoint_file.write(saved, backup, None, create=not self._home_replaced())
        except OSError as exc:
            with self._lock:
                self.counters["checkpoint_backup_write_errors"] += 1
            return f"failed: {exc}"
        self._backup_sequence = saved.sequence
        self._backup_taken = [p.taken_through for p in saved.partitions]
        return "written"

    def _delete_taken_segments(self) -> int:
        """Delete segments whose every event is taken in both checkpoint copies (so neither
        a reopen from the primary nor one from the backup needs them)."""
        deleted = 0
        for p, log in enumerate(self._logs):
            if p >= len(self._checkpoint_taken):
                break
            taken = self._checkpoint_taken[p]
            if self._backup_dir() is not None and self._backup_taken is not None \
                    and p < len(self._backup_taken):
                taken = min(taken, self._backup_taken[p])
            bases = [s.base_offset for s in log.segments if s.base_offset <= taken]
            if bases and bases[-1] > log.log_start_offset and bases[-1] <= log.high_watermark:
                deleted += len(log.delete_records_before(bases[-1]).deleted_base_offsets)
        return deleted

    def apply_retention(self) -> dict[str, Any]:
        """Delete what retention allows: taken segments always; untaken events only when
        retention_ms / retention_bytes opt in — each dropped event counted."""
        self._check_writable()
        dropped = unlinked = 0
        deleted = self._delete_taken_segments()
        for p, log in enumerate(self._logs):
            if self.config.retention_ms >= 0 or self.config.retention_bytes >= 0:
                result = log.apply_retention()
                deleted += len(result.deleted_base_offsets)
                with self._room:
                    queue = self._queues[p]
                    before = queue.untaken(self._ends[p])
                    queue.skip_to(log.log_start_offset)
                    lost = before - queue.untaken(self._ends[p])
                    self._untaken -= lost
                    dropped += lost
                    self.counters["dropped_events"] += lost
                    self._room.notify_all()
            unlinked += log.delete_expired_files()
        return {"segments_deleted": deleted, "events_dropped": dropped,
                "files_unlinked": unlinked}

    # -- losses (loss_ledger.py) -------------------------------------------------------------
    def _count_losses(self, found: Sequence[tuple[int, LostRange, int | None]] = (),
                      at_open: bool = False) -> None:
        """Take what the logs report lost, and `found` (events None: still to take out of
        the queue), out of the queues; record each range in the ledger, durably before the
        marking is (by a journal record here, or at open by the checkpoint that follows)."""
        if self._closing:
            return
        items = list(found) + [(log.partition, lost, None) for log in self._logs
                               for lost in log.take_new_losses()]
        if not items and not at_open:
            return
        with self._checkpoint_lock:  # no checkpoint between the marking and the ledger
            with self._room:
                marked = self._mark_lost(items, at_open)
                self._room.notify_all()
            self._save_ledger()
            if marked and not at_open and not self.read_only:
                with self._lock:  # take id 0: offsets taken out of the queue as lost
                    journal = self._live_journal()
                    ticket = journal.append(commit_journal.TAKE, 0, marked)
                journal.sync(ticket)

    def _mark_lost(self, items: Sequence[tuple[int, LostRange, int | None]],
                   at_open: bool) -> list[tuple[int, int, int]]:
        """_count_losses under the lock; return the ranges marked."""
        counted, marked = [], []
        for p, lost, events in items:
            here = self._ledger.counted_here(p, lost)  # the same offsets, counted before
            if events is None:
                end = min(lost.end, self._visible_end(p))
                again = sum(self._queues[p].mark_lost(a, min(b, end)) for a, b in here)
                events = self._queues[p].mark_lost(lost.start, end)
                self._untaken -= again + events
                marked += [(p, lost.start, end)] if end > lost.start else []
            if not events and sum(b - a for a, b in here) == lost.end - lost.start:
                continue  # every offset of it is in a record of its place already
            counted.append((p, lost, events))
        fresh = self._ledger.record_all(counted, self._now_ms())
        self.counters["lost_events"] += sum(r.events for r in fresh)
        if at_open:
            self.recovery.lost_events += sum(r.events for r in fresh)
            self.recovery.lost_ranges += [r.to_dict() for r in fresh]
        return marked

    def record_lost(self, lost: Sequence[tuple[int, LostRange, int]]) -> None:
        """Record (partition, range, events) whose events are already out of the queue (the
        put commits `recover` cut from a journal: the open aborted their batches) in the
        loss ledger, durably; a range recorded before is not counted again."""
        self._check_writable()
        self._count_losses(lost)

    def _count_unknown_journals(self) -> None:
        """Journal content the open could not read (channel_recovery.py): every event the
        restored queue holds untaken may have been taken since; a missing checkpoint journal
        goes to the loss ledger (saved by the checkpoint that ends the open)."""
        unknown = self.recovery.journals_unknown
        if not unknown:
            return
        bound = self._untaken
        self.recovery.events_may_come_back_at_most = bound
        for item in unknown:
            if item["missing"]:
                self._ledger.record_journal(
                    item["path"], item["generation"],
                    f"journal_missing: {item['path']}: {item['why']}; the take commits since "
                    f"checkpoint {item['generation']} are unknown: up to {bound} events may "
                    "come back (delivered again, at least once)", self._now_ms())

    def _save_ledger(self) -> None:
        self._check_home()  # never into the ledger of a channel that replaced ours
        self._ledger.save()

    def acknowledge_losses(self) -> int:
        """An operator has seen every loss recorded: acknowledge them all, durably (health
        is no longer degraded for them); return how many records that was."""
        self._check_writable()
        self._check_home()
        return self._ledger.acknowledge(self._now_ms())

    # -- reading (inspection; takes do not move) --------------------------------------------
    def read(self, partition: int, offset: int, max_events: int = 100) -> list[Event]:
        """Events of one partition from `offset` on, committed ones only (no take)."""
        self._check_partition(partition)
        log = self._logs[partition]
        end = self._visible_end(partition) if not self.read_only else log.high_watermark
        events = log.read(offset, max_events, end_offset=end)
        self._count_losses()
        return events

    def offsets_for_time(self, partition: int, timestamp: int) -> int | None:
        """Earliest offset of a partition with a timestamp >= `timestamp` (Kafka's)."""
        self._check_partition(partition)
        return self._logs[partition].offsets_for_time(timestamp)

    def _check_partition(self, partition: int) -> None:
        if type(partition) is not int or not 0 <= partition < self.config.partitions:
            raise ValueError(f"channel {self.name!r} has partitions 0..."
                             f"{self.config.partitions - 1}, not {partition!r}")

    @property
    def logs(self) -> Sequence[PartitionLog]:
        """The partition logs, by partition number."""
        return tuple(self._logs)

    # -- status -----------------------------------------------------------------------------
    def status(self, segments: bool = False) -> dict[str, Any]:
        """Everything an operator looks at, as plain JSON-serialisable data (with each
        partition's segment table when `segments`)."""
        with contextlib.suppress(ChannelEngineError):  # unwritten records show, unacknowledged
            self._count_losses()
        lost = self._ledger.events_by_partition()
        with self._lock:
            if not self.read_only:
                self._expire_takes()
            partitions = [self._partition_status(p) for p in range(self.config.partitions)]
            for part in partitions:
                part["lost_events"] = lost.get(part["partition"], 0)
            counters = dict(self.counters)
            untaken = self._untaken
            in_flight = sum(q.in_flight_events() for q in self._queues)
            open_takes = len(self._takes)
        if segments:
            for part, log in zip(partitions, self._logs, strict=True):
                part["segment_table"] = [vars(info) for info in log.segment_infos()]
        capacity = self.config.capacity
        health, reason = self._health()
        return {
            "name": self.name,
            "home": str(self.config.home),
            "read_only": self.read_only,
            "durability": self.config.durability,
            "capacity": capacity,
            "events_queued": untaken - in_flight,
            "events_untaken": untaken,
            "events_in_flight": in_flight,
            "open_takes": open_takes,
            "fill_percent": round(100 * untaken / capacity, 3),
            "unflushed_events": sum(p["unflushed_events"] for p in partitions),
            "bytes_on_disk": sum(p["size_bytes"] for p in partitions),
            "counters": counters,
            "checkpoint": self._checkpoint_status(),
            "recovery": self.recovery.to_dict(),
            "losses": self._ledger.summary(),
            "health": health,
            "health_reason": reason,
            "partitions": partitions,
        }

    def _partition_status(self, p: int) -> dict[str, Any]:
        log, queue = self._logs[p], self._queues[p]
        end = self._ends[p]
        stats = log.stats()
        return {
            "partition": p,
            "directory": str(log.directory),
            "log_start_offset": log.log_start_offset,
            "log_end_offset": log.log_end_offset,
            "last_stable_offset": self._visible_end(p),
            "recovery_point": log.recovery_point,
            "unflushed_events": log.unflushed_events,
            "taken_through": queue.taken_through,
            "events_queued": queue.queued(self._visible_end(p)),
            "events_untaken": queue.untaken(end),
            "events_in_flight": queue.in_flight_events(),
            "size_bytes": log.size_bytes,
            "segments": len(log.segments),
            "offline": stats["offline"],
            "index_rebuilds": stats["index_rebuilds"],  # derived files found wrong at use
            "read_damage": stats["read_damage"],  # damage reads met since open
        }

    def _checkpoint_status(self) -> dict[str, Any]:
        last = self._last_checkpoint
        return {
            "sequence": self._sequence,
            "interval_ms": self.config.checkpoint_interval_ms,
            "age_ms": self._now_ms() - self._last_checkpoint_ms,
            "backup": "off" if self._backup_dir() is None else (
                last.backup if last else "not written yet"),
            "last": last.to_dict() if last else None,
            "history": [c.to_dict() for c in self._checkpoint_history],
        }

    def _disk_full_reason(self) -> str | None:
        """Why puts fail for a full disk, until a put succeeds or the space it needed (above
        minimum_required_space) is free again."""
        full = self._disk_full
        if full is None:
            return None
        directory, needed, why = full
        try:
            free = self._free_space(directory)
        except OSError:
            free = 0
        if free >= needed + self.config.minimum_required_space:
            self._disk_full = None
            return None
        return f"the disk is full: a put failed ({why}); {free} bytes free, it needed {needed}"

    def _health(self) -> tuple[str, str]:
        for log in self._logs:
            offline = log.stats()["offline"]
            if offline:
                return "unhealthy", f"partition {log.partition} is offline: {offline}"
        if self._closed:
            return "unhealthy", "channel is closed"
        if self._home_replaced():
            return "unhealthy", (f"{self.config.home} was deleted or replaced: takes and "
                                 "checkpoints fail until the channel is opened again")
        try:
            check_free_space(self._guarded_dirs(), self.config.minimum_required_space,
                             self._free_space)
        except ChannelEngineError as exc:
            return "unhealthy", str(exc)
        full = self._disk_full_reason()
        if full is not None:
            return "degraded", full
        unacknowledged = self._ledger.health_reason()
        if unacknowledged is not None:
            return "degraded", unacknowledged
        last = self._last_checkpoint
        if last is not None and last.backup.startswith("failed"):
            return "degraded", f"backup checkpoint {last.backup}"
        if self._untaken >= self.config.capacity:
            return "degraded", "channel is full: puts wait and then fail"
        age = self._now_ms() - self._last_checkpoint_ms
        if not self.read_only and age > 3 * self.config.checkpoint_interval_ms:
            return "degraded", f"last checkpoint {age} ms ago (interval " \
                               f"{self.config.checkpoint_interval_ms} ms)"
        return "healthy", "ok"

    def events(self, partition: int, start: int, end: int) -> Iterator[Event]:
        """Every event of a partition in [start, end), committed ones only."""
        self._check_partition(partition)
        yield from self._logs[partition].iter_events(start, min(end,
                                                              self._visible_end(partition)))
        self._count_losses()  # not in a finally: a generator may be closed under our lock


def _check_last_batch_opens(log: PartitionLog) -> None:
    """Fail at open, not at the first take, when the key file cannot read this channel: a
    missing or wrong key raises DecryptionError (or EncryptedBatchError without a key file)."""
    end = log.high_watermark
    segments = [s for s in log.segments if s.size and s.base_offset < end]
    if not segments:
        return
    start = max(log.log_start_offset, segments[-1].offset_index.last_entry()[0])
    for _segment, header, data in log.read_batches(start, end, 1 << 62):
        if header.attributes & ENCRYPTED_MASK:
            unseal(data, log.sealer)
            return


def _names_file(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino)


def _unlink_if_same(path: Path, fd: int) -> None:
    """Unlink `path` if it is still the file open as `fd` (a lock file this open made in a
    home being removed: it must not keep the directory from going)."""
    with contextlib.suppress(OSError):
        current, held = os.stat(path), os.fstat(fd)
        if (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            path.unlink()


def _move_not_regular(config: ChannelConfig) -> list[str]:
    """Move a directory (or anything but a regular file) in place of an engine file the
    open rewrites to `<name>.stray` (never deleting it); one line per file moved."""
    moved = []
    for path in not_regular(config):
        target = move_aside(path, STRAY_SUFFIX)
        moved.append(f"{path}: not a regular file, moved aside to {target}; the engine "
                     "writes a new one")
    return moved


def _move_home_strays(config: ChannelConfig) -> list[str]:
    """Move files the engine did not write out of the home's way (never deleting them);
    return one line per file for the recovery report (home_files.py has the rule)."""
    moved = []
    for path in find_strays(config.home, config).strays:
        target = move_aside(path, STRAY_SUFFIX)
        moved.append(f"{path}: a stray file the engine did not write, moved aside to {target}")
    return moved

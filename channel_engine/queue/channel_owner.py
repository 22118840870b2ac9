"""ChannelOwner: the channel as run by the one process that owns its files —
Flume's FileChannel on Kafka's log: put and take transactions over 1..N
partition logs, with queue checkpoints, a commit journal and crash replay.

Other processes reach it through the owner socket (owner/server.py); callers
use Channel (channel.py), which picks the role. It satisfies OwnerOperations
(operations.py), the operations both reach it by, and composes one part per
collaborator over a shared ChannelState (channel_state.py): the home's lock
(home_lock.py) and its preparation at open (home_setup.py), puts and their
durability (puts.py), takes and leases (takes.py), losses and the loss ledger
(losses.py), checkpoints and retention (checkpointer.py) and status
(channel_status.py). Each part's module says its rules.

Files: partition i is a PartitionLog in `partition_dir(i)`; the home
(checkpoint_dir) holds channel.json, `checkpoint` (checkpoint.py), the commit
journals `commits-<G>.journal` (commit_journal.py), `losses.json` and `.lock`,
which the owner holds with flock for as long as it has the channel open (so a
second would-be owner gets ChannelLockedError and becomes a client instead).
read_only=True opens a snapshot without the lock. Open: prepare the home, load
the key file (a ConfigError naming it if it is missing or damaged: it cannot be
rebuilt) and the partitions (create=False still makes the new partitions of a
grown channel; a saved partition's missing directory is ChannelGoneError),
replay the checkpoint and journals (channel_recovery.py), count what was lost,
and checkpoint the replayed state.

A new channel is made by an open with new=True (Channel.create: the creator's word; the
home is checked to hold no channel first): its first checkpoint is written before the open
returns, so no open of it ever finds none. Any other open that finds no valid checkpoint
reports it (recovery problems). A writable one that finds no copy at all (a wipe: a damaged
copy is damage, kept aside by `recover`) of a channel that existed — a log holds events,
or the caller says so (`existed`: the appliance, whose database knows the channel; a
channel.json alone may be a config saved for the first open) — records it in the loss
ledger (state_missing): health is not "healthy" until an operator acknowledges it, across
reopens. One that finds a copy but none readable (every copy damaged: a CRC, a torn write)
rebuilds the queue from the logs, keeps each damaged copy aside (`checkpoint.damaged`) and
records that too (state_damaged: committed takes may be delivered again, up to every event
the rebuilt queue holds). `recover` (force_recovery)
records nothing: it is the operator's repair, and prints what it cost.

A writable open that makes again the missing (or emptied) directory of a partition that
existed — one a checkpoint copy records (home_files.existed_partitions: a checkpoint is
written only once each partition directory of its open has its files), or any saved one
when the caller says the channel existed (`existed`: the operator's recreate of vanished
storage) — makes a new incarnation of that partition (log/incarnation.py): the partition
goes on where its checkpoint's queue knew it ended (channel_recovery.py step 5), or at the
operator's `next_offsets` when higher (start_recreated: what the drains had sent beyond
an old checkpoint is never handed out again), and its incarnation records that start
before the open's checkpoint; the drains compare it with what they sent
(channel_engine/incarnations.py).

Thread-safe. One lock guards the queue state; appends to one partition are
serialised by that partition's lock; fsyncs happen outside both
(channel_state.py has the order).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from channel_engine.atomic_file import move_aside
from channel_engine.disk_space import FreeSpace, free_bytes
from channel_engine.encryption import BatchSealer, KeyRing
from channel_engine.errors import ChannelEngineError, OffsetOutOfRangeError
from channel_engine.event import Event
from channel_engine.filenames import DAMAGED_SUFFIX
from channel_engine.log.fetch import DEFAULT_FETCH_BYTES, FetchData, fetch
from channel_engine.log.partition_log import PartitionLog
from channel_engine.log.record_batch import ENCRYPTED_MASK, unseal
from channel_engine.log.recovery import LostRange
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue.channel_config import ChannelConfig
from channel_engine.queue.channel_recovery import ChannelRecovery, restore, start_recreated
from channel_engine.queue.channel_state import ChannelState
from channel_engine.queue.channel_status import ChannelStatus
from channel_engine.queue.checkpointer import Checkpointer, CheckpointResult
from channel_engine.queue.home_files import existed_partitions
from channel_engine.queue.home_lock import HomeLock
from channel_engine.queue.home_setup import prepare_home
from channel_engine.queue.loss_ledger import LossLedger
from channel_engine.queue.losses import Losses
from channel_engine.queue.new_channel import NewChannel
from channel_engine.queue.put_batch import Batches
from channel_engine.queue.puts import Puts
from channel_engine.queue.subscription import DEFAULT
from channel_engine.queue.subscriptions import Subscriptions
from channel_engine.queue.takes import Takes


class ChannelOwner:
    """The channel in the process that owns its files; see the module doc."""

    def __init__(self, config: ChannelConfig, read_only: bool, clock: Callable[[], float],
                 free_space: FreeSpace) -> None:
        self.config = config
        self.name = config.name
        self.read_only = read_only
        self.state = ChannelState(config, read_only, clock, free_space)
        self.home_lock = HomeLock(config)
        self.losses = Losses(self.state, self.home_lock)
        self.takes = Takes(self.state, self.home_lock, self.losses)
        self.puts = Puts(self.state, self.takes)
        self.checkpointer = Checkpointer(self.state, self.home_lock, self.takes, self.losses)
        self._status = ChannelStatus(self.state, self.home_lock, self.puts, self.takes,
                                     self.losses, self.checkpointer)
        self._subscriptions = Subscriptions(self.state, self.takes, self.checkpointer,
                                            self.losses)
        self._made: NewChannel | None = None  # this open created the channel

    # -- opening and closing ----------------------------------------------------------------
    @classmethod
    def open(cls, config: ChannelConfig | str | os.PathLike[str], *, read_only: bool = False,
             clock: Callable[[], float] = time.time, free_space: FreeSpace = free_bytes,
             force_recovery: bool = False, create: bool = True, new: bool = False,
             existed: bool = False, next_offsets: Mapping[int, int] | None = None
             ) -> ChannelOwner:
        """Open the channel of `config`, or of the home directory holding its channel.json;
        replay whatever followed the last checkpoint. A writable open with `create` makes
        missing directories (a new channel); create=False raises ChannelGoneError instead
        (the channel was deleted: an owner re-elected after it must not bring it back).
        force_recovery: CRC-check every batch of every partition (`recover`'s repair).
        new: make a new channel (ChannelExistsError if one is there); existed: the caller
        knows the channel existed, so no checkpoint means its state was lost (module doc).
        next_offsets: partition -> the lowest offset a partition recreated by this open
        hands out next (the operator's recreate above what drains sent: module doc)."""
        if not isinstance(config, ChannelConfig):
            config = ChannelConfig.load(Path(config))
        channel = cls(config, read_only, clock, free_space)
        made = NewChannel(config) if new else None  # a failed create leaves nothing
        try:
            channel._open(force_recovery, create or new, made, existed, next_offsets or {})
        except BaseException as exc:
            channel._abandon(undo=made, error=exc)
            raise
        channel._made = made
        return channel

    def discard_created(self, error: BaseException) -> None:
        """Close a channel this open has just created and remove its files, as a failed
        create does (Channel.create, when what follows the open fails)."""
        assert self._made is not None, "only a channel this open created is discarded"
        with self.state.lock:
            self.state.closing = True
        self.state.closed = True
        self._abandon(undo=self._made, error=error)

    def _open(self, force_recovery: bool = False, create: bool = True,
              made: NewChannel | None = None, existed: bool = False,
              next_offsets: Mapping[int, int] | None = None) -> None:
        config = self.config
        home = config.home
        new = made is not None
        strays, saved_partitions = prepare_home(config, self.home_lock, self.read_only, create,
                                                made)
        # a partition of a channel there before (a checkpoint records it, or the operator's
        # recreate says so): its directory made again is a new incarnation of it
        existed_count = 0 if new or self.read_only else \
            saved_partitions if existed else existed_partitions(config, saved_partitions)
        log_config = config.log_config()
        keys = None
        if config.encryption_key_file is not None:
            keys = KeyRing.load(config.encryption_key_file, str(config.encryption_active_key))
        for partition in range(config.partitions):
            sealer = None if keys is None else BatchSealer(keys, config.name, partition)
            self.state.logs.append(PartitionLog.open(
                config.partition_dir(partition), log_config, partition=partition,
                read_only=self.read_only, clock=self.state.clock, sealer=sealer,
                force_recovery=force_recovery,
                create=create or partition >= saved_partitions,  # a new partition: grown
                recreated=partition < existed_count))
            self.state.append_locks.append(threading.Lock())
            self.state.unresolved.append({})
        for log in self.state.logs:
            _check_last_batch_opens(log)
        if not self.read_only:
            for log in self.state.logs:
                if log.unflushed_events:
                    log.flush()
        backup = self.checkpointer.backup_dir()
        restored = restore(home, backup if backup is not None and backup.is_dir() else None,
                           self.state.logs, new)
        if not self.read_only:
            start_recreated(restored.subscriptions, self.state.logs, next_offsets or {})
        self.state.ends = [log.log_end_offset for log in self.state.logs]
        self.state.subscriptions = {sub.name: sub for sub in restored.subscriptions}
        self.state.next_subscription_id = restored.next_subscription_id
        self.state.aborted = restored.aborted
        for sub in restored.subscriptions:
            sub.count_untaken(self.state.ends)
        self.checkpointer.restored(restored.sequence)
        if not self.read_only:
            for p, segment_base, position in restored.to_mark:
                self.state.logs[p].mark_committed(segment_base, position)
        self.state.recovery = restored.report
        if not self.read_only:
            self.state.recovery.problems += strays
        self.state.counters.update((name, restored.counters.get(name, 0))
                                   for name in self.state.counters)  # counters.py
        self.state.counters["aborted_events"] += restored.report.aborted_events
        self.state.counters["dropped_events"] += restored.report.dropped_events
        # a checkpoint written before ledgers existed (v1, v2) has none beside it: an upgrade
        keeps_ledger = restored.report.checkpoint_version >= checkpoint_file.LEDGER_VERSION
        self.losses.ledger = LossLedger.load(home, not self.read_only, keeps_ledger,
                                             self.state.now_ms())
        self.losses.count(restored.lost, at_open=True)  # before the checkpoint below
        self.losses.recount_lost()
        self.losses.count_unknown_journals()  # recorded before the checkpoint below hides it
        report = restored.report
        if report.checkpoint_source is None and not (new or self.read_only or force_recovery):
            if not report.checkpoint_absent:  # a copy is there, none readable: damage
                kept = self._keep_damaged_checkpoints()  # the checkpoint below replaces them
                self.losses.record_state_damaged(kept)
            elif existed or any(log.log_end_offset for log in self.state.logs):
                self.losses.record_state_missing()
        if not self.read_only:
            self.checkpointer.sequence = restored.next_generation - 1
            self.takes.start_ids(restored.next_generation)  # ids never repeat across owners
            self.checkpoint()  # the replayed state becomes the new base; old journals go

    def _keep_damaged_checkpoints(self) -> list[str]:
        """Move every checkpoint copy there (all damaged) aside as `checkpoint.damaged`
        (never deleted, for an operator to look at); return where each went."""
        places = [self.config.home, self.checkpointer.backup_dir()]
        copies = [d / checkpoint_file.FILE_NAME for d in places if d is not None]
        kept = [f"{path} kept aside as {move_aside(path, DAMAGED_SUFFIX)}"
                for path in copies if path.is_file()]
        self.state.recovery.problems.extend(kept)
        return kept

    def _abandon(self, clean: bool = True, undo: NewChannel | None = None,
                 error: BaseException | None = None) -> None:
        """Release what a failed open acquired (clean=False: write nothing while at it);
        `undo`: a failed create, whose files go before the lock does (new_channel.py), what
        cannot be removed noted on `error`."""
        for log in self.state.logs:
            try:
                log.close(clean=clean)
            except ChannelEngineError:
                pass
        if self.state.journal is not None:
            self.state.journal.close()
        if undo is not None:
            left = undo.undo()
            if left and error is not None:
                error.add_note("the failed create left (remove by hand before retrying): "
                               + "; ".join(left))
        self.home_lock.release()

    def __enter__(self) -> ChannelOwner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Checkpoint (if checkpoint_on_close), close the logs cleanly, release the lock.
        Open take transactions roll back: their events stay queued."""
        with self.state.lock:
            if self.state.closing:
                return
            self.state.closing = True  # from here on, takes are gone and puts are refused
        gone = not self.read_only and self.home_lock.replaced()
        try:
            if not self.read_only and self.config.checkpoint_on_close and not gone:
                self.checkpointer.run()
        finally:
            self.state.closed = True
            with self.state.room:
                self.state.room.notify_all()
            # a home deleted or replaced under us is not ours: no checkpoint, no clean flags
            self._abandon(clean=not gone)

    @property
    def recovery(self) -> ChannelRecovery:
        """What the open found and repaired (the recovery report)."""
        return self.state.recovery

    @property
    def counters(self) -> dict[str, int]:
        """The channel's counters since it was made (puts, takes, rollbacks, losses, ...;
        kept across opens by the checkpoint: counters.py)."""
        return self.state.counters

    @property
    def logs(self) -> Sequence[PartitionLog]:
        """The partition logs, by partition number."""
        return tuple(self.state.logs)

    # -- OwnerOperations (operations.py): each answered by the part that owns it ------------
    def commit_batches(self, transaction_id: int | None, batches: Batches,
                       partitions: int, movable: bool = False) -> list[tuple[int, int, int]]:
        """Append a put encoded by its producer (Puts.commit_batches)."""
        return self.puts.commit_batches(transaction_id, batches, partitions, movable)

    def count_rollback(self) -> None:
        """A put transaction was rolled back before commit (nothing was written)."""
        self.puts.count_rollback()

    def count_failed_put(self, count: int) -> None:
        """A put of `count` events failed in its producer before reaching the owner."""
        self.puts.count_failed_put(count)

    def begin_take(self, lease_ms: int | None = None, subscription: str = DEFAULT) -> int:
        """Start a take transaction of a subscription; return its id (Takes.begin_take)."""
        return self.takes.begin_take(lease_ms, subscription)

    def take_events(self, take_id: int, max_events: int) -> list[Event]:
        """Reserve up to max_events from the partitions' heads and read them."""
        return self.takes.take_events(take_id, max_events)

    def reserve_ranges(self, take_id: int, max_events: int) -> list[tuple[int, int, int]]:
        """Reserve up to max_events without reading them (Takes.reserve_ranges)."""
        return self.takes.reserve_ranges(take_id, max_events)

    def commit_take(self, take_id: int) -> None:
        """Remove a take's events for good; durable on return in fsync durability."""
        self.takes.commit_take(take_id)

    def rollback_take(self, take_id: int) -> None:
        """Return a take's events to the head of their partitions, in order."""
        self.takes.rollback_take(take_id)

    # -- subscriptions (subscriptions.py) ----------------------------------------------------
    def subscriptions(self) -> list[str]:
        """The channel's subscriptions, `default` first."""
        return self._subscriptions.names()

    def add_subscription(self, name: str, start: Any = "earliest") -> None:
        """Add a subscription starting at `start`; durable on return."""
        self._subscriptions.add(name, start)

    def remove_subscription(self, name: str) -> None:
        """Remove a subscription with no take open (never `default`); durable on return."""
        self._subscriptions.remove(name)

    def reset_subscription(self, name: str, to: Any) -> None:
        """Move a subscription with no take open to `to`; durable on return."""
        self._subscriptions.reset(name, to)

    def read(self, partition: int, offset: int, max_events: int = 100) -> list[Event]:
        """Events of one partition from `offset` on, committed ones only (no take): the
        events of an aborted put, whose batches stay in the log, are skipped."""
        self.state.check_partition(partition)
        log = self.state.logs[partition]
        end = self.state.visible_end(partition) if not self.read_only else log.high_watermark
        spans = self.state.committed_spans(partition, offset, end)
        if offset >= end or spans == [(offset, end)]:  # nothing aborted there
            events = log.read(offset, max_events, end_offset=end)
        else:
            if not log.log_start_offset <= offset <= log.high_watermark:
                raise OffsetOutOfRangeError(offset, log.log_start_offset, log.high_watermark)
            events = []
            for first, stop in spans:
                got = log.read(first, max_events - len(events), end_offset=stop)
                events += got
                # full, or cut short by max_bytes: the caller reads on from the last event
                if len(events) >= max_events or (got and got[-1].offset + 1 < stop):
                    break
        self.losses.count()
        return events

    def offsets_for_time(self, partition: int, timestamp: int) -> int | None:
        """Earliest offset of a partition with a timestamp >= `timestamp` (Kafka's)."""
        self.state.check_partition(partition)
        return self.state.logs[partition].offsets_for_time(timestamp)

    def list_offsets(self) -> list[tuple[int, int]]:
        """Each partition's (log start offset, last stable offset), as `read` bounds it: a
        reader's range, without the rest of status() (Kafka's ListOffsets, read committed)."""
        with self.state.lock:
            return [(log.log_start_offset,
                     log.high_watermark if self.read_only else self.state.visible_end(p))
                    for p, log in enumerate(self.state.logs)]

    def status(self, segments: bool = False) -> dict[str, Any]:
        """Everything an operator looks at (ChannelStatus.status)."""
        return self._status.status(segments)

    def flush(self) -> None:
        """Make every committed put and take durable now (policy mode's explicit flush)."""
        self.state.check_writable()
        for log in self.state.logs:
            log.flush()
        self.state.live_journal().sync()

    def flush_if_due(self) -> bool:
        """The flusher's hook: flush each partition whose flush_ms passed, sync the commit
        journal, expire lapsed take leases. True if a partition was flushed."""
        self.state.check_writable()
        with self.state.lock:
            self.takes.expire()
        flushed = False
        for log in self.state.logs:
            flushed = log.flush_if_due() or flushed
        self.state.live_journal().sync()  # free when nothing was appended since the last sync
        return flushed

    def checkpoint(self) -> CheckpointResult:
        """Write a checkpoint (primary, then backup) and delete what it makes unneeded."""
        return self.checkpointer.checkpoint()

    def checkpoint_if_due(self) -> CheckpointResult | None:
        """The checkpointer's hook: checkpoint when checkpoint_interval_ms has passed."""
        return self.checkpointer.checkpoint_if_due()

    def apply_retention(self) -> dict[str, Any]:
        """Delete what retention allows (Checkpointer.apply_retention)."""
        return self.checkpointer.apply_retention()

    def acknowledge_losses(self) -> int:
        """An operator has seen every loss recorded: acknowledge them all, durably (health
        is no longer degraded for them); return how many records that was."""
        return self.losses.acknowledge()

    # -- in process only: not an owner operation (the answer may hold a descriptor) --------
    def fetch(self, partition: int, start: int, end: int,
              max_bytes: int = DEFAULT_FETCH_BYTES) -> FetchData:
        """Committed batches of a partition from the one holding `start` toward `end`, one
        segment's at most (log/fetch.py); OffsetOutOfRangeError past the last stable offset.
        An aborted put's batch is never in an answer: one ends before it, and one asked
        from inside it begins after it (as past damage: the reader sees the gap)."""
        self.state.check_partition(partition)
        log = self.state.logs[partition]
        with self.state.lock:  # the unresolved puts change under it
            stable = self.state.visible_end(partition)
        if not log.log_start_offset <= start < stable:
            raise OffsetOutOfRangeError(start, log.log_start_offset, stable)
        spans = self.state.committed_spans(partition, start, min(end, stable))
        if not spans:  # nothing but aborted puts there: go on after them
            return FetchData(start, min(end, stable), b"")
        first, stop = spans[0]
        answer = fetch(log, first, stop, max_bytes)
        self.losses.count()  # damage the read skipped, as for read()
        if first == start:
            return answer
        return FetchData(start, answer.next_offset, answer.records)

    # -- for the tools ----------------------------------------------------------------------
    def record_lost(self, lost: Sequence[tuple[int, LostRange, int]]) -> None:
        """Record (partition, range, events) already out of the queue (Losses.record_lost)."""
        self.losses.record_lost(lost)

    def events(self, partition: int, start: int, end: int) -> Iterator[Event]:
        """Every event of a partition in [start, end), committed ones only."""
        self.state.check_partition(partition)
        for first, stop in self.state.committed_spans(
                partition, start, min(end, self.state.visible_end(partition))):
            yield from self.state.logs[partition].iter_events(first, stop)
        self.losses.count()  # not in a finally: a generator may be closed under our lock


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

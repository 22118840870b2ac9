"""Checkpointer: the owner's queue checkpoints, and the deletion they allow.

A checkpoint copies the queue state (a few ranges per partition, checkpoint.py)
under the channel lock, rotates the commit journal (commit_journal.py) and
writes primary then backup (use_dual_checkpoints) outside the lock. Then
segments every event of which is taken (by both checkpoint copies) are
deleted, and journals older than both copies removed. Before old journals go,
every multi-partition put whose commit record is in them has its batches
stamped committed, durably. apply_retention deletes taken segments always and
untaken events only when retention_ms / retention_bytes opt in, each dropped
event counted.

Concurrency: thread-safe; checkpoints run one at a time (the checkpoint lock,
taken before the channel lock, which is held only for the snapshot and the
journal swap). Failure: a primary that cannot be written raises StorageError
(counted in checkpoint_write_errors; the previous checkpoint and its journals
stay); a failed backup is reported ("failed: <why>", health degraded), never
raised. A home deleted or replaced meanwhile raises ChannelGoneError before
anything of it is removed.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from operator import methodcaller
from pathlib import Path
from typing import Any

from channel_engine.errors import StorageError
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal, counters
from channel_engine.queue.channel_state import ChannelState, UnresolvedPut
from channel_engine.queue.home_lock import HomeLock
from channel_engine.queue.losses import Losses
from channel_engine.queue.takes import Takes

CHECKPOINT_HISTORY = 20


@dataclass(frozen=True)
class CheckpointResult:
    """What one checkpoint wrote and how long it held the channel."""

    sequence: int
    written_at_ms: int
    duration_ms: float
    lock_held_ms: float
    backup: str  # "written", "off" or "failed: <why>"
    segments_deleted: int
    journals_removed: int

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for status output."""
        return self.__dict__.copy()


# A change made with a checkpoint: called under the lock before the snapshot, it makes the
# change and returns how to settle it once the write is done (True) or failed (False).
Change = Callable[[], Callable[[bool], None]]


class Checkpointer:
    """The owner's checkpoints and retention; see the module doc."""

    def __init__(self, state: ChannelState, home_lock: HomeLock, takes: Takes,
                 losses: Losses) -> None:
        self._state = state
        self._home_lock = home_lock
        self._takes = takes  # expires lapsed leases before the snapshot
        self._losses = losses  # the ledger is saved before the marking it counts
        self.config = state.config
        self.sequence = 0
        self._backup_sequence = 0
        self._backup_taken: list[int] | None = None
        # per partition, the head of its slowest subscription in the last checkpoint
        self._checkpoint_taken: list[int] = []
        self.last: CheckpointResult | None = None
        self.history: deque[CheckpointResult] = deque(maxlen=CHECKPOINT_HISTORY)
        self.last_ms = 0

    def restored(self, sequence: int) -> None:
        """The sequence the open restored (primary and backup alike), and the time now."""
        self.sequence = self._backup_sequence = sequence
        self.last_ms = self._state.now_ms()

    def checkpoint_if_due(self) -> CheckpointResult | None:
        """The checkpointer's hook: checkpoint when checkpoint_interval_ms has passed."""
        if self._state.now_ms() - self.last_ms < self.config.checkpoint_interval_ms:
            return None
        return self.checkpoint()

    def checkpoint(self) -> CheckpointResult:
        """Write a checkpoint (primary, then backup) and delete what it makes unneeded."""
        self._state.check_writable()
        return self.run()

    def run(self, change: Change | None = None) -> CheckpointResult:
        """Write a checkpoint (open and close call this even when not writable for puts).
        With `change` (a subscription added, removed or reset: subscriptions.py), the
        change is made under the lock just before the snapshot, so the checkpoint holds it,
        and settled once the primary is written (kept) or failed (undone); a change that
        raises (refused) leaves nothing written and nothing open."""
        home, backup = self.config.home, self.backup_dir()
        self._home_lock.check()
        with self._state.checkpoint_lock:
            started = time.perf_counter()
            self._losses.save_ledger()  # a loss record is durable before the marking it counts
            sequence = self.sequence + 1
            zero_fill = commit_journal.ZERO_FILL_BYTES if self.config.durability == "fsync" \
                else 0  # each take commit's fdatasync then overwrites zeros
            next_journal = commit_journal.CommitJournal(home, sequence, zero_fill)  # unlocked
            locked = time.perf_counter()
            with self._state.lock:
                self._takes.expire()
                try:
                    settle = change() if change is not None else None
                except BaseException:  # refused, nothing written: the next checkpoint of
                    next_journal.close()  # this sequence opens the same file again
                    raise
                saved, journalled = self._snapshot(sequence)
                old_journal, self._state.journal = self._state.journal, next_journal
            lock_held_ms = (time.perf_counter() - locked) * 1000
            if old_journal is not None:
                old_journal.close()  # its commits are in the snapshot; sync before it goes
            self._sync_commit_marks(journalled)
            try:
                checkpoint_file.write(saved, home, None, create=False)  # never a new home
            except OSError as exc:
                with self._state.room:
                    self._state.counters["checkpoint_write_errors"] += 1
                    if settle is not None:
                        settle(False)
                        self._state.room.notify_all()
                raise StorageError(home, exc, "writing the checkpoint") from exc
            if settle is not None:
                with self._state.room:
                    settle(True)
                    self._state.room.notify_all()
            self.sequence = sequence
            backup_state = self._write_backup(saved, backup)
            self._home_lock.check()  # deleted meanwhile: its journals are not ours to remove
            oldest = min(sequence, self._backup_sequence) if backup else sequence
            journals_removed = commit_journal.remove_before(home, oldest)
            self._checkpoint_taken = taken_by_all(saved)
            segments_deleted = self._delete_taken_segments()
            result = CheckpointResult(
                sequence, saved.written_at_ms, round((time.perf_counter() - started) * 1000, 3),
                round(lock_held_ms, 3), backup_state, segments_deleted, journals_removed)
            self.last = result
            self.history.append(result)
            self.last_ms = self._state.now_ms()
            return result

    def _snapshot(self, sequence: int) -> tuple[checkpoint_file.Checkpoint,
                                                list[tuple[int, UnresolvedPut]]]:
        """The queue state now (a few numbers per partition), and the multi-partition puts
        whose commit record is written but whose batches may not be stamped yet. Caller
        holds the lock."""
        parts = []
        journalled = []
        default = self._state.default.saved()  # in the partition records; the others after
        for p, (log, queue) in enumerate(zip(self._state.logs, default, strict=True)):
            saved = queue.to_checkpoint(log.log_start_offset, log.recovery_point,
                                        self._state.ends[p])
            pending = []
            for put in self._state.unresolved[p].values():
                if put.transaction_id is None:
                    continue
                if put.journalled:
                    journalled.append((p, put))
                else:
                    pending.append((put.transaction_id, put.start, put.end))
            parts.append(replace(saved, pending_puts=tuple(sorted(pending))) if pending
                         else saved)
        saved_at = self._state.now_ms()
        others = tuple(s.to_checkpoint() for s in self._state.subscriptions.values()
                       if s.id and not s.removing)
        aborted = []
        for p, log in enumerate(self._state.logs):  # what retention deleted is gone anyway
            kept = [r for r in self._state.aborted[p] if r[1] > log.log_start_offset]
            self._state.aborted[p] = kept
            aborted.append(tuple(sorted(kept)))
        subscription_counters = tuple((s.id, counters.saved(s.counters))
                                      for s in self._state.subscriptions.values()
                                      if not s.removing)
        return checkpoint_file.Checkpoint(
            sequence, saved_at, tuple(parts), subscriptions=others,
            next_subscription_id=self._state.next_subscription_id,
            aborted=tuple(aborted) if any(aborted) else (),
            counters=counters.saved(self._state.counters),
            subscription_counters=subscription_counters), journalled

    def _sync_commit_marks(self, journalled: list[tuple[int, UnresolvedPut]]) -> None:
        """Before journals go: every multi-partition put whose record is in them has its
        batches stamped committed, durably (so even without any checkpoint, recovery knows)."""
        for p, put in journalled:
            self._state.logs[p].mark_committed(put.segment_base_offset, put.position)
        for log in self._state.logs:
            log.sync_marks()

    def _write_backup(self, saved: checkpoint_file.Checkpoint, backup: Path | None) -> str:
        if backup is None:
            return "off"
        try:
            # a backup dir that vanished with a deleted home is not made again
            checkpoint_file.write(saved, backup, None, create=not self._home_lock.replaced())
        except OSError as exc:
            with self._state.lock:
                self._state.counters["checkpoint_backup_write_errors"] += 1
            return f"failed: {exc}"
        self._backup_sequence = saved.sequence
        self._backup_taken = taken_by_all(saved)
        return "written"

    def _delete_taken_segments(self) -> int:
        """Delete segments whose every event is taken in both checkpoint copies (so neither
        a reopen from the primary nor one from the backup needs them)."""
        deleted = 0
        for p, log in enumerate(self._state.logs):
            if p >= len(self._checkpoint_taken):
                break
            taken = self._checkpoint_taken[p]
            if self.backup_dir() is not None and self._backup_taken is not None \
                    and p < len(self._backup_taken):
                taken = min(taken, self._backup_taken[p])
            bases = [s.base_offset for s in log.segments if s.base_offset <= taken]
            if bases and bases[-1] > log.log_start_offset and bases[-1] <= log.high_watermark:
                deleted += len(log.delete_records_before(bases[-1]).deleted_base_offsets)
        return deleted

    def apply_retention(self) -> dict[str, Any]:
        """Delete what retention allows: taken segments always; untaken events only when
        retention_ms / retention_bytes opt in — each dropped event counted."""
        self._state.check_writable()
        dropped = unlinked = 0
        deleted = self._delete_taken_segments()
        for p, log in enumerate(self._state.logs):
            if self.config.retention_ms >= 0 or self.config.retention_bytes >= 0:
                result = log.apply_retention()
                deleted += len(result.deleted_base_offsets)
                with self._state.room:  # gone from every subscription; each counts its own
                    start = log.log_start_offset
                    lost = self._state.on_every_queue(
                        p, 0, start, methodcaller("skip_to", start),
                        "dropped_events")
                    dropped += lost
                    self._state.counters["dropped_events"] += lost
                    self._state.room.notify_all()
            unlinked += log.delete_expired_files()
        return {"segments_deleted": deleted, "events_dropped": dropped,
                "files_unlinked": unlinked}

    def backup_dir(self) -> Path | None:
        """The backup checkpoint's directory, if dual checkpoints are on."""
        config = self.config
        if config.use_dual_checkpoints and config.backup_checkpoint_dir:
            return Path(config.backup_checkpoint_dir)
        return None

    def status(self) -> dict[str, Any]:
        """The checkpoint part of the owner's status."""
        last = self.last
        return {
            "sequence": self.sequence,
            "interval_ms": self.config.checkpoint_interval_ms,
            "age_ms": self._state.now_ms() - self.last_ms,
            "backup": "off" if self.backup_dir() is None else (
                last.backup if last else "not written yet"),
            "last": last.to_dict() if last else None,
            "history": [c.to_dict() for c in self.history],
        }


def taken_by_all(saved: checkpoint_file.Checkpoint) -> list[int]:
    """Per partition, the offset below which every subscription of the checkpoint has
    taken every event: what a segment must end at or below to be deleted."""
    queues = list(saved.queues().values())
    return [min(q[p].taken_through for q in queues) for p in range(len(saved.partitions))]

"""Losses: counting what the channel can no longer deliver, in the loss ledger.

Offsets a log can no longer deliver (PartitionLog.take_new_losses: at open, and
whenever a read meets damage) and offsets the queue knew beyond a log's end
leave the queue as if taken (PartitionQueue.mark_lost); the events among them
not yet taken are counted lost and recorded in the loss ledger, `losses.json`
in the home (loss_ledger.py), durably before the marking is: at open by the
checkpoint that follows, later by a take-commit journal record with take id 0
(so a crash neither delivers nor counts them again). Counts never under-count;
when they can over-count (an offset a take returned and has not yet committed,
met damaged by another read) is in loss_ledger.py. A checkpoint's commit
journal found missing or headless at open is recorded there too (no event
lost, but committed takes may come back: at most the
events_may_come_back_at_most of the recovery report). Health stays "degraded"
until an operator acknowledges every record (acknowledge).

Concurrency: thread-safe. count() holds the checkpoint lock from the marking to
the ledger's save (no checkpoint between them), the channel lock for the
marking; the journal record is synced outside both. A ledger that cannot be
saved raises (StorageError) before the marking is journalled.
"""
from __future__ import annotations

from collections.abc import Sequence
from operator import methodcaller

from channel_engine.log.recovery import LostRange
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal
from channel_engine.queue.channel_state import ChannelState
from channel_engine.queue.home_lock import HomeLock
from channel_engine.queue.loss_ledger import LEDGER_FILE, LossLedger


class Losses:
    """The owner's loss counting and its ledger; see the module doc."""

    def __init__(self, state: ChannelState, home_lock: HomeLock) -> None:
        self._state = state
        self._home_lock = home_lock
        self.ledger = LossLedger(state.config.home / LEDGER_FILE, writable=False)

    def count(self, found: Sequence[tuple[int, LostRange, int | None]] = (),
              at_open: bool = False) -> None:
        """Take what the logs report lost, and `found` (events None: still to take out of
        the queue), out of the queues; record each range in the ledger, durably before the
        marking is (by a journal record here, or at open by the checkpoint that follows)."""
        if self._state.closing:
            return
        items = list(found) + [(log.partition, lost, None) for log in self._state.logs
                               for lost in log.take_new_losses()]
        if not items and not at_open:
            return
        with self._state.checkpoint_lock:  # no checkpoint between the marking and the ledger
            with self._state.room:
                marked = self._mark_lost(items, at_open)
                self._state.room.notify_all()
            self.save_ledger()
            if marked and not at_open and not self._state.read_only:
                with self._state.lock:  # take id 0: offsets taken out of the queue as lost
                    journal = self._state.live_journal()
                    ticket = journal.append(commit_journal.TAKE, 0, marked)
                journal.sync(ticket)

    def _mark_lost(self, items: Sequence[tuple[int, LostRange, int | None]],
                   at_open: bool) -> list[tuple[int, int, int]]:
        """count() under the lock; return the ranges marked."""
        counted, marked = [], []
        for p, lost, events in items:
            here = self.ledger.counted_here(p, lost)  # the same offsets, counted before
            if events is None:  # out of every subscription's queue; counted once
                end = min(lost.end, self._state.visible_end(p))
                for a, b in here:  # recorded before: out again, not counted again
                    self._state.on_every_queue(p, a, min(b, end),
                                               methodcaller("mark_lost", a, min(b, end)))
                events = self._state.on_every_queue(p, lost.start, end,
                                                    methodcaller("mark_lost", lost.start, end),
                                                    "lost_events")
                marked += [(p, lost.start, end)] if end > lost.start else []
            if not events and sum(b - a for a, b in here) == lost.end - lost.start:
                continue  # every offset of it is in a record of its place already
            counted.append((p, lost, events))
        fresh = self.ledger.record_all(counted, self._state.now_ms())
        self._state.counters["lost_events"] += sum(r.events for r in fresh)
        if at_open:
            self._state.recovery.lost_events += sum(r.events for r in fresh)
            self._state.recovery.lost_ranges += [r.to_dict() for r in fresh]
        return marked

    def record_lost(self, lost: Sequence[tuple[int, LostRange, int]]) -> None:
        """Record (partition, range, events) whose events are already out of the queue (the
        put commits `recover` cut from a journal: the open aborted their batches) in the
        loss ledger, durably; a range recorded before is not counted again."""
        self._state.check_writable()
        self.count(lost)

    def count_unknown_journals(self) -> None:
        """Journal content the open could not read (channel_recovery.py): every event the
        restored queue holds untaken may have been taken since; a missing checkpoint journal
        goes to the loss ledger (saved by the checkpoint that ends the open)."""
        unknown = self._state.recovery.journals_unknown
        if not unknown:
            return
        bound = self._state.backlog()  # the most any one subscription may see again
        self._state.recovery.events_may_come_back_at_most = bound
        for item in unknown:
            if item["missing"]:
                self.ledger.record_journal(
                    item["path"], item["generation"],
                    f"journal_missing: {item['path']}: {item['why']}; the take commits since "
                    f"checkpoint {item['generation']} are unknown: up to {bound} events may "
                    "come back (delivered again, at least once)", self._state.now_ms())

    def record_state_damaged(self, kept: list[str]) -> None:
        """At open: every checkpoint copy there is damaged (channel_recovery.py queued every
        event of the logs again): the takes committed before may be delivered again, at most
        every event the rebuilt queue holds; recorded in the ledger (saved by the checkpoint
        that ends the open), so health says so until an operator acknowledges it."""
        recovery = self._state.recovery
        bound = self._state.backlog()  # the most any one subscription may see again
        recovery.events_may_come_back_at_most = max(recovery.events_may_come_back_at_most,
                                                    bound)
        damaged = "; ".join(p for p in recovery.problems if not p.endswith(": missing")
                            and checkpoint_file.FILE_NAME in p and p not in kept)
        self.ledger.record_state(
            str(self._state.config.home), f"state_damaged: no readable checkpoint ({damaged}; "
            f"{'; '.join(kept)}): "
            "the queue is rebuilt from the logs, so takes committed before may come back: up "
            f"to {bound} events may be delivered again (at least once)", self._state.now_ms())

    def record_state_missing(self) -> None:
        """At open: no valid checkpoint of a channel that existed (channel_owner.py): its
        queue state is gone; recorded in the ledger (saved by the checkpoint that ends the
        open), so health says so until an operator acknowledges it."""
        home = self._state.config.home
        self.ledger.record_state(
            str(home), f"state_missing: no valid checkpoint in {home} (nor its backup) for a "
            "channel that existed: its queue state is gone; every event its logs still hold "
            "is queued again (takes committed before may come back: at least once), and "
            "events of partitions whose files are gone too cannot be counted",
            self._state.now_ms())

    def recount_lost(self) -> None:
        """At open: the channel's lost_events is at least what the ledger records (each
        lost event is recorded before it is counted; a kill may have lost the count)."""
        recorded = sum(self.ledger.events_by_partition().values())
        if recorded > self._state.counters["lost_events"]:
            self._state.counters["lost_events"] = recorded

    def save_ledger(self) -> None:
        self._home_lock.check()  # never into the ledger of a channel that replaced ours
        self.ledger.save()

    def acknowledge(self) -> int:
        """An operator has seen every loss recorded: acknowledge them all, durably (health
        is no longer degraded for them); return how many records that was."""
        self._state.check_writable()
        self._home_lock.check()
        return self.ledger.acknowledge(self._state.now_ms())


"""Counters: the channel's and each subscription's counters, kept across opens.

The counters (channel_state.COUNTERS: put_attempts, put_successes, take_successes,
rollbacks, dropped_events, lost_events, ...; subscription.COUNTERS per subscription) count
since the channel was made, as Kafka's and Flume's operators read them (a Prometheus
counter never goes backwards): each checkpoint saves them (checkpoint.py, version 5)
as they stood at its snapshot, under the channel lock that every counter moves under.

After a clean close (checkpoint_on_close, the default) the final checkpoint holds every
count: the next open restores them exactly, so a reopen or a settings change (which
reopens the channel) keeps them. After a kill (or a close with checkpoint_on_close
off) the open restores the last checkpoint's (a damaged primary: the backup's, with
the backup's older journals replayed) and adds what the durable records recount:

    counter                      recounted from
    ---------------------------  -------------------------------------------------------
    put_attempts, put_successes  every event the logs hold past the checkpoint's log end
                                 (from the log start without a checkpoint, or on a
                                 partition the checkpoint did not have); successes less
                                 the events of the puts the open aborts (no commit
                                 record), plus those of puts pending in the checkpoint
                                 that the journals say committed
    take_attempts, take_successes  every take commit in the replayed journals, for the
                                 channel and for its subscription (a take id 0 record
                                 marks a loss, not a take: not counted)
    aborted_events, dropped_events what the open aborts and drops (as any open counts)
    lost_events                  the channel's: at least the events of every record in
                                 the loss ledger (each lost event is recorded there
                                 before it is counted)

What a kill can overcount, and why:
  * take_attempts of a take open across the checkpoint and committed after it (its ask
    was counted when it reserved, its commit is recounted by replay), and put_attempts of
    a put waiting for room across the snapshot;
  * take_attempts and take_successes of take commits journaled between a snapshot whose
    primary write failed and its retry (the retry reuses that journal generation, and
    its snapshot already counts them). Losses are never overcounted.
Prometheus sees a counter that went down after a kill as a reset; one that went up by
an attempt as one more attempt.

What a kill can undercount, since the last checkpoint, and why:
  * put_errors, rollbacks, take_errors, takes_expired, checkpoint_write_errors,
    checkpoint_backup_write_errors, disk_full_errors, and take_attempts beyond the
    events committed: a failure, a rollback or an ask leaves no durable record;
  * put_attempts of puts that failed before writing, and the rollback of an aborted one;
  * puts whose events are no longer in the log: lost (flush-policy durability, damage)
    or deleted by retention before a checkpoint saw them;
  * a put whose batch was written but not yet acknowledged when the checkpoint's
    snapshot was taken (one group commit's window): its events lie below the saved log
    end and its success was counted after the snapshot;
  * take commits whose journal record was not synced (flush-policy durability: the
    take comes back, as the architecture's contract says) or that a damaged journal cut;
  * aborted_events of a put aborted since the checkpoint whose offsets a loss recorded
    after it also covers: replay applies the journalled loss first, which finds them out
    of every queue already (nothing counted lost), and the abort then finds nothing left;
  * a subscription's lost_events (the ledger records losses by channel, not by
    subscription), and every subscription counter of a subscription removed since;
  * everything before the last valid checkpoint when neither copy is readable: the
    counters start from 0 and recount the logs from their start.

Pure functions; the open (channel_recovery.py) calls them before any thread can see the
counters, the checkpointer (checkpointer.py) under the channel lock.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from channel_engine.queue.checkpoint import Checkpoint, Counters
from channel_engine.queue.subscription import COUNTERS as SUBSCRIPTION_COUNTERS


def saved(counters: Mapping[str, int]) -> Counters:
    """Counters as a checkpoint saves them: (name, value) pairs, in a stable order."""
    return tuple(counters.items())


def channel_counters(checkpoint: Checkpoint | None) -> dict[str, int]:
    """The channel's counters a checkpoint saved (none before version 5: empty)."""
    return dict(checkpoint.counters) if checkpoint is not None else {}


def subscription_counters(checkpoint: Checkpoint | None, sub_id: int) -> dict[str, int]:
    """A subscription's take counters as the checkpoint saved them, every one present
    (0 when the checkpoint has none: before version 5, or a subscription added since)."""
    found = dict.fromkeys(SUBSCRIPTION_COUNTERS, 0)
    if checkpoint is not None:
        for saved_id, counters in checkpoint.subscription_counters:
            if saved_id == sub_id:
                found.update((k, v) for k, v in counters if k in found)
    return found


def add(counters: dict[str, int], changes: Iterable[tuple[str, int]]) -> None:
    """Add each (name, amount) to `counters` (missing names start at 0)."""
    for name, amount in changes:
        if amount:
            counters[name] = counters.get(name, 0) + amount


def recount_puts(past_checkpoint: int, aborted_past: int, committed_pending: int,
                 ) -> list[tuple[str, int]]:
    """What the logs recount of puts: `past_checkpoint` events past the checkpoint's log
    ends, `aborted_past` of which belong to puts the open aborts, and `committed_pending`
    events of puts pending in the checkpoint that the journals say committed."""
    return [("put_attempts", past_checkpoint),
            ("put_successes", past_checkpoint - aborted_past + committed_pending)]


def recount_take(events: int) -> list[tuple[str, int]]:
    """What one replayed take commit of `events` events recounts."""
    return [("take_attempts", events), ("take_successes", events)]

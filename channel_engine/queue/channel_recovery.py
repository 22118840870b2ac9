"""Opening a channel: rebuild the queue of every subscription on every partition from the
newest checkpoint, the commit journals that follow it and the partition logs.

Every step applies to each subscription's queue (subscription.py): a checkpoint before
subscriptions (v1-v3) gives subscription `default` only; a take commit applies to its own
subscription's queue (one of an id the checkpoint does not know — removed since, or added
and never saved — to none), a loss or an aborted put to all of them; events are counted
once however many queues they left.

Flume replays every log file when its checkpoint is lost or torn and locks the
channel meanwhile; Weir reads the newest valid checkpoint (primary, else
backup), replays only the journals written since, and scans only the log
bytes written since (for multi-partition puts that never committed):

  1. each partition's queue comes from the checkpoint (takes that were in
     flight return to the head, in order); without a valid checkpoint, from
     the log start offset: every event still in the log is queued again, and
     the report says so;
  2. offsets below a log's start offset (retention deleted them) leave the queue;
  3. journalled take commits mark their ranges taken; journalled put commits
     mark their transactions committed;
  4. transactional batches not stamped committed (pending in the checkpoint,
     or written after it; every batch without a checkpoint) whose put has no
     commit record in those journals, and no batch stamped committed in another
     partition, are aborted: taken out of the queue
     without ever being delivered, and counted; those with a record are
     stamped committed (the owner does it before its first checkpoint, which
     syncs the stamps before it removes the journals);
  5. offsets the queue knew beyond a log's end, or the checkpoint saw below
     its log end (lost in flush-policy durability, or cut off as damage), are
     forgotten; those not yet taken are counted lost, and the range is handed
     to the owner (Restored.lost) for its loss ledger, with the ranges the logs
     report lost (loss_ledger.py); a writable open then makes the log go on at
     the end the queue knew (PartitionLog.start_at: an empty log, its directory
     lost and made again, starts there), so no offset is handed out twice and a
     drain that sent the old ones never takes new events for them (as in Kafka).

Journal content that is unknown (commit_journal's rule: the checkpoint's own
journal missing, empty or without a whole header; or any replayed journal with
a torn tail after its header) is listed in journals_unknown; the owner then sets
events_may_come_back_at_most to every event its restored queue holds untaken
(any of them may have been taken, committed and journalled since the
checkpoint: at least once, they come back), and records a missing or headerless
checkpoint journal in its loss ledger (events 0: nothing is lost, but health
stays degraded until an operator acknowledges it). An intact journal sets no
bound.

Counters: the checkpoint's (version 5) are the base, for the channel and for each
subscription; the puts past the checkpoint's log ends and the take commits replayed are
added (counters.py has the rules, and what a kill can undercount); the report's
counters_recounted says what was added.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from operator import methodcaller
from pathlib import Path
from typing import Any

from channel_engine.log.partition_log import PartitionLog
from channel_engine.log.recovery import LostRange
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal, counters
from channel_engine.queue.partition_queue import PartitionQueue
from channel_engine.queue.subscription import DEFAULT, Subscription, take_out


@dataclass
class ChannelRecovery:
    """What opening a channel found and did (JSON-serialisable via to_dict)."""

    checkpoint_source: str | None = None  # "primary", "backup" or None (rebuilt from logs)
    created: bool = False  # made by this open (Channel.create): no checkpoint is no problem
    checkpoint_absent: bool = False  # no copy there at all (not damaged: a wipe leaves no
    # trace, a damaged copy is kept aside by `recover`)
    checkpoint_sequence: int = 0
    checkpoint_version: int = 0  # format version of the checkpoint used (0: none)
    problems: list[str] = field(default_factory=list)
    journals_replayed: int = 0
    take_commits_replayed: int = 0
    put_commits_replayed: int = 0
    journal_bytes_ignored: int = 0
    in_flight_returned: int = 0
    aborted_events: int = 0
    aborted_puts: list[list[int]] = field(default_factory=list)  # transaction id, partition,
    # start, end, events aborted: each batch of step 4 that lost untaken events
    lost_events: int = 0  # untaken events of lost ranges counted at this open
    dropped_events: int = 0
    journals_unknown: list[dict[str, Any]] = field(default_factory=list)  # path,
    # generation, why, missing (the checkpoint's journal: damage, recorded as a loss)
    events_may_come_back_at_most: int = 0  # set by the owner when journals_unknown
    lost_ranges: list[dict[str, Any]] = field(default_factory=list)  # partition, start,
    # end, events, path, position, length, cause of each range counted at this open
    counters_recounted: dict[str, int] = field(default_factory=dict)  # added by replay to
    # the checkpoint's counters (counters.py)
    duration_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for status output."""
        return asdict(self)


@dataclass
class Restored:
    """The queues rebuilt on open, the newest checkpoint sequence, and the report."""

    subscriptions: list[Subscription]  # `default` first
    next_subscription_id: int
    aborted: list[list[tuple[int, int]]]  # per partition: checkpoint.py's aborted ranges
    sequence: int
    next_generation: int
    report: ChannelRecovery
    to_mark: list[tuple[int, int, int]]  # (partition, segment base, position) to stamp
    lost: list[tuple[int, LostRange, int]]  # (partition, range beyond the log end, events)
    counters: dict[str, int] = field(default_factory=dict)  # the channel's, as restored


def restore(home: Path, backup: Path | None, logs: Sequence[PartitionLog],
            new: bool = False) -> Restored:
    """Rebuild every partition's queue; see the module doc for the steps. `new`: a channel
    made by this open (Channel.create, checked empty first): it has no checkpoint yet."""
    started = time.perf_counter()
    report = ChannelRecovery(created=new)
    found = checkpoint_file.read_newest(home, backup)
    saved = found.checkpoint
    if not new:
        report.problems.extend(found.problems)
    report.checkpoint_source = found.source
    report.checkpoint_sequence = saved.sequence if saved else 0
    report.checkpoint_version = saved.version if saved else 0
    report.checkpoint_absent = saved is None and all(p.endswith(": missing")
                                                     for p in found.problems)
    if saved is None and not new:
        report.problems.append("no valid checkpoint: every event in the logs is queued "
                               "again, takes committed before the last checkpoint included")

    subs, undecided, stamped = _queues_from(saved, logs, report)
    if saved is not None and home.is_dir():
        _check_checkpoint_journal(home, backup, saved.sequence, report)
    committed_txns = _replay_journals(home, report.checkpoint_sequence, subs, report)
    committed_txns |= stamped
    to_mark = []
    aborted_ranges: list[list[tuple[int, int]]] = [
        list(saved.aborted[p]) if saved is not None and p < len(saved.aborted) else []
        for p in range(len(logs))]
    recount_from = _recount_from(saved, logs)
    aborted_past = committed_pending = 0  # events, for the put recount (counters.py)
    for batch in undecided:
        past = batch.start >= recount_from[batch.partition]
        if batch.transaction_id in committed_txns:
            to_mark.append((batch.partition, batch.segment_base_offset, batch.position))
            committed_pending += 0 if past else batch.end - batch.start
            continue
        aborted_past += batch.end - batch.start if past else 0
        aborted_ranges[batch.partition].append((batch.start, batch.end))
        aborted = take_out(subs, batch.partition, batch.start, batch.end,
                           logs[batch.partition].log_end_offset,
                           methodcaller("mark_committed", [(batch.start, batch.end)]))
        if aborted:
            report.aborted_events += aborted
            report.aborted_puts.append([batch.transaction_id, batch.partition, batch.start,
                                        batch.end, aborted])
    lost = _lost_beyond_log_ends(saved, subs, logs)
    put_past = sum(max(0, log.log_end_offset - start)
               for log, start in zip(logs, recount_from, strict=True))
    counters.add(report.counters_recounted,
                 counters.recount_puts(put_past, aborted_past, committed_pending))
    restored_counters = counters.channel_counters(saved)
    counters.add(restored_counters, report.counters_recounted.items())

    generations = commit_journal.generations(home) if home.is_dir() else []
    next_generation = max([report.checkpoint_sequence] + generations) + 1
    report.duration_ms = round((time.perf_counter() - started) * 1000, 3)
    next_id = saved.next_subscription_id if saved is not None else 1
    return Restored(subs, next_id, aborted_ranges, report.checkpoint_sequence,
                    next_generation, report, to_mark, lost, restored_counters)


def _recount_from(saved: checkpoint_file.Checkpoint | None,
                  logs: Sequence[PartitionLog]) -> list[int]:
    """Per partition, the offset from which the logs' events are recounted as puts: the
    checkpoint's log end, or the log start where the checkpoint has no such partition."""
    return [saved.partitions[p].log_end_offset
            if saved is not None and p < len(saved.partitions) else log.log_start_offset
            for p, log in enumerate(logs)]


def _lost_beyond_log_ends(saved: checkpoint_file.Checkpoint | None,
                          subs: list[Subscription],
                          logs: Sequence[PartitionLog]) -> list[tuple[int, LostRange, int]]:
    """Step 5: a log ending below the offsets a queue knew, or below the log end its
    checkpoint saw (without a log.state, the log itself cannot tell): the queues forget
    them; the ones some subscription had not taken (in flight or returned, and never
    reserved) are lost events."""
    lost = []
    for partition, log in enumerate(logs):
        saved_end = saved.partitions[partition].log_end_offset \
            if saved is not None and partition < len(saved.partitions) else 0
        end = log.log_end_offset
        known = max([saved_end] + [s.queues[partition].known_end for s in subs])
        if known <= end:
            continue
        events = take_out(subs, partition, end, known, end,
                          methodcaller("clip_to", end), "lost_events")
        lost.append((partition, LostRange(
            end, known, str(log.directory), cause=f"queue_beyond_log_end: the queue knew "
            f"offsets up to {known - 1}, the log ends at {end}"), events))
        if not log.read_only:  # offsets are never handed out twice (drains sent them)
            log.start_at(known)
            take_out(subs, partition, end, known, known, methodcaller("mark_lost", end, known))
    return lost


def start_recreated(subs: list[Subscription], logs: Sequence[PartitionLog],
                    next_offsets: Mapping[int, int]) -> None:
    """After step 5: a partition recreated by this open (or by one a crash cut short: its
    incarnation still pending) goes on at the operator's next offset when that is above
    its end (the offsets between leave every queue: they never held events), and its
    incarnation records where it starts (log/incarnation.py)."""
    for partition, log in enumerate(logs):
        if not log.incarnation.pending:
            continue
        end, wanted = log.log_end_offset, next_offsets.get(partition, 0)
        if wanted > end:
            log.start_at(wanted)
            take_out(subs, partition, end, wanted, wanted,
                     methodcaller("mark_lost", end, wanted))
        log.settle_incarnation()


@dataclass(frozen=True)
class _Undecided:
    """A transactional batch not stamped committed: its put's fate is in the journals."""

    partition: int
    transaction_id: int
    start: int
    end: int
    segment_base_offset: int
    position: int


def _queues_from(saved: checkpoint_file.Checkpoint | None, logs: Sequence[PartitionLog],
                 report: ChannelRecovery
                 ) -> tuple[list[Subscription], list[_Undecided], set[int]]:
    """Steps 1 and 2, and the scan for step 4: the queues, every transactional batch
    that may be undecided — from the checkpoint's log end (or its oldest pending put) on,
    or from the log start without a checkpoint — and the transactions of the batches
    stamped committed there. A stamped batch is decided, and so are its put's other
    batches: a stamp is written only after the commit record, and may reach the disk
    without it in policy durability (the record is not synced there)."""
    saved_queues = saved.queues() if saved is not None else {(0, DEFAULT): ()}
    subs = [Subscription(sub_id, name, [], counters=counters.subscription_counters(saved, sub_id))
            for sub_id, name in saved_queues]
    undecided: list[_Undecided] = []
    stamped: set[int] = set()
    for partition, log in enumerate(logs):
        for sub, queues in zip(subs, saved_queues.values(), strict=True):
            if partition < len(queues):
                sub.queues.append(PartitionQueue.from_checkpoint(queues[partition]))
                report.in_flight_returned += sum(e - s for s, e in queues[partition].in_flight)
            else:  # no checkpoint, or a partition grown since: everything in the log is new
                sub.queues.append(PartitionQueue(log.log_start_offset))
        if saved is not None and partition < len(saved.partitions):
            part = saved.partitions[partition]
            scan_from = min([part.log_end_offset] + [start for _, start, _ in part.pending_puts])
        else:
            scan_from = log.log_start_offset
        start = log.log_start_offset
        report.dropped_events += take_out(subs, partition, 0, start, log.log_end_offset,
                                          methodcaller("skip_to", start),
                                          "dropped_events")
        scan_from = max(scan_from, log.log_start_offset)
        if scan_from < log.high_watermark:
            for segment, position, header in log.batch_headers(scan_from):
                txn_id = header.transaction_id
                if txn_id is not None and header.marked_committed:
                    stamped.add(txn_id)
                elif txn_id is not None:
                    undecided.append(_Undecided(partition, txn_id, header.base_offset,
                                                header.next_offset, segment.base_offset,
                                                position))
    return subs, undecided, stamped


def _check_checkpoint_journal(home: Path, backup: Path | None, sequence: int,
                              report: ChannelRecovery) -> None:
    """The checkpoint's own journal must have its header (commit_journal's rule)."""
    why = commit_journal.checkpoint_journal_problem(home, sequence)
    if why is None:
        return
    newest = checkpoint_file.read_newest(home, backup).checkpoint
    if newest is not None and newest.sequence != sequence:
        return  # a read-only open raced the owner's checkpoint, which removed the journal
    path = commit_journal.journal_path(home, sequence)
    report.journals_unknown.append({"path": str(path), "generation": sequence, "why": why,
                                    "missing": True})
    report.problems.append(f"{path}: {why}, though checkpoint {sequence} was written after its "
                           "header was synced: the take commits since that checkpoint are "
                           "unknown (see events_may_come_back_at_most)")


def _replay_journals(home: Path, sequence: int, subs: list[Subscription],
                     report: ChannelRecovery) -> set[int]:
    """Step 3: apply journalled take commits; return the committed put transaction ids."""
    committed: set[int] = set()
    if not home.is_dir():
        return committed
    for path, commits, ignored in commit_journal.replay_from(home, sequence):
        report.journals_replayed += 1
        if ignored:
            report.journal_bytes_ignored += ignored
            report.problems.append(f"{path}: {ignored} bytes after the last valid record "
                                   "ignored (a commit that never returned, or a cut)")
            if commits or ignored < path.stat().st_size:  # after a whole header: unknown
                report.journals_unknown.append({
                    "path": str(path), "generation": commit_journal.journal_generation(path),
                    "why": f"{ignored} bytes after the last valid record", "missing": False})
        for commit in commits:
            if commit.kind == commit_journal.PUT:
                committed.add(commit.commit_id)
                report.put_commits_replayed += 1
                continue
            report.take_commits_replayed += 1
            taken_by = _taken_by(commit, subs)
            for partition, start, end in commit.entries:
                for sub in taken_by:
                    if partition < len(sub.queues):
                        sub.queues[partition].mark_committed([(start, end)])
            if commit.commit_id != 0:  # a take (take id 0 marks a loss, not a take)
                recount = counters.recount_take(sum(e - s for _, s, e in commit.entries))
                counters.add(report.counters_recounted, recount)
                for sub in taken_by:
                    counters.add(sub.counters, recount)
    return committed


def _taken_by(commit: commit_journal.Commit, subs: list[Subscription]) -> list[Subscription]:
    """The subscriptions whose queues a journalled take commit applies to: its own (none
    if removed since), or all for offsets taken out as lost (take id 0)."""
    if commit.kind == commit_journal.TAKE and commit.commit_id == 0:
        return subs
    return [sub for sub in subs if sub.id == commit.subscription]

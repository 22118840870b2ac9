"""Channel against a queue model: a hypothesis state machine.

The model is, per partition, the committed events by offset, and per subscription one
queue: per partition its sorted offsets still queued, and where every other offset went for
it (taken by a committed take, lost, or before the position it was placed at); plus the
open take transactions, each of one subscription, with what each reserved. A take serves
each partition's lowest queued offsets of its subscription: events a take returned
(rollback, lapsed lease, dead owner or client) come back ahead of everything never taken,
in offset order. A put adds its events to every subscription's queue; a loss takes them
out of every one. Besides, per partition, the events of aborted puts by offset: in the log
(the log end is past them), in no queue, never to be taken or read.

Each step does one thing to the real channel: put (commit, rollback, or a `with` block that
exits cleanly or with an error), put across partitions and fail part way (the append to one
partition refused after the batches of those before it were written, in the owner or sent
by a client: the put is aborted), begin a take of a subscription (with or without a lease),
take more, commit or roll back a take, take in a `with` block, put and take through a
second Channel that is a client of the owner (its open take rolls back when it
disconnects), let time pass (leases lapse), checkpoint, flush, apply retention, read a
partition from a drawn offset, page by page (in the owner, through a client, in a read-only
snapshot: its committed events still in the log, in order, never an aborted put's), lose a
range of offsets (as a read meeting damage reports it: the channel takes its untaken events
out of every queue and out of open takes, counts and records them) and acknowledge the
losses, add a subscription (at the earliest or latest offset, at an offset per partition,
or at a time), remove one, reset one (Kafka's --reset-offsets; refused while it has takes
open), crash the owner (kill -9 between two steps) or close it and reopen (sometimes with
one more partition or another codec), use a take left over from before a reopen (it must be
dead). After every step the channel's status is compared with the model: every
subscription's counts and head per partition, its open takes and take counters; the
channel's, which are its slowest subscription's; log end offsets, open takes, the counters,
the losses and health; a reopen also checks what recovery reports (nothing lost or dropped
at open; the journal commits it replayed; aborted: without a final checkpoint, the events
of the puts aborted since the last one, which the open aborts again, but for those a
journalled loss mark took out of the queues first). A subscription change is durable when
it returns (it writes a checkpoint), so the subscriptions and their positions after a crash
are the model's. The counters count since the channel was made: a close that checkpoints
keeps them exactly; after a crash (or a close without checkpoint_on_close) they are the
last checkpoint's plus the puts and take commits since (what replay recounts: an aborted
put's events in the log are put attempts, not successes) and what the open aborts again,
the channel's lost events the ledger's.

Every event body is unique (a counter), so an event taken twice by one subscription, lost,
or coming back after its take committed shows up as a mismatch. Keyed events must land
where Kafka's default partitioner puts them (murmur2 from kafka-python, an implementation
independent of the engine's); keyless events of one put must land together in one
partition.

The log start offset (where "earliest" is) depends on which segments a checkpoint could
delete, so on their sizes: the model learns it from the engine, and checks that it never
moves back and never passes an event some subscription has not taken.

Configurations are drawn so that segments roll all the time and checkpoints delete
fully-taken segments: small segment_bytes, 1..3 partitions, fsync or policy durability,
a capacity that is sometimes small (puts then fail with ChannelFullError, keep_alive_ms=0),
dual checkpoints on or off, checkpoint on close on or off. A crash keeps the page cache
(channel_helpers.crash), so nothing committed may be lost, even in policy durability.

Closing or crashing an owner waits for its socket server's poll interval (0.2 s), so
reopening dominates the run time: it needs a few steps of activity since the last open.
"""
from __future__ import annotations

import bisect
import contextlib
import errno
import shutil
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from channel_helpers import crash, make_config
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from channel_engine import (
    BatchTooLargeError,
    Channel,
    ChannelConfig,
    ChannelFullError,
    Event,
    OffsetOutOfRangeError,
    PutTransaction,
    StorageError,
    SubscriptionBusyError,
    SubscriptionExistsError,
    TakeExpiredError,
    TakeTransaction,
    TransactionCapacityError,
    TransactionStateError,
    UnknownSubscriptionError,
)
from channel_engine.log.partition_log import PartitionLog
from channel_engine.log.recovery import LostRange

with warnings.catch_warnings():  # kafka-python's protocol schemas use deprecated importlib APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2

START_MS = 1_700_000_000_000
STAMP_SPREAD_MS = 10_000_000  # events are put with timestamps START_MS +- this, or none
CODECS = ["none", "gzip", "lz4", "zstd"]
MAX_OPEN_TAKES = 4
STEPS_BEFORE_REOPEN = 3
MODEL_COUNTERS = ("put_attempts", "put_successes", "put_errors", "take_attempts",
                  "take_successes", "rollbacks", "takes_expired", "aborted_events",
                  "dropped_events", "lost_events")
DEFAULT = "default"
SUBSCRIPTIONS = ("archive", "live", "sink")  # the names the machine adds, besides default
SUBSCRIPTION_COUNTERS = ("take_attempts", "take_successes", "rollbacks", "takes_expired",
                         "dropped_events", "lost_events")
QUEUE_FIGURES = ("taken_through", "events_queued", "events_untaken", "events_in_flight")

KEY_POOL = [b"k%d" % i for i in range(32)]
keys = st.none() | st.sampled_from(KEY_POOL[:8]) | st.binary(max_size=6)
headers = st.none() | st.dictionaries(st.sampled_from(["a", "b", "trace"]),
                                      st.binary(max_size=6), max_size=2)
timestamps = st.none() | st.integers(START_MS - STAMP_SPREAD_MS, START_MS + STAMP_SPREAD_MS)

Place = tuple[int, int]  # (partition, offset)
Position = str | dict[Any, int]  # as add_subscription and reset_subscription take it


@dataclass(frozen=True)
class Spec:
    """One event to put: its body is a unique counter followed by the drawn padding."""

    key: bytes | None
    headers: dict[str, bytes] | None
    timestamp: int | None
    padding: bytes


specs = st.builds(Spec, keys, headers, timestamps, st.binary(max_size=60))
puts = st.lists(specs, min_size=1, max_size=18)


@dataclass(frozen=True)
class Sent:
    """An event as committed: what a take must return for it."""

    body: bytes
    key: bytes | None
    headers: dict[str, bytes]
    timestamp: int | None  # None: the engine stamped "now"


@dataclass
class ModelTake:
    """An open take transaction of a subscription and what it reserved, (partition, offset)
    in take order."""

    tx: TakeTransaction
    deadline_ms: int | None
    subscription: str
    reserved: list[Place] = field(default_factory=list)
    taken: int = 0
    expired: bool = False  # its lease ran out: its events are queued again


@dataclass
class ModelSubscription:
    """One subscription's queue: per partition the offsets a take of it may get, sorted
    (returned events come back ahead of the never taken, in offset order); and where every
    other offset of the log went for it, besides its open takes."""

    queued: list[list[int]]
    consumed: set[Place] = field(default_factory=set)  # its takes committed them
    lost: set[Place] = field(default_factory=set)  # untaken by it when their range was lost
    # before the position it was placed at, or lost before it got there: never its to take
    skipped: set[Place] = field(default_factory=set)
    counters: Counter[str] = field(default_factory=Counter)  # its take counters
    saved: Counter[str] = field(default_factory=Counter)  # as the last checkpoint saved them
    replayed: Counter[str] = field(default_factory=Counter)  # what replay recounts since

    def forget(self, partition: int) -> None:
        """Forget where the offsets of a partition went (a reset places it again)."""
        for places in (self.consumed, self.lost, self.skipped):
            places -= {place for place in places if place[0] == partition}


class Boom(Exception):
    """Raised inside a `with` block: the transaction must roll back."""


@st.composite
def channel_settings(draw: st.DrawFn) -> dict[str, object]:
    durability = draw(st.sampled_from(["fsync", "policy"]))
    small = draw(st.sampled_from([False, False, False, True]))
    transaction_capacity = draw(st.integers(3, 16))
    return {
        "partitions": draw(st.integers(1, 3)),
        "segment_bytes": draw(st.integers(1024, 2048)),
        "index_interval_bytes": draw(st.sampled_from([0, 200, 4096])),
        "durability": durability,
        # policy: a small flush_messages, or no bound but a flush_ms that never comes due
        # here (the clock moves seconds, not hours; policy needs one of the two)
        "flush_messages": draw(st.none() | st.integers(1, 20)) if durability == "policy"
        else None,
        "flush_ms": 3_600_000 if durability == "policy" else None,
        "compression": draw(st.sampled_from(CODECS)),
        "capacity": draw(st.integers(transaction_capacity, 60)) if small else 100_000,
        "transaction_capacity": transaction_capacity,
        "keep_alive_ms": 0,
        "checkpoint_interval_ms": draw(st.integers(1_000, 5_000)),
        "checkpoint_on_close": draw(st.booleans()),
        "use_dual_checkpoints": draw(st.booleans()),
    }


def kafka_partition(key: bytes, partitions: int) -> int:
    """Kafka's DefaultPartitioner for a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def specs_in(partition: int, partitions: int) -> st.SearchStrategy[Spec]:
    """An event whose key Kafka's partitioner puts in `partition`."""
    placed = [key for key in KEY_POOL if kafka_partition(key, partitions) == partition]
    return st.builds(Spec, st.sampled_from(placed), headers, timestamps, st.binary(max_size=60))


@contextlib.contextmanager
def append_refused(partition: int) -> Iterator[None]:
    """Every append to `partition` fails with an I/O error (as StorageError: nothing of it
    written), appends to the others go through: a put across partitions fails part way."""
    original = PartitionLog.append_batch

    def refuse(log: PartitionLog, batch: bytearray, defer_flush: bool = False) -> Any:
        if log.partition == partition:
            raise StorageError(log.directory, OSError(errno.EIO, "I/O error"), "appending")
        return original(log, batch, defer_flush)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PartitionLog, "append_batch", refuse)
        yield


def kind_of(position: Position) -> str:
    """What kind of position it is, for hypothesis's statistics."""
    if isinstance(position, str):
        return position
    return "a time" if "timestamp_ms" in position else "offsets"


class ChannelMachine(RuleBasedStateMachine):
    """One channel and its model."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="weir-channel-props-"))
        self.config: ChannelConfig | None = None
        self.channel: Channel | None = None
        self.clock_ms = START_MS
        self.counter = 0  # makes every body unique
        self.stored: list[dict[int, Sent]] = []  # per partition: offset -> committed event
        # per partition: offset -> event of an aborted put (in the log, never to be seen)
        self.aborted: list[dict[int, Sent]] = []
        self.unsaved_aborts: set[Place] = set()  # aborted since the last checkpoint
        self.unsaved_loss_marks: set[Place] = set()  # marked lost (journalled) since then
        self.log_end: list[int] = []
        self.log_start: list[int] = []  # as the engine last reported it (learn_log_starts)
        # by name, in the order they were added (the engine's): default first
        self.subscriptions: dict[str, ModelSubscription] = {DEFAULT: ModelSubscription([])}
        self.lost: set[Place] = set()  # untaken by some subscription when their range was lost
        self.loss_records: dict[tuple[int, int, int], bool] = {}  # key -> acknowledged
        self.takes: dict[int, ModelTake] = {}
        self.take_ids = 0
        self.counters: Counter[str] = Counter()  # since the channel was made
        self.saved_counters: Counter[str] = Counter()  # as the last checkpoint saved them
        self.replayed: Counter[str] = Counter()  # what an open after a crash recounts
        self.journal_takes = 0  # take commits journalled since the last checkpoint
        self.journal_puts = 0  # multi-partition put commits journalled since then
        self.last_checkpoint_ms = 0
        self.steps_since_open = 0
        self.dead: list[TakeTransaction] = []  # takes open when their owner went away

    # -- helpers ------------------------------------------------------------------------------
    @property
    def ch(self) -> Channel:
        assert self.channel is not None
        return self.channel

    @property
    def cfg(self) -> ChannelConfig:
        assert self.config is not None
        return self.config

    def clock(self) -> float:
        return self.clock_ms / 1000

    def now_ms(self) -> int:
        """The engine's "now", computed as it computes it: int(clock() * 1000)."""
        return int(self.clock() * 1000)

    def open(self) -> None:
        self.channel = Channel.open(self.cfg, clock=self.clock)
        assert self.ch.role == "owner"
        while len(self.log_end) < self.cfg.partitions:  # a new partition: new in every queue
            self.stored.append({})
            self.aborted.append({})
            self.log_end.append(0)
            self.log_start.append(0)
            for sub in self.subscriptions.values():
                sub.queued.append([])
        self.steps_since_open = 0

    def checkpointed(self) -> None:
        self.journal_takes = self.journal_puts = 0
        self.unsaved_aborts, self.unsaved_loss_marks = set(), set()
        self.last_checkpoint_ms = self.now_ms()
        self.saved_counters, self.replayed = Counter(self.counters), Counter()
        for sub in self.subscriptions.values():
            sub.saved, sub.replayed = Counter(sub.counters), Counter()

    def restored_counters(self) -> None:
        """An open without a final checkpoint (a crash, or checkpoint_on_close off): the
        last checkpoint's counters, plus what replay recounts from the logs and journals
        (the puts and take commits since); the channel's lost events are the ledger's."""
        lost = self.counters["lost_events"]
        self.counters = self.saved_counters + self.replayed
        self.counters["lost_events"] = lost
        for sub in self.subscriptions.values():
            sub.counters = sub.saved + sub.replayed

    def committed_take(self, subscription: str, events: int) -> None:
        """A take committed `events` events: journalled, so replay recounts them."""
        self.count(subscription, "take_successes", events)
        for counters in (self.replayed, self.subscriptions[subscription].replayed):
            counters["take_attempts"] += events
            counters["take_successes"] += events

    def live_takes(self, subscription: str | None = None) -> list[ModelTake]:
        """The open takes whose lease has not run out, of one subscription or of all."""
        return [t for t in self.takes.values() if not t.expired
                and (subscription is None or t.subscription == subscription)]

    def in_flight(self, subscription: str | None = None) -> list[Place]:
        return [place for t in self.live_takes(subscription) for place in t.reserved]

    def queued_total(self, subscription: str) -> int:
        return sum(len(q) for q in self.subscriptions[subscription].queued)

    def untaken_of(self, subscription: str) -> int:
        """Its queued and in-flight events: its lag, as Kafka would say."""
        return self.queued_total(subscription) + len(self.in_flight(subscription))

    def untaken(self) -> int:
        """The slowest subscription's untaken events: what capacity counts."""
        return max(self.untaken_of(name) for name in self.subscriptions)

    def count(self, subscription: str, counter: str, amount: int = 1) -> None:
        """A take counter moves for the channel and for the take's subscription."""
        self.counters[counter] += amount
        self.subscriptions[subscription].counters[counter] += amount

    def requeue(self, subscription: str, places: list[Place]) -> None:
        """Events of a take that ended without commit: queued again, in offset order."""
        queued = self.subscriptions[subscription].queued
        for p, offset in places:
            assert offset not in queued[p]
            bisect.insort(queued[p], offset)

    def check_event(self, got: Event) -> None:
        assert got.offset not in self.aborted[got.partition], f"an aborted put's event: {got}"
        sent = self.stored[got.partition][got.offset]
        assert (got.body, got.key, got.headers) == (sent.body, sent.key, sent.headers), got
        if sent.timestamp is not None:
            assert got.timestamp == sent.timestamp, got

    def check_take(self, subscription: str, got: list[Event], n: int) -> None:
        """A take of up to n events got the oldest queued ones of each partition of its
        subscription; they leave its queue (the caller records them as reserved)."""
        sub = self.subscriptions[subscription]
        queued = self.queued_total(subscription)
        assert len(got) == min(n, queued), (subscription, n, queued, got)
        in_flight = set(self.in_flight(subscription))
        by_partition: dict[int, list[int]] = {}
        for e in got:
            place = (e.partition, e.offset)
            assert place not in sub.consumed, f"taken again after its take committed: {e}"
            assert place not in in_flight, f"in another open take: {e}"
            self.check_event(e)
            by_partition.setdefault(e.partition, []).append(e.offset)
        for p, offsets in by_partition.items():
            head = sub.queued[p][:len(offsets)]
            assert offsets == head, f"{subscription} {p}: took {offsets}, the head is {head}"
            del sub.queued[p][:len(offsets)]

    def pick_subscription(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(list(self.subscriptions)), label="subscription")

    # -- opening and reopening ----------------------------------------------------------------
    @initialize(chosen=channel_settings(), prefill=st.lists(puts, max_size=6),
                added=st.lists(st.sampled_from(SUBSCRIPTIONS), unique=True, max_size=2),
                data=st.data())
    def create(self, chosen: dict[str, object], prefill: list[list[Spec]], added: list[str],
               data: st.DataObject) -> None:
        """A new channel, with a few puts committed so that takes find segments to empty,
        and a subscription or two besides default."""
        if chosen["use_dual_checkpoints"]:
            chosen = {**chosen, "backup_checkpoint_dir": str(self.root / "backup")}
        self.config = make_config(self.root, **chosen)
        self.open()
        self.checkpointed()
        for events in prefill:
            self.do_put(self.ch, events, "commit")
        for name in added:
            self.add(name, *self.draw_position(data, adding=True))

    @precondition(lambda self: self.steps_since_open >= STEPS_BEFORE_REOPEN)
    @rule(how=st.sampled_from(["crash", "close"]), grow=st.booleans(),
          compression=st.sampled_from(CODECS))
    def reopen(self, how: str, grow: bool, compression: str) -> None:
        """The owner dies or closes; the channel is opened again, sometimes with one more
        partition (keys move) or another codec. Open takes are dead: their events return.
        Every subscription is there, where the model has it."""
        in_flight = len(self.in_flight())
        if how == "crash":
            crash(self.ch)
        else:
            self.ch.close()
        for take in self.live_takes():
            self.requeue(take.subscription, take.reserved)
        self.dead.extend(take.tx for take in self.takes.values())
        self.takes.clear()
        changes: dict[str, object] = {"compression": compression}
        if grow and self.cfg.partitions < 3:
            changes["partitions"] = self.cfg.partitions + 1
            event("reopened with one more partition")
        self.config = self.cfg.replace(**changes)
        restored = how == "crash" or not self.cfg.checkpoint_on_close
        # without a final checkpoint the open aborts again the puts aborted since the last
        # one (no commit record): the events still in the queues it rebuilt, i.e. all but
        # those a journalled loss mark took out before (it replays the journals first)
        aborted_at_open = len(self.unsaved_aborts - self.unsaved_loss_marks) if restored else 0
        if restored:
            self.replayed["aborted_events"] += aborted_at_open
            self.restored_counters()
        self.open()
        assert self.ch.subscriptions() == list(self.subscriptions)
        recovery = self.ch.status()["recovery"]
        assert recovery["problems"] == [], recovery
        assert recovery["checkpoint_source"] == "primary", recovery
        assert (recovery["lost_events"], recovery["aborted_events"],
                recovery["dropped_events"]) == (0, aborted_at_open, 0), recovery
        if aborted_at_open:
            event("the open aborted a put again")
        if how == "close" and self.cfg.checkpoint_on_close:
            # close() checkpointed: its in-flight takes were saved, its journal is empty
            assert recovery["in_flight_returned"] == in_flight, recovery
            assert (recovery["take_commits_replayed"], recovery["put_commits_replayed"]) \
                == (0, 0), recovery
        else:
            assert (recovery["take_commits_replayed"], recovery["put_commits_replayed"]) \
                == (self.journal_takes, self.journal_puts), recovery
        if len(self.subscriptions) > 1:
            event("reopened with subscriptions besides default")
        self.checkpointed()  # opening checkpoints the replayed state

    # -- put ----------------------------------------------------------------------------------
    @rule(events=puts, how=st.sampled_from(["commit", "commit", "with", "rollback", "error"]))
    def put(self, events: list[Spec], how: str) -> None:
        self.do_put(self.ch, events, how)

    def do_put(self, channel: Channel, events: list[Spec], how: str) -> None:
        self.steps_since_open += 1
        sent: list[Sent] = []
        if how == "error":
            with pytest.raises(Boom), channel.put() as tx:
                self.put_events(tx, events, sent)
                raise Boom
            self.counters["rollbacks"] += 1
            return
        untaken = self.untaken()
        tx = channel.put()
        try:
            if how == "with":
                with tx:
                    self.put_events(tx, events, sent)
            else:
                self.put_events(tx, events, sent)
                if how == "rollback":
                    tx.rollback()
                    self.counters["rollbacks"] += 1
                    with pytest.raises(TransactionStateError):
                        tx.commit()
                    return
                tx.commit()
        except (ChannelFullError, BatchTooLargeError) as exc:
            self.refused(exc, untaken, len(sent))
            return
        if not sent:
            assert tx.committed == []
            return
        assert untaken + len(sent) <= self.cfg.capacity, "the put should not have fitted"
        for counters in (self.counters, self.replayed):
            counters["put_attempts"] += len(sent)
            counters["put_successes"] += len(sent)
        self.record_put(events[:len(sent)], sent, tx.committed)

    def put_events(self, tx: PutTransaction, events: list[Spec], sent: list[Sent]) -> None:
        """Add the events, up to transaction_capacity: one more is refused."""
        capacity = self.cfg.transaction_capacity
        for spec in events:
            self.counter += 1
            body = b"%08d|" % self.counter + spec.padding
            if len(sent) == capacity:
                with pytest.raises(TransactionCapacityError):
                    tx.put(body, spec.key, spec.headers, spec.timestamp)
                break
            tx.put(body, key=spec.key, headers=spec.headers, timestamp=spec.timestamp)
            sent.append(Sent(body, spec.key, dict(spec.headers or {}), spec.timestamp))
        assert len(tx) == len(sent)

    def refused(self, exc: ChannelFullError | BatchTooLargeError, untaken: int,
                count: int) -> None:
        """A put of `count` events was refused before anything was written: the channel
        had no room for them (`untaken` before it), or a batch is larger than a segment."""
        if isinstance(exc, ChannelFullError):
            assert untaken + count > self.cfg.capacity
            event("put refused: channel full")
        else:
            assert exc.size > self.cfg.segment_bytes, exc
            event("put refused: batch too large")
        self.count_failed_put(count)

    def count_failed_put(self, count: int) -> None:
        self.counters["put_attempts"] += count
        self.counters["put_errors"] += 1
        self.counters["rollbacks"] += 1

    def record_put(self, specs: list[Spec], sent: list[Sent],
                   committed: list[tuple[int, int, int]]) -> None:
        """Check where a committed put went; queue its events there, for every
        subscription."""
        partitions = self.cfg.partitions
        counts = {p: last - first + 1 for p, first, last in committed}
        assert [p for p, _, _ in committed] == sorted(counts), f"one batch each: {committed}"
        keyed = Counter(kafka_partition(s.key, partitions) for s in specs if s.key is not None)
        keyless = sum(1 for s in specs if s.key is None)
        # keyed events go where Kafka puts them; what is left is every keyless event, in
        # one partition
        extra = {p: counts.get(p, 0) - keyed[p] for p in set(counts) | set(keyed)}
        extra = {p: n for p, n in extra.items() if n}
        sticky = next(iter(extra), None)
        assert extra == ({} if keyless == 0 else {sticky: keyless}), (committed, keyed, keyless)
        for p, first, last in committed:
            assert 0 <= p < partitions
            assert first == self.log_end[p], (p, first, self.log_end[p])
            mine = [e for s, e in zip(specs, sent, strict=True)
                    if (sticky if s.key is None else kafka_partition(s.key, partitions)) == p]
            assert len(mine) == last - first + 1
            for offset, sent_event in enumerate(mine, start=first):
                self.stored[p][offset] = sent_event
                for sub in self.subscriptions.values():
                    sub.queued[p].append(offset)
            self.log_end[p] = last + 1
        if len(committed) > 1:
            self.journal_puts += 1
            event("multi-partition put")

    @precondition(lambda self: self.cfg.partitions > 1)
    @rule(data=st.data(), through=st.sampled_from(["owner", "client"]))
    def put_aborted_part_way(self, data: st.DataObject, through: str) -> None:
        """A put across partitions whose append is refused on one of them (an I/O error)
        after the batches of those before it were written, in the owner or sent by a
        client: the put raises; its written batches stay in the log, whose end moves past
        them, and are aborted: out of every queue, never taken or read, before or after a
        reopen, and counted in aborted_events."""
        self.steps_since_open += 1
        partitions = self.cfg.partitions
        touched = data.draw(st.lists(st.integers(0, partitions - 1), min_size=2,
                                     max_size=partitions, unique=True), label="touched")
        # every partition touched among the first events, so that all of them fit
        targets = touched + data.draw(st.lists(
            st.sampled_from(touched), max_size=self.cfg.transaction_capacity - len(touched)),
            label="more events to")
        events = list(data.draw(st.tuples(*(specs_in(p, partitions) for p in targets)),
                                label="events"))
        refused = data.draw(st.sampled_from(sorted(touched)[1:]), label="refused partition")
        untaken = self.untaken()
        sent: list[Sent] = []
        channel = self.ch if through == "owner" else Channel.open(self.cfg, clock=self.clock)
        try:
            tx = channel.put()
            self.put_events(tx, events, sent)
            assert len(sent) == len(targets)  # within transaction_capacity
            try:
                with append_refused(refused):
                    tx.commit()
            except (ChannelFullError, BatchTooLargeError) as exc:  # before any append
                self.refused(exc, untaken, len(sent))
                return
            except StorageError as exc:
                assert "appending failed" in str(exc), exc
            else:
                raise AssertionError("the put committed, though an append was refused")
        finally:
            if channel is not self.ch:
                channel.close()
        self.record_abort(sent, targets, refused)
        event(f"a put aborted part way, through the {through}")

    def record_abort(self, sent: list[Sent], targets: list[int], refused: int) -> None:
        """A put failed: it counts as a failed put, and its batches appended before the
        refused partition's (in partition order) are aborted, past the log end."""
        self.count_failed_put(len(sent))
        for p in sorted({p for p in targets if p < refused}):
            mine = [e for e, target in zip(sent, targets, strict=True) if target == p]
            for offset, sent_event in enumerate(mine, start=self.log_end[p]):
                self.aborted[p][offset] = sent_event
                self.unsaved_aborts.add((p, offset))
            self.log_end[p] += len(mine)
            self.counters["aborted_events"] += len(mine)
            self.replayed["put_attempts"] += len(mine)  # in the log: recounted, not a success

    # -- take ---------------------------------------------------------------------------------
    @precondition(lambda self: len(self.takes) < MAX_OPEN_TAKES)
    @rule(data=st.data(), lease_ms=st.none() | st.integers(1, 2_000), n=st.integers(0, 18))
    def begin_take(self, data: st.DataObject, lease_ms: int | None, n: int) -> None:
        """Begin a take of a subscription, and take n events at once unless n is 0."""
        self.steps_since_open += 1
        subscription = self.pick_subscription(data)
        self.take_ids += 1
        deadline = None if lease_ms is None else self.now_ms() + lease_ms
        self.takes[self.take_ids] = ModelTake(self.ch.take(lease_ms, subscription), deadline,
                                              subscription)
        if n:
            self.take_more(self.take_ids, n)

    def pick_take(self, data: st.DataObject) -> tuple[int, ModelTake]:
        self.steps_since_open += 1
        take_id = data.draw(st.sampled_from(sorted(self.takes)), label="take")
        return take_id, self.takes[take_id]

    @precondition(lambda self: self.takes)
    @rule(data=st.data(), n=st.integers(1, 18))
    def take(self, data: st.DataObject, n: int) -> None:
        take_id, _ = self.pick_take(data)
        self.take_more(take_id, n)

    def take_more(self, take_id: int, n: int) -> None:
        take = self.takes[take_id]
        if take.taken + n > self.cfg.transaction_capacity:
            with pytest.raises(TransactionCapacityError):
                take.tx.take(n)
            return  # the transaction stays open
        if take.expired:
            with pytest.raises(TakeExpiredError):
                take.tx.take(n)
            del self.takes[take_id]
            return
        got = take.tx.take(n)
        self.count(take.subscription, "take_attempts", n)
        self.check_take(take.subscription, got, n)
        take.reserved += [(e.partition, e.offset) for e in got]
        take.taken += len(got)
        assert take.tx.taken == take.taken

    @precondition(lambda self: self.takes)
    @rule(data=st.data(), commit=st.booleans())
    def end_take(self, data: st.DataObject, commit: bool) -> None:
        take_id, take = self.pick_take(data)
        del self.takes[take_id]
        if not commit:
            take.tx.rollback()  # after a lapsed lease too: nothing is left to return
            if take.expired:  # the engine has forgotten it: the channel counts it alone
                self.counters["rollbacks"] += 1
            else:
                self.count(take.subscription, "rollbacks")
                self.requeue(take.subscription, take.reserved)
        elif take.expired:
            with pytest.raises(TakeExpiredError):
                take.tx.commit()
        else:
            take.tx.commit()
            self.subscriptions[take.subscription].consumed.update(take.reserved)
            self.committed_take(take.subscription, len(take.reserved))  # lost ones
            self.journal_takes += 1 if take.reserved else 0  # left it
        with pytest.raises(TransactionStateError):
            take.tx.take(1)

    @precondition(lambda self: self.dead)
    @rule(data=st.data(), use=st.sampled_from(["take", "commit", "rollback"]))
    def dead_take(self, data: st.DataObject, use: str) -> None:
        """A take begun before its owner closed or crashed is dead: it neither takes nor
        commits, and its rollback changes nothing (its events are queued already)."""
        tx = self.dead.pop(data.draw(st.integers(0, len(self.dead) - 1), label="dead take"))
        if use == "rollback":
            tx.rollback()
            return
        with pytest.raises(TakeExpiredError):
            if use == "take" and tx.taken < self.cfg.transaction_capacity:
                tx.take(1)
            else:
                tx.commit()

    @rule(data=st.data(), n=st.integers(1, 18), commit=st.booleans())
    def take_in_a_block(self, data: st.DataObject, n: int, commit: bool) -> None:
        """`with channel.take() as tx`: a clean exit commits, an exception rolls back."""
        self.steps_since_open += 1
        self.take_and_end(self.ch, self.pick_subscription(data),
                          min(n, self.cfg.transaction_capacity),
                          "commit" if commit else "error")

    def take_and_end(self, channel: Channel, subscription: str, n: int, how: str) -> None:
        """Take n events of a subscription and end the take: commit (a clean `with`), error
        (an exception in `with`: rollback) or disconnect (a client closes with the take
        open)."""
        got: list[Event] = []
        if how == "disconnect":
            got = channel.take(subscription=subscription).take(n)
            channel.close()
        else:
            with pytest.raises(Boom) if how == "error" else contextlib.nullcontext(), \
                    channel.take(subscription=subscription) as tx:
                got = tx.take(n)
                if how == "error":
                    raise Boom
        self.count(subscription, "take_attempts", n)
        self.check_take(subscription, got, n)
        if how == "commit":
            self.subscriptions[subscription].consumed.update(
                (e.partition, e.offset) for e in got)
            self.committed_take(subscription, len(got))
            self.journal_takes += 1 if got else 0
        else:
            self.count(subscription, "rollbacks")
            self.requeue(subscription, [(e.partition, e.offset) for e in got])

    @rule(data=st.data(), events=puts, n=st.integers(1, 18),
          how=st.sampled_from(["commit", "error", "disconnect"]))
    def through_a_client(self, data: st.DataObject, events: list[Spec], n: int,
                         how: str) -> None:
        """A second Channel on the same home is a client of the owner (over owner.sock):
        put, read a partition, then take from a subscription and end the take, then close
        it."""
        client = Channel.open(self.cfg, clock=self.clock)
        try:
            assert client.role == "client"
            self.do_put(client, events, "with")
            self.check_reads(client, data)
            self.take_and_end(client, self.pick_subscription(data),
                              min(n, self.cfg.transaction_capacity), how)
        finally:
            client.close()
        # the owner rolls a closed connection's takes back on its own thread
        deadline = time.monotonic() + 10
        while self.ch.status()["open_takes"] != len(self.live_takes()):
            assert time.monotonic() < deadline, "a closed client's take never rolled back"
            time.sleep(0.001)

    # -- subscriptions ------------------------------------------------------------------------
    @rule(data=st.data(), name=st.sampled_from(SUBSCRIPTIONS))
    def add_subscription(self, data: st.DataObject, name: str) -> None:
        """Add a subscription at a position; a name the channel has already is refused."""
        self.steps_since_open += 1
        start, heads = self.draw_position(data, adding=True)
        if name in self.subscriptions:
            with pytest.raises(SubscriptionExistsError):
                self.ch.add_subscription(name, start)
            return
        self.add(name, start, heads)

    def add(self, name: str, start: Position, heads: list[int | None]) -> None:
        self.ch.add_subscription(name, start)
        sub = ModelSubscription([[] for _ in range(self.cfg.partitions)])
        self.place(sub, heads)
        self.subscriptions[name] = sub
        self.changed()
        event(f"subscription added at {kind_of(start)}")

    @rule(name=st.sampled_from((DEFAULT, *SUBSCRIPTIONS)))
    def remove_subscription(self, name: str) -> None:
        """Remove a subscription: refused for default, for one the channel does not have,
        and for one with takes open."""
        self.steps_since_open += 1
        if name == DEFAULT:
            with pytest.raises(ValueError, match="'default' cannot be removed"):
                self.ch.remove_subscription(name)
        elif name not in self.subscriptions:
            with pytest.raises(UnknownSubscriptionError):
                self.ch.remove_subscription(name)
        elif self.live_takes(name):
            with pytest.raises(SubscriptionBusyError, match="of its takes are open"):
                self.ch.remove_subscription(name)
            event("remove refused: takes open")
        else:
            self.ch.remove_subscription(name)
            del self.subscriptions[name]
            self.changed()
            event("subscription removed")

    @rule(data=st.data())
    def reset_subscription(self, data: st.DataObject) -> None:
        """Move a subscription to a position (Kafka's --reset-offsets): its events from there
        on are queued again, those before it are not its to take. Refused while it has
        takes open, even ones that reserved nothing."""
        self.steps_since_open += 1
        name = self.pick_subscription(data)
        to, heads = self.draw_position(data, adding=False)
        if self.live_takes(name):
            with pytest.raises(SubscriptionBusyError, match="of its takes are open"):
                self.ch.reset_subscription(name, to)
            event("reset refused: takes open")
            return
        self.ch.reset_subscription(name, to)
        self.place(self.subscriptions[name], heads)
        self.changed()
        event(f"subscription reset to {kind_of(to)}")

    def changed(self) -> None:
        """A subscription change returned: it wrote a checkpoint, so it is durable."""
        self.checkpointed()
        assert self.ch.subscriptions() == list(self.subscriptions)

    def draw_position(self, data: st.DataObject, adding: bool
                      ) -> tuple[Position, list[int | None]]:
        """A position as a caller gives it, and the head it means on each partition (None:
        a reset leaves that partition as it is; an add starts it at the log start)."""
        self.learn_log_starts(self.ch.status())
        kind = data.draw(st.sampled_from(["earliest", "latest", "offsets", "timestamp"]),
                         label="position")
        partitions = range(self.cfg.partitions)
        if kind == "earliest":
            return kind, list(self.log_start)
        if kind == "latest":  # the last stable offset: every put here has resolved
            return kind, list(self.log_end)
        if kind == "timestamp":
            stamp = data.draw(self.stamps(), label="timestamp_ms")
            return {"timestamp_ms": stamp}, [self.first_at_or_after(p, stamp)
                                             for p in partitions]
        named = data.draw(st.lists(st.sampled_from(partitions), min_size=1, unique=True),
                          label="partitions")
        heads: list[int | None] = [*self.log_start] if adding else [None] * len(partitions)
        where: dict[Any, int] = {}
        for p in named:
            offset = data.draw(st.integers(self.log_start[p], self.log_end[p]), label="offset")
            heads[p] = offset
            where[p if offset % 2 else str(p)] = offset  # JSON names partitions "0", "1"...
        return where, heads

    def stamps(self) -> st.SearchStrategy[int]:
        """A time to place a subscription at: one some event was put with, or just after
        it, or any in their range. An event put without a timestamp is stamped with the
        wall clock when it is encoded, later than all of these."""
        assert time.time() * 1000 > START_MS + STAMP_SPREAD_MS + 1
        spread = st.integers(START_MS - STAMP_SPREAD_MS, START_MS + STAMP_SPREAD_MS + 1)
        given = sorted({sent.timestamp for part in (*self.stored, *self.aborted)
                        for sent in part.values() if sent.timestamp is not None})
        if not given:
            return spread
        return spread | st.builds(int.__add__, st.sampled_from(given), st.integers(0, 1))

    def first_at_or_after(self, p: int, stamp: int) -> int:
        """Kafka's offsetsForTimes, on the model: the first offset still in the log whose
        timestamp is >= stamp, else the log end. It looks at the log, so at an aborted put's
        events too (a queue placed there skips them)."""
        for offset in range(self.log_start[p], self.log_end[p]):
            put_at = (self.stored[p].get(offset) or self.aborted[p][offset]).timestamp
            if put_at is None or put_at >= stamp:
                return offset
        return self.log_end[p]

    def place(self, sub: ModelSubscription, heads: list[int | None]) -> None:
        """Place a subscription's queue of each partition with a head: every event from
        the head on is queued but those of a range recorded lost (the log cannot deliver
        them, to any subscription) and those of aborted puts; the rest is not its to take."""
        for p, head in enumerate(heads):
            if head is None:
                continue
            sub.forget(p)
            sub.queued[p] = [o for o in range(head, self.log_end[p])
                             if not self.recorded_lost(p, o) and o not in self.aborted[p]]
            queued = set(sub.queued[p])
            sub.skipped |= {(p, o) for o in range(self.log_end[p])
                            if o not in queued and o not in self.aborted[p]}

    def recorded_lost(self, p: int, offset: int) -> bool:
        return any(q == p and start <= offset < end for q, start, end in self.loss_records)

    # -- time, checkpoints, flushes, snapshots ------------------------------------------------
    @rule(ms=st.integers(0, 3_000))
    def tick(self, ms: int) -> None:
        """Time passes; takes whose lease ran out roll back (the status call after this step
        is the first to notice, in the engine)."""
        self.steps_since_open += 1
        self.clock_ms += ms
        now = self.now_ms()
        for take in self.live_takes():
            if take.deadline_ms is not None and take.deadline_ms <= now:
                take.expired = True
                self.requeue(take.subscription, take.reserved)
                self.count(take.subscription, "takes_expired")
                self.count(take.subscription, "rollbacks")
                event("a lease expired")

    @rule(what=st.sampled_from(["checkpoint", "checkpoint_if_due", "flush", "retention"]))
    def maintain(self, what: str) -> None:
        """What the scheduler runs: checkpoints, flushes, retention (which deletes taken
        segments only: no retention_ms / retention_bytes opts in to dropping events)."""
        self.steps_since_open += 1
        if what == "flush":
            self.ch.flush()
            assert self.ch.status()["unflushed_events"] == 0
            return
        if what == "retention":
            result = self.ch.apply_retention()
            assert result["events_dropped"] == 0, result
            return
        due = self.now_ms() - self.last_checkpoint_ms >= self.cfg.checkpoint_interval_ms
        if what == "checkpoint_if_due":
            result = self.ch.checkpoint_if_due()
            assert (result is not None) == due
        else:
            result = self.ch.checkpoint()
        if result is not None:
            assert result.backup == ("written" if self.cfg.use_dual_checkpoints else "off")
            if result.segments_deleted:
                event("a checkpoint deleted taken segments")
            self.checkpointed()

    @rule(data=st.data())
    def read_only_snapshot(self, data: st.DataObject) -> None:
        """A read-only open replays the files as they are (takes in flight are queued, puts
        without a commit record aborted), with every subscription; it reads a partition."""
        with Channel.open(self.cfg, read_only=True) as view:
            status = view.status()
            assert list(status["subscriptions"]) == list(self.subscriptions)
            for p, part in enumerate(status["partitions"]):
                assert part["log_end_offset"] == self.log_end[p], (p, part)
            for name, sub in self.subscriptions.items():
                in_flight = Counter(p for p, _ in self.in_flight(name))
                seen = status["subscriptions"][name]["partitions"]
                assert [part["events_queued"] for part in seen] == \
                    [len(q) + in_flight[p] for p, q in enumerate(sub.queued)], (name, seen)
            self.check_reads(view, data)

    # -- reads --------------------------------------------------------------------------------
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        """Read a partition in the owner (an inspection: no take moves)."""
        self.check_reads(self.ch, data)

    def check_reads(self, reader: Channel, data: st.DataObject) -> None:
        """Read a partition from a drawn offset (the log start, one of an aborted put, any
        up to the log end), a drawn number of events at a time, each read from the last
        offset + 1 until one is empty: the committed events from there on still in the log,
        in order, and never an aborted put's (Kafka's read_committed). A lost range takes
        nothing out: lose_a_range reports offsets lost without harming the log's bytes, and
        a read serves what the log holds. Below the log start is out of range."""
        p = data.draw(st.integers(0, self.cfg.partitions - 1), label="read partition")
        start, end = self.log_start[p], self.log_end[p]
        aborted = sorted(o for o in self.aborted[p] if o >= start)
        offset = data.draw(st.just(start) | st.integers(start, end)
                           | (st.sampled_from(aborted) if aborted else st.nothing()),
                           label="read from")
        limit = data.draw(st.integers(1, 20), label="read limit")
        wanted = [(o, self.stored[p][o].body) for o in range(max(offset, start), end)
                  if o in self.stored[p]]
        got: list[tuple[int, bytes]] = []
        while events := reader.read(p, offset, limit):
            assert len(events) <= limit and events[0].offset >= offset, (offset, limit, events)
            for e in events:
                self.check_event(e)
            got += [(e.offset, e.body) for e in events]
            offset = events[-1].offset + 1
        assert got == wanted, (p, limit, got, wanted)
        if start:
            with pytest.raises(OffsetOutOfRangeError):
                reader.read(p, start - 1, limit)
        if aborted:
            event("read a partition holding an aborted put")

    # -- losses -------------------------------------------------------------------------------
    @rule(data=st.data())
    def lose_a_range(self, data: st.DataObject) -> None:
        """A read met damage: the log reports [start, end) of a partition lost. What each
        subscription had not taken of it leaves its queue and open takes (a take never
        commits them); the channel counts each event once, each subscription what it lost."""
        self.steps_since_open += 1
        p = data.draw(st.integers(0, self.cfg.partitions - 1), label="partition")
        if self.log_end[p] == 0:
            return
        start = data.draw(st.integers(0, self.log_end[p] - 1), label="start")
        end = data.draw(st.integers(start + 1, self.log_end[p]), label="end")
        owner = self.ch.owner
        assert owner is not None
        owner.logs[p].state.new_losses.append(LostRange(start, end, "test", cause="test: lost"))
        self.ch.status()  # counts it now (so does the next take or read)
        span = {(p, o) for o in range(start, end)}
        self.unsaved_loss_marks |= span  # the journal record marks the whole range
        places: set[Place] = set()
        for name, sub in self.subscriptions.items():
            untaken = {(p, o) for o in sub.queued[p]} | set(self.in_flight(name))
            its = span & untaken
            sub.queued[p] = [o for o in sub.queued[p] if (p, o) not in its]
            sub.lost |= its
            sub.counters["lost_events"] += len(its)
            places |= its
        for take in self.live_takes():
            take.reserved = [place for place in take.reserved if place not in span]
        self.lost |= places
        if (p, start, end) not in self.loss_records:
            self.loss_records[(p, start, end)] = False
            self.counters["lost_events"] += len(places)
        self.journal_takes += 1  # the marking is journalled (take id 0)
        event("a range was lost")

    @rule()
    def acknowledge(self) -> None:
        self.steps_since_open += 1
        fresh = [key for key, acked in self.loss_records.items() if not acked]
        assert self.ch.acknowledge_losses() == len(fresh)
        self.loss_records = dict.fromkeys(self.loss_records, True)

    # -- invariants ---------------------------------------------------------------------------
    def queue_status(self, subscription: str, p: int) -> dict[str, int]:
        """A subscription's queue on partition p, as status() shows it."""
        queued = self.subscriptions[subscription].queued[p]
        in_flight = [o for q, o in self.in_flight(subscription) if q == p]
        return {"partition": p,
                "taken_through": min(queued + in_flight, default=self.log_end[p]),
                "events_queued": len(queued), "events_untaken": len(queued) + len(in_flight),
                "events_in_flight": len(in_flight)}

    def learn_log_starts(self, status: dict[str, Any]) -> None:
        """The log start of each partition, as the engine reports it: it never moves back,
        and never past an event some subscription has not taken (a checkpoint deletes a
        segment once every subscription took it)."""
        for p, part in enumerate(status["partitions"]):
            start = part["log_start_offset"]
            heads = [self.queue_status(name, p)["taken_through"] for name in self.subscriptions]
            assert self.log_start[p] <= start <= min(heads), (p, start, self.log_start[p], heads)
            self.log_start[p] = start

    @invariant()
    def status_matches(self) -> None:
        status = self.ch.status()
        assert list(status["subscriptions"]) == list(self.subscriptions)
        for name in self.subscriptions:
            self.check_subscription(name, status["subscriptions"][name])
        # the channel's queue figures are its slowest subscription's (the first one added,
        # of those as slow)
        slowest = max(self.subscriptions, key=self.untaken_of)
        assert status["slowest_subscription"] == slowest, (status["subscriptions"], slowest)
        queued, in_flight = self.queued_total(slowest), len(self.in_flight(slowest))
        assert (status["events_queued"], status["events_in_flight"], status["events_untaken"]) \
            == (queued, in_flight, queued + in_flight)
        assert len(status["partitions"]) == self.cfg.partitions
        for p, part in enumerate(status["partitions"]):
            assert {"partition": p, **{k: part[k] for k in QUEUE_FIGURES}} == \
                self.queue_status(slowest, p), (p, part)
            assert part["log_end_offset"] == self.log_end[p], (p, part)
        self.learn_log_starts(status)
        assert status["open_takes"] == len(self.live_takes())
        self.check_losses_and_counters(status)

    def check_subscription(self, name: str, seen: dict[str, Any]) -> None:
        queued, in_flight = self.queued_total(name), len(self.in_flight(name))
        assert (seen["events_queued"], seen["events_in_flight"], seen["events_untaken"]) \
            == (queued, in_flight, queued + in_flight), (name, seen)
        assert seen["open_takes"] == len(self.live_takes(name)), (name, seen)
        assert seen["partitions"] == [self.queue_status(name, p)
                                      for p in range(self.cfg.partitions)], (name, seen)
        counters = self.subscriptions[name].counters
        assert {c: seen["counters"][c] for c in SUBSCRIPTION_COUNTERS} == \
            {c: counters[c] for c in SUBSCRIPTION_COUNTERS}, (name, seen)

    def check_losses_and_counters(self, status: dict[str, Any]) -> None:
        losses = status["losses"]
        assert losses["events_lost"] == len(self.lost), losses
        assert [part["lost_events"] for part in status["partitions"]] == \
            [sum(1 for q, _ in self.lost if q == p) for p in range(self.cfg.partitions)]
        unacknowledged = sum(1 for acked in self.loss_records.values() if not acked)
        assert losses["unacknowledged"] == unacknowledged, losses
        assert (status["health"] == "degraded") if unacknowledged else \
            (status["health"] != "degraded" or "loss" not in status["health_reason"])
        counters = {name: status["counters"][name] for name in MODEL_COUNTERS}
        assert counters == {name: self.counters[name] for name in MODEL_COUNTERS}

    @invariant()
    def every_event_is_in_one_place(self) -> None:
        """For each subscription, every offset of the log is in exactly one place; an event
        lost, or of an aborted put, is in no subscription's queue or take."""
        aborted = [(p, o) for p, part in enumerate(self.aborted) for o in part]
        for name, sub in self.subscriptions.items():
            queued = [(p, o) for p, q in enumerate(sub.queued) for o in q]
            in_flight = self.in_flight(name)
            everywhere = queued + in_flight + [*sub.consumed, *sub.lost, *sub.skipped, *aborted]
            assert len(everywhere) == len(set(everywhere)), f"{name}: an event in two places"
            assert len(everywhere) == sum(self.log_end), f"{name}: an event is nowhere"
            assert self.lost.isdisjoint(queued + in_flight), f"{name}: a lost event is back"

    def teardown(self) -> None:
        try:
            if self.channel is not None:
                self.channel.close()  # a crashed channel is closed already: nothing to do
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.mark.parametrize("how", ["close", "crash"])
def test_a_take_that_outlived_its_owner_is_dead(tmp_path: Path, how: str) -> None:
    """The example behind the machine's dead_take rule: a take begun before its owner closed
    or crashed neither takes nor commits (TakeExpiredError), not even from what the dead
    owner still has in memory, and rolling it back changes nothing."""
    config = make_config(tmp_path, partitions=2, segment_bytes=1024)
    channel = Channel.open(config)
    try:
        with channel.put() as tx:
            for i in range(6):
                tx.put(b"event %d" % i)
        takes = [channel.take() for _ in range(4)]
        for tx in takes[:3]:
            assert len(tx.take(1)) == 1
        if how == "crash":
            crash(channel)
        else:
            channel.close()
        channel = Channel.open(config)
        assert channel.status()["events_queued"] == 6
        with pytest.raises(TakeExpiredError):
            takes[0].take(1)
        with pytest.raises(TakeExpiredError):
            takes[1].commit()
        takes[2].rollback()
        with pytest.raises(TakeExpiredError):
            takes[3].take(1)  # one that had taken nothing
        assert channel.status()["events_queued"] == 6
    finally:
        channel.close()
    with Channel.open(config) as channel, channel.take() as tx:
        assert [e.body for e in tx.take(10)] == [b"event %d" % i for i in range(6)]


DEFAULT_SETTINGS = settings(
    max_examples=25, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOW_SETTINGS = settings(
    DEFAULT_SETTINGS, max_examples=300, stateful_step_count=60,
)


def test_it_behaves_like_a_queue() -> None:
    run_state_machine_as_test(ChannelMachine, settings=DEFAULT_SETTINGS)


@pytest.mark.slow
def test_it_behaves_like_a_queue_over_many_examples() -> None:
    run_state_machine_as_test(ChannelMachine, settings=SLOW_SETTINGS)

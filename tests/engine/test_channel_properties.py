"""Channel against a queue model: a hypothesis state machine.

The model is, per partition, the committed events by offset and the sorted offsets still
queued, plus the open take transactions with what each reserved, and the set of events
taken for good. A take serves each partition's lowest queued offsets: events a take
returned (rollback, lapsed lease, dead owner or client) come back ahead of everything never
taken, in offset order.

Each step does one thing to the real channel: put (commit, rollback, or a `with` block that
exits cleanly or with an error), begin a take (with or without a lease), take more, commit
or roll back a take, take in a `with` block, put and take through a second Channel that
is a client of the owner (its open take rolls back when it disconnects), let time pass
(leases lapse), checkpoint, flush, apply retention, look at a read-only snapshot, lose a
range of offsets (as a read meeting damage reports it: the channel takes its untaken
events out of the queue and out of open takes, counts and records them) and acknowledge
the losses, crash the
owner (kill -9 between two steps) or close it and reopen (sometimes with one more partition
or another codec), use a take left over from before a reopen (it must be dead). After every
step the channel's status is compared with the model: counts per partition, the head of
each queue, log end offsets, open takes, the counters, the losses and health; a reopen
also checks what recovery reports (nothing lost, aborted or dropped at open; the journal
commits it replayed).

Every event body is unique (a counter), so an event taken twice, lost, or coming back after
its take committed shows up as a mismatch. Keyed events must land where Kafka's default
partitioner puts them (murmur2 from kafka-python, an implementation independent of the
engine's); keyless events of one put must land together in one partition.

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
import shutil
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

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
    PutTransaction,
    TakeExpiredError,
    TakeTransaction,
    TransactionCapacityError,
    TransactionStateError,
)
from channel_engine.log.recovery import LostRange

with warnings.catch_warnings():  # kafka-python's protocol schemas use deprecated importlib APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2

START_MS = 1_700_000_000_000
CODECS = ["none", "gzip", "lz4", "zstd"]
MAX_OPEN_TAKES = 4
STEPS_BEFORE_REOPEN = 3
MODEL_COUNTERS = ("put_attempts", "put_successes", "put_errors", "take_attempts",
                  "take_successes", "rollbacks", "takes_expired", "aborted_events",
                  "dropped_events", "lost_events")

keys = st.none() | st.sampled_from([b"k%d" % i for i in range(8)]) | st.binary(max_size=6)
headers = st.none() | st.dictionaries(st.sampled_from(["a", "b", "trace"]),
                                      st.binary(max_size=6), max_size=2)
timestamps = st.none() | st.integers(START_MS - 10_000_000, START_MS + 10_000_000)


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
    """An open take transaction and what it reserved, (partition, offset) in take order."""

    tx: TakeTransaction
    deadline_ms: int | None
    reserved: list[tuple[int, int]] = field(default_factory=list)
    taken: int = 0
    expired: bool = False  # its lease ran out: its events are queued again


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
        self.queued: list[list[int]] = []  # per partition: offsets a take may get, sorted
        self.log_end: list[int] = []
        self.consumed: set[tuple[int, int]] = set()  # taken and committed
        self.lost: set[tuple[int, int]] = set()  # untaken when their range was lost
        self.loss_records: dict[tuple[int, int, int], bool] = {}  # key -> acknowledged
        self.takes: dict[int, ModelTake] = {}
        self.take_ids = 0
        self.counters: Counter[str] = Counter()
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
        while len(self.queued) < self.cfg.partitions:
            self.stored.append({})
            self.queued.append([])
            self.log_end.append(0)
        self.counters = Counter()  # a new owner counts from zero
        self.steps_since_open = 0

    def checkpointed(self) -> None:
        self.journal_takes = self.journal_puts = 0
        self.last_checkpoint_ms = self.now_ms()

    def live_takes(self) -> list[ModelTake]:
        return [t for t in self.takes.values() if not t.expired]

    def in_flight(self) -> list[tuple[int, int]]:
        return [place for t in self.live_takes() for place in t.reserved]

    def queued_total(self) -> int:
        return sum(len(q) for q in self.queued)

    def untaken(self) -> int:
        return self.queued_total() + len(self.in_flight())

    def requeue(self, places: list[tuple[int, int]]) -> None:
        """Events of a take that ended without commit: queued again, in offset order."""
        for p, offset in places:
            assert offset not in self.queued[p]
            bisect.insort(self.queued[p], offset)

    def check_event(self, got: Event) -> None:
        sent = self.stored[got.partition][got.offset]
        assert (got.body, got.key, got.headers) == (sent.body, sent.key, sent.headers), got
        if sent.timestamp is not None:
            assert got.timestamp == sent.timestamp, got

    def check_take(self, got: list[Event], n: int) -> None:
        """A take of up to n events got the oldest queued ones of each partition; they leave
        the queue (the caller records them as reserved)."""
        assert len(got) == min(n, self.queued_total()), (n, self.queued_total(), got)
        in_flight = set(self.in_flight())
        by_partition: dict[int, list[int]] = {}
        for e in got:
            place = (e.partition, e.offset)
            assert place not in self.consumed, f"taken again after its take committed: {e}"
            assert place not in in_flight, f"in another open take: {e}"
            self.check_event(e)
            by_partition.setdefault(e.partition, []).append(e.offset)
        for p, offsets in by_partition.items():
            head = self.queued[p][:len(offsets)]
            assert offsets == head, f"partition {p}: took {offsets}, the head is {head}"
            del self.queued[p][:len(offsets)]

    # -- opening and reopening ----------------------------------------------------------------
    @initialize(chosen=channel_settings(), prefill=st.lists(puts, max_size=6))
    def create(self, chosen: dict[str, object], prefill: list[list[Spec]]) -> None:
        """A new channel, with a few puts committed so that takes find segments to empty."""
        if chosen["use_dual_checkpoints"]:
            chosen = {**chosen, "backup_checkpoint_dir": str(self.root / "backup")}
        self.config = make_config(self.root, **chosen)
        self.open()
        self.checkpointed()
        for events in prefill:
            self.do_put(self.ch, events, "commit")

    @precondition(lambda self: self.steps_since_open >= STEPS_BEFORE_REOPEN)
    @rule(how=st.sampled_from(["crash", "close"]), grow=st.booleans(),
          compression=st.sampled_from(CODECS))
    def reopen(self, how: str, grow: bool, compression: str) -> None:
        """The owner dies or closes; the channel is opened again, sometimes with one more
        partition (keys move) or another codec. Open takes are dead: their events return."""
        in_flight = len(self.in_flight())
        if how == "crash":
            crash(self.ch)
        else:
            self.ch.close()
        for take in self.live_takes():
            self.requeue(take.reserved)
        self.dead.extend(take.tx for take in self.takes.values())
        self.takes.clear()
        changes: dict[str, object] = {"compression": compression}
        if grow and self.cfg.partitions < 3:
            changes["partitions"] = self.cfg.partitions + 1
            event("reopened with one more partition")
        self.config = self.cfg.replace(**changes)
        self.open()
        recovery = self.ch.status()["recovery"]
        assert recovery["problems"] == [], recovery
        assert recovery["checkpoint_source"] == "primary", recovery
        assert (recovery["lost_events"], recovery["aborted_events"],
                recovery["dropped_events"]) == (0, 0, 0), recovery
        if how == "close" and self.cfg.checkpoint_on_close:
            # close() checkpointed: its in-flight takes were saved, its journal is empty
            assert recovery["in_flight_returned"] == in_flight, recovery
            assert (recovery["take_commits_replayed"], recovery["put_commits_replayed"]) \
                == (0, 0), recovery
        else:
            assert (recovery["take_commits_replayed"], recovery["put_commits_replayed"]) \
                == (self.journal_takes, self.journal_puts), recovery
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
        except ChannelFullError:
            assert untaken + len(sent) > self.cfg.capacity
            event("put refused: channel full")
            self.count_failed_put(len(sent))
            return
        except BatchTooLargeError as exc:
            assert exc.size > self.cfg.segment_bytes, exc
            event("put refused: batch too large")
            self.count_failed_put(len(sent))
            return
        if not sent:
            assert tx.committed == []
            return
        assert untaken + len(sent) <= self.cfg.capacity, "the put should not have fitted"
        self.counters["put_attempts"] += len(sent)
        self.counters["put_successes"] += len(sent)
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

    def count_failed_put(self, count: int) -> None:
        self.counters["put_attempts"] += count
        self.counters["put_errors"] += 1
        self.counters["rollbacks"] += 1

    def record_put(self, specs: list[Spec], sent: list[Sent],
                   committed: list[tuple[int, int, int]]) -> None:
        """Check where a committed put went; queue its events there."""
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
                self.queued[p].append(offset)
            self.log_end[p] = last + 1
        if len(committed) > 1:
            self.journal_puts += 1
            event("multi-partition put")

    # -- take ---------------------------------------------------------------------------------
    @precondition(lambda self: len(self.takes) < MAX_OPEN_TAKES)
    @rule(lease_ms=st.none() | st.integers(1, 2_000), n=st.integers(0, 18))
    def begin_take(self, lease_ms: int | None, n: int) -> None:
        """Begin a take, and take n events at once unless n is 0."""
        self.steps_since_open += 1
        self.take_ids += 1
        deadline = None if lease_ms is None else self.now_ms() + lease_ms
        self.takes[self.take_ids] = ModelTake(self.ch.take(lease_ms), deadline)
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
        self.counters["take_attempts"] += n
        self.check_take(got, n)
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
            self.counters["rollbacks"] += 1
            if not take.expired:
                self.requeue(take.reserved)
        elif take.expired:
            with pytest.raises(TakeExpiredError):
                take.tx.commit()
        else:
            take.tx.commit()
            self.consumed.update(take.reserved)
            self.counters["take_successes"] += len(take.reserved)  # lost ones left it
            self.journal_takes += 1 if take.reserved else 0
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

    @rule(n=st.integers(1, 18), commit=st.booleans())
    def take_in_a_block(self, n: int, commit: bool) -> None:
        """`with channel.take() as tx`: a clean exit commits, an exception rolls back."""
        self.steps_since_open += 1
        self.take_and_end(self.ch, min(n, self.cfg.transaction_capacity),
                          "commit" if commit else "error")

    def take_and_end(self, channel: Channel, n: int, how: str) -> None:
        """Take n events and end the take: commit (a clean `with`), error (an exception in
        `with`: rollback) or disconnect (a client closes with the take open)."""
        got: list[Event] = []
        if how == "disconnect":
            got = channel.take().take(n)
            channel.close()
        else:
            with pytest.raises(Boom) if how == "error" else contextlib.nullcontext(), \
                    channel.take() as tx:
                got = tx.take(n)
                if how == "error":
                    raise Boom
        self.counters["take_attempts"] += n
        self.check_take(got, n)
        if how == "commit":
            self.consumed.update((e.partition, e.offset) for e in got)
            self.counters["take_successes"] += len(got)
            self.journal_takes += 1 if got else 0
        else:
            self.counters["rollbacks"] += 1
            self.requeue([(e.partition, e.offset) for e in got])

    @rule(events=puts, n=st.integers(1, 18),
          how=st.sampled_from(["commit", "error", "disconnect"]))
    def through_a_client(self, events: list[Spec], n: int, how: str) -> None:
        """A second Channel on the same home is a client of the owner (over owner.sock):
        put, then take and end the take, then close it."""
        client = Channel.open(self.cfg, clock=self.clock)
        try:
            assert client.role == "client"
            self.do_put(client, events, "with")
            self.take_and_end(client, min(n, self.cfg.transaction_capacity), how)
        finally:
            client.close()
        # the owner rolls a closed connection's takes back on its own thread
        deadline = time.monotonic() + 10
        while self.ch.status()["open_takes"] != len(self.live_takes()):
            assert time.monotonic() < deadline, "a closed client's take never rolled back"
            time.sleep(0.001)

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
                self.requeue(take.reserved)
                self.counters["takes_expired"] += 1
                self.counters["rollbacks"] += 1
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

    @rule(pick=st.integers(0, 2))
    def read_only_snapshot(self, pick: int) -> None:
        """A read-only open replays the files as they are (takes in flight are queued); it
        reads the head of one partition."""
        with Channel.open(self.cfg, read_only=True) as view:
            status = view.status()
            in_flight = Counter(p for p, _ in self.in_flight())
            for p, part in enumerate(status["partitions"]):
                assert part["log_end_offset"] == self.log_end[p], (p, part)
                assert part["events_queued"] == len(self.queued[p]) + in_flight[p], (p, part)
            p = pick % self.cfg.partitions
            head = min(self.queued[p] + [o for q, o in self.in_flight() if q == p],
                       default=None)
            if head is not None:
                got = view.read(p, head, 3)
                assert [e.offset for e in got] == list(range(head, head + len(got)))
                assert got
                for e in got:
                    self.check_event(e)

    # -- losses -------------------------------------------------------------------------------
    @rule(data=st.data())
    def lose_a_range(self, data: st.DataObject) -> None:
        """A read met damage: the log reports [start, end) of a partition lost. Its untaken
        events leave the queue and open takes (a take never commits them), counted once."""
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
        places = {(p, o) for o in range(start, end)} - self.consumed - self.lost
        self.lost |= places
        self.queued[p] = [o for o in self.queued[p] if (p, o) not in places]
        for take in self.live_takes():
            take.reserved = [place for place in take.reserved if place not in places]
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
    @invariant()
    def status_matches(self) -> None:
        status = self.ch.status()
        in_flight = Counter(p for p, _ in self.in_flight())
        assert len(status["partitions"]) == self.cfg.partitions
        for p, part in enumerate(status["partitions"]):
            queued = len(self.queued[p])
            assert (part["events_queued"], part["events_in_flight"], part["events_untaken"]) \
                == (queued, in_flight[p], queued + in_flight[p]), (p, part)
            assert part["log_end_offset"] == self.log_end[p], (p, part)
            untaken = self.queued[p] + [o for q, o in self.in_flight() if q == p]
            head = min(untaken, default=self.log_end[p])
            assert part["taken_through"] == head, (p, part, head)
            assert part["log_start_offset"] <= head, (p, part, head)
        queued = self.queued_total()
        in_flight_total = sum(in_flight.values())
        assert (status["events_queued"], status["events_in_flight"], status["events_untaken"]) \
            == (queued, in_flight_total, queued + in_flight_total)
        assert status["open_takes"] == len(self.live_takes())
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
        queued = [(p, o) for p, q in enumerate(self.queued) for o in q]
        everywhere = queued + self.in_flight() + sorted(self.consumed) + sorted(self.lost)
        assert len(everywhere) == len(set(everywhere)), "an event is in two places"
        assert len(everywhere) == sum(self.log_end), "an event is nowhere"

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

"""Subscriptions across processes and kills (issue 16): 4 producer processes put into one
channel with 3 subscriptions, each subscription drained by 2 consumer processes
(channel_worker.py produce and consume --subscription), while the parent kills whichever
process owns the channel with SIGKILL at random points, during the puts and during the
drain; the owner also changes when a producer finishes and closes. A killed process is
started again where it left off: a producer from its first unacknowledged batch (the
batch in flight at the kill is put again: it may be in the channel twice, whole), a
consumer anew on its subscription. Every consumer writes each step of each take to a
history file (channel_worker.py's consume doc) with times from time.monotonic(), shared
by every process of the machine.

Checked, for each subscription:
  * exactly once: every acknowledged put is committed by exactly one take of the
    subscription (a batch put again after an unknown outcome: each copy in the channel
    once, the batch whole); a take whose commit outcome is unknown (OwnerLostError, or its
    consumer killed during the commit) committed whole or not at all;
  * committed takes stay taken: no take begun after a commit was acknowledged (or, for an
    unknown outcome that did commit, after the owner was dead) receives its events;
  * order: within a take, each partition's events in offset order; per producer and key,
    the subscription's committed events in put order;
and across them: an event is stored once (at the same partition and offset whichever
subscription receives it), every subscription commits the same events, and the channel
reopened afterwards holds nothing untaken in any subscription, with nothing lost.

It fails when, say, a take of one subscription reserves from another's queue, or a take's
commit is journalled (and so replayed after a kill) under another subscription: the first
shows as events missing from one subscription and committed twice in another, the second
as committed takes delivered again after the next owner kill.

The default run has one trial; `-m slow` runs many more, each derived from its number.
"""
from __future__ import annotations

import json
import math
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from channel_helpers import make_config
from test_channel_processes import WAIT_S, Worker, spawn, worker, workers

from channel_engine import Channel
from channel_engine.queue.home_lock import LOCK_FILE

SUBSCRIPTIONS = ("default", "archive", "audit")
PRODUCERS = 4
CONSUMERS_PER_SUBSCRIPTION = 2


@dataclass(frozen=True)
class Trial:
    """One run: its events, and how many times the owner is killed."""

    seed: int
    events: int = 6_000  # per producer
    batch: int = 250
    kills: int = 3  # owner kills while the producers put, at random fractions of the puts
    drain_kills: int = 1  # owner kills once every producer finished
    segment_bytes: int = 64 * 1024  # small: segments roll, and go once every subscription took them
    checkpoint_every: int = 10  # one consumer per subscription checkpoints every K commits
    timeout: float = 120.0

    @property
    def batches(self) -> int:
        return math.ceil(self.events / self.batch)


def random_trial(number: int) -> Trial:
    rng = random.Random(50_000 + number)
    return Trial(seed=50_000 + number, events=rng.randint(3_000, 25_000),
                 batch=rng.choice([50, 250, 500, 1000]), kills=rng.randint(2, 8),
                 drain_kills=rng.randint(0, 3),
                 segment_bytes=rng.choice([16 * 1024, 64 * 1024, 1 << 20]),
                 checkpoint_every=rng.choice([0, 3, 10, 25]), timeout=600.0)


# -- the processes ------------------------------------------------------------------------------
@dataclass
class Role:
    """A producer, or one consumer slot of a subscription: its processes, one after another
    (each started when the one before was killed)."""

    kind: str  # producer | consumer
    number: int  # the producer's number, or the slot's within its subscription
    subscription: str = ""
    runs: list[Worker] = field(default_factory=list)
    histories: list[Path] = field(default_factory=list)  # a consumer's, one per run
    killed_at: dict[int, float] = field(default_factory=dict)  # run -> time of its kill

    @property
    def current(self) -> Worker:
        return self.runs[-1]


class Fleet:
    """The worker processes of a trial, and the owner kills."""

    def __init__(self, tmp_path: Path, trial: Trial, home: Path,
                 started: list[Worker]) -> None:
        self.tmp_path = tmp_path
        self.trial = trial
        self.home = home
        self.started = started
        self.go, self.done = tmp_path / "go", tmp_path / "producers-done"
        self.producers = [Role("producer", i) for i in range(PRODUCERS)]
        self.consumers = [Role("consumer", slot, sub) for sub in SUBSCRIPTIONS
                          for slot in range(CONSUMERS_PER_SUBSCRIPTION)]
        self.processes = 0
        self.kills: list[str] = []

    @property
    def roles(self) -> list[Role]:
        return self.producers + self.consumers

    def start(self, role: Role) -> Worker:
        self.processes += 1
        n = self.processes
        home = str(self.home)
        if role.kind == "producer":
            args = ["produce", home, "--producer", str(role.number),
                    "--events", str(self.trial.events), "--batch", str(self.trial.batch),
                    "--first-batch", str(len(acked_batches(role))), "--go", str(self.go),
                    "--out", str(self.tmp_path / f"producer-{n}.out")]
        else:
            history = self.tmp_path / f"consumer-{n}.history"
            role.histories.append(history)
            every = self.trial.checkpoint_every if role.number == 0 else 0
            args = ["consume", home, "--consumer", str(n), "--subscription", role.subscription,
                    "--seed", str(self.trial.seed * 1000 + n), "--go", str(self.go),
                    "--done", str(self.done), "--history", str(history),
                    "--checkpoint-every", str(every)]
        w = spawn(self.started, self.tmp_path, f"{role.kind}-{n}", *args)
        role.runs.append(w)
        return w

    def owner_pid(self) -> int | None:
        """The pid `.lock` names (the owner's, or a dead owner's until the next election)."""
        try:
            words = (self.home / LOCK_FILE).read_text().split()
        except FileNotFoundError:
            return None
        return int(words[1]) if len(words) > 1 and words[0] == "pid" and \
            words[1].isdigit() else None

    def kill_owner(self) -> bool:
        """SIGKILL the process that owns the channel and start it again; False when no
        worker is left running (all finished)."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            self.check_running()
            running = [r for r in self.roles if r.current.proc.poll() is None]
            if not running:
                return False
            pid = self.owner_pid()
            role = next((r for r in running if r.current.proc.pid == pid), None)
            if role is None:  # an election is on, or the owner just exited
                time.sleep(0.002)
                continue
            returncode = role.current.kill()
            killed_at = time.monotonic()  # it is dead (reaped) by now
            if returncode == 0:
                continue  # it finished just before: the next owner, then
            assert returncode == -signal.SIGKILL, role.current.describe()
            role.killed_at[len(role.runs) - 1] = killed_at
            self.kills.append(f"{role.kind}-{role.subscription or role.number}")
            self.start(role)
            return True
        raise AssertionError(f"no worker took the channel over within {WAIT_S} s")

    def check_running(self) -> None:
        """Fail at once when a worker exited with an error."""
        for role in self.roles:
            code = role.current.proc.poll()
            if code not in (None, 0) and role.current.returncode is None:
                raise AssertionError(role.current.describe())

    def finished(self, roles: list[Role]) -> bool:
        self.check_running()
        return all(r.current.proc.poll() == 0 for r in roles)

    def wait(self, roles: list[Role], deadline: float) -> None:
        while not self.finished(roles):
            assert time.monotonic() < deadline, "workers still running: " + "\n".join(
                r.current.describe() for r in roles if r.current.proc.poll() is None)
            time.sleep(0.005)
        for role in roles:
            assert role.current.finish(WAIT_S) == 0, role.current.describe()


def acked_batches(role: Role) -> set[int]:
    """The batches a producer's processes acknowledged so far (0, 1, ... in order)."""
    acked = {int(line.split()[1]) for w in role.runs for line in list(w.lines)
             if line.startswith("put ")}
    assert acked == set(range(len(acked))), f"producer {role.number} acked {sorted(acked)}"
    return acked


# -- a trial -----------------------------------------------------------------------------------
def run_trial(tmp_path: Path, trial: Trial) -> dict[str, Any]:
    config = make_config(tmp_path, partitions=3, durability="fsync", capacity=5_000_000,
                         segment_bytes=trial.segment_bytes, preallocate=False)
    config.save()
    with Channel.open(config) as channel:
        for name in SUBSCRIPTIONS[1:]:
            channel.add_subscription(name)
    rng = random.Random(trial.seed)
    started_at = time.monotonic()
    deadline = started_at + trial.timeout
    with workers() as started:
        fleet = Fleet(tmp_path, trial, config.home, started)
        first = fleet.start(fleet.producers[0])  # the first to open owns the channel
        assert first.first_line("open") == "open owner", first.describe()
        for role in fleet.roles[1:]:
            fleet.start(role)
        for role in fleet.roles[1:]:
            assert role.current.first_line("open") == "open client", role.current.describe()
        fleet.go.touch()
        total = PRODUCERS * trial.batches
        due = sorted(rng.uniform(0.05, 0.9) * total for _ in range(trial.kills))
        while due and not fleet.finished(fleet.producers):
            assert time.monotonic() < deadline, "producers still running"
            if sum(len(acked_batches(r)) for r in fleet.producers) >= due[0]:
                due.pop(0)
                fleet.kill_owner()
            time.sleep(0.002)
        fleet.wait(fleet.producers, deadline)
        fleet.done.touch()
        for _ in range(trial.drain_kills + len(due)):  # the kills the puts outran, too
            time.sleep(rng.uniform(0.0, 0.3))
            if not fleet.kill_owner():
                break
        fleet.wait(fleet.consumers, deadline)
    run_s = time.monotonic() - started_at

    result = check_trial(trial, fleet)
    with Channel.open(config) as channel:  # every worker exited: this process owns it now
        assert channel.role == "owner"
        assert channel.subscriptions() == list(SUBSCRIPTIONS)
        status = channel.status()
        assert status["recovery"]["lost_events"] == 0, status["recovery"]
        for name in SUBSCRIPTIONS:
            mine = status["subscriptions"][name]
            assert (mine["events_untaken"], mine["open_takes"]) == (0, 0), (name, mine)
            with channel.take(subscription=name) as tx:
                assert tx.take(100) == [], name
        for _ in range(2):  # a segment goes once both checkpoints say every subscription took it
            channel.checkpoint()
        partitions = channel.status()["partitions"]
        segments = [part["segments"] for part in partitions]
        assert segments == [1, 1, 1], f"segments every subscription took are kept: {segments}"
        log_starts = [part["log_start_offset"] for part in partitions]
    assert len(fleet.kills) >= trial.kills, f"only {fleet.kills} owner kills"
    return {"seconds": round(run_s, 1), "kills": fleet.kills, "processes": fleet.processes,
            "log_start_offsets": log_starts, **result}


# -- the checks ---------------------------------------------------------------------------------
Place = tuple[int, int]  # partition, offset
Stored = tuple[int, int, int, str]  # producer, seq, batch, key ("-": none)


@dataclass
class HistoryTake:
    """One take of a consumer, as its history tells it."""

    name: str
    t0: float  # just before take() was called
    events: list[tuple[Place, Stored]]
    state: str = "D"  # D (taken) | R | c (commit begun) | C | U | X
    at: float = math.inf  # when its commit returned (C), raised (U), or its process died (c)


def parse_token(trial: Trial, token: str) -> tuple[Place, Stored]:
    partition, offset, body, batch, key = token.split(",")
    producer, seq, padding = body.split(":")
    p, s = int(producer), int(seq)
    assert padding == "x" * (s % 23), token
    assert int(batch) == s // trial.batch, token
    expected = worker.stress_key(p, s)
    assert key == ("-" if expected is None else expected.decode()), token
    return (int(partition), int(offset)), (p, s, int(batch), key)


def read_history(trial: Trial, path: Path, killed_at: float | None) -> list[HistoryTake]:
    """A consumer's takes; a killed one's last line may be cut (dropped), its take open at
    the kill left as D (in flight: returned) or c (commit begun: outcome unknown)."""
    text = path.read_text() if path.exists() else ""
    lines = text.split("\n")
    if lines[-1]:
        assert killed_at is not None, f"{path}: a line cut short by a clean exit"
    takes: dict[str, HistoryTake] = {}
    for line in lines[:-1]:
        kind, name, *rest = line.split(" ")
        if kind == "D":
            takes[name] = HistoryTake(name, float(rest[0]),
                                      [parse_token(trial, t) for t in rest[1:]])
            continue
        take = takes[name]
        assert take.state in ("D", "c"), f"{path}: {line!r} after {take.state}"
        take.state = kind
        if kind in ("C", "U"):
            take.at = float(rest[0])
    for take in takes.values():
        if take.state in ("D", "c"):
            assert killed_at is not None, f"{path}: take {take.name} left {take.state}"
            if take.state == "c":
                take.at = killed_at
    return list(takes.values())


def check_trial(trial: Trial, fleet: Fleet) -> dict[str, Any]:
    attempts: dict[tuple[int, int], int] = {}
    for role in fleet.producers:
        assert acked_batches(role) == set(range(trial.batches)), f"producer {role.number}"
        for w in role.runs:
            for line in w.lines:
                word, *rest = line.split(" ")
                assert word in ("open", "begin-put", "put", "done"), line
                if word == "begin-put":
                    key = (role.number, int(rest[0]))
                    attempts[key] = attempts.get(key, 0) + 1
    by_subscription: dict[str, list[HistoryTake]] = defaultdict(list)
    for role in fleet.consumers:
        for run, path in enumerate(role.histories):
            by_subscription[role.subscription] += read_history(trial, path,
                                                               role.killed_at.get(run))
    committed: dict[str, set[Place]] = {}
    where: dict[Place, Stored] = {}  # stored once: one event per place, for everyone
    result: dict[str, Any] = {"uncertain_puts": sum(n - 1 for n in attempts.values())}
    for name in SUBSCRIPTIONS:
        takes = by_subscription[name]
        for take in takes:
            for place, stored in take.events:
                assert where.setdefault(place, stored) == stored, \
                    f"{name}: {place} holds {stored} and {where[place]}"
        events, uncertain_committed = check_subscription(name, takes)
        committed[name] = set(events)
        check_copies(name, trial, attempts, [where[place] for place in events])
        check_key_order(name, {place: where[place] for place in events})
        result[name] = {"takes": len(takes), "events": len(events),
                        "uncertain_takes": sum(t.state in ("U", "c") for t in takes),
                        "uncertain_committed": uncertain_committed}
    first = committed[SUBSCRIPTIONS[0]]
    for name in SUBSCRIPTIONS[1:]:
        assert committed[name] == first, \
            f"{name} and {SUBSCRIPTIONS[0]} committed different events: " \
            f"{sorted(committed[name] ^ first)[:10]}"
    return result


def check_subscription(name: str, takes: list[HistoryTake]) -> tuple[list[Place], int]:
    """The places a subscription's takes committed, each once, and how many takes of
    unknown outcome committed; see the module doc."""
    for take in takes:  # a take serves each partition in offset order
        for partition in {p for (p, _), _ in take.events}:
            offsets = [o for (p, o), _ in take.events if p == partition]
            assert offsets == sorted(set(offsets)), \
                f"{name}: take {take.name} out of order in partition {partition}"
    uncertain = resolve(takes)
    done = [t for t in takes if t.state == "C"] + uncertain
    places = Counter(place for t in done for place, _ in t.events)
    twice = [place for place, n in places.items() if n > 1]
    assert not twice, f"{name}: events committed by two takes: {sorted(twice)[:10]}"
    gone_at = {place: t.at for t in done for place, _ in t.events}
    for take in takes:
        lost = [place for place, _ in take.events if place not in gone_at]
        assert not lost, f"{name}: events delivered (take {take.name}), never committed, " \
                         f"and gone: {lost[:10]}"
        back = [place for place, _ in take.events if gone_at[place] < take.t0]
        assert not back, f"{name}: take {take.name}, begun after their commit returned, " \
                         f"received committed events {back[:10]}"
    return list(places), len(uncertain)


def resolve(takes: list[HistoryTake]) -> list[HistoryTake]:
    """The takes of unknown outcome (U, c) that committed, the engine being right: a commit
    is all or nothing, so one that returned has its events committed by other takes, and
    one that committed is the only take committing its events. Decided from the certain
    commits outwards: a take holding an event committed already returned; a take holding
    an event no other take could commit committed; when only takes of unknown outcome hold
    the same events, the last to receive them committed (the others returned them). A take
    committed in part leaves some of its events committed by no take (check_copies) or by
    two."""
    committed = [t for t in takes if t.state == "C"]
    certain = {place for t in committed for place, _ in t.events}
    pending = [t for t in takes if t.state in ("U", "c")]
    chosen: list[HistoryTake] = []
    while pending:
        cover = Counter(place for t in pending for place, _ in t.events)
        returned = [t for t in pending if any(place in certain for place, _ in t.events)]
        only = [t for t in pending if t not in returned and
                any(cover[place] == 1 for place, _ in t.events)]
        if not returned and not only:
            only = [max(pending, key=lambda t: t.t0)]
        for take in only:
            chosen.append(take)
            certain.update(place for place, _ in take.events)
        pending = [t for t in pending if t not in returned and t not in only]
    return chosen


def check_copies(name: str, trial: Trial, attempts: dict[tuple[int, int], int],
                 events: list[Stored]) -> None:
    """Every event of every batch once; a batch put again after an unknown outcome at most
    once per attempt, and whole."""
    seen = Counter((producer, seq) for producer, seq, _, _ in events)
    for producer in range(PRODUCERS):
        for batch in range(trial.batches):
            first = batch * trial.batch
            last = min(first + trial.batch, trial.events)
            counts = {seen[(producer, s)] for s in range(first, last)}
            tries = attempts[(producer, batch)]
            assert len(counts) == 1 and 1 <= min(counts) <= tries, \
                f"{name}: batch {batch} of producer {producer} committed {sorted(counts)} " \
                f"times after {tries} attempts"
    assert sum(seen.values()) == len(events)


def check_key_order(name: str, events: dict[Place, Stored]) -> None:
    """Per producer and key, the committed events in put order (a batch put again may
    follow its first copy, never overtake a later batch)."""
    streams: dict[tuple[int, int, str], list[tuple[int, int, int]]] = defaultdict(list)
    key_partition: dict[str, int] = {}
    for (partition, offset), (producer, seq, batch, key) in events.items():
        if key != "-":
            assert key_partition.setdefault(key, partition) == partition, \
                f"{name}: key {key} in two partitions"
        streams[(partition, producer, key)].append((offset, seq, batch))
    for (partition, producer, key), stream in streams.items():
        stream.sort()
        firsts = list(dict.fromkeys(seq for _, seq, _ in stream))  # a copy's first place
        assert firsts == sorted(firsts), f"{name}: producer {producer} key {key}: out of " \
                                         f"order in partition {partition}"
        batches = [b for _, _, b in stream]
        assert batches == sorted(batches), f"{name}: producer {producer} key {key}: a " \
                                           f"batch was overtaken in partition {partition}"


# -- the tests ----------------------------------------------------------------------------------
def test_every_subscription_takes_every_event_once_while_owners_are_killed(
        tmp_path: Path) -> None:
    """4 producers (24,000 events in batches of 250), 3 subscriptions each drained by 2
    consumers; the owner killed 3 times during the puts and once during the drain."""
    result = run_trial(tmp_path, Trial(seed=1))
    print(f"\nsubscriptions: {json.dumps(result)}")


@pytest.mark.slow
@pytest.mark.parametrize("number", range(12))
def test_every_subscription_takes_every_event_once_over_many_kills(tmp_path: Path,
                                                                   number: int) -> None:
    result = run_trial(tmp_path, random_trial(number))
    print(f"\nsubscriptions {number}: {json.dumps(result)}")

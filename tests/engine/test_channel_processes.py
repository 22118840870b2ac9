"""Many processes on one channel, and real kills: worker processes (channel_worker.py) put,
take and checkpoint; the tests kill them with SIGKILL and check the channel's contract.

  * stress: producers and consumers in separate processes, the first producer the owner;
    when it finishes and closes, another process becomes the owner mid-run (and so on).
    Exact accounting: every event taken and committed exactly once (a take whose commit
    raised OwnerLostError counts once, whichever way it went, never twice), nothing
    missing, per producer and key the order of the puts kept within a partition. A put
    whose commit raised OwnerLostError is retried; only that batch may be in the channel
    twice, and only whole.
  * kill -9 of the owner at random moments and inside checkpoints (stop hooks): every
    acknowledged put is there exactly once or was acknowledged taken; no acknowledged take
    comes back; the take in flight at the kill returns to the head of its partitions, in
    order (or, if its commit had started, it is gone as a whole); an unacknowledged put is
    there whole or not at all. Policy durability gets the same checks: a process kill keeps
    the page cache, so nothing whose commit returned may be lost.
  * kill -9 of a client in the middle of a take: the owner returns its events, in order.
  * a client process with many threads on a live owner: no request fails, none is lost.
  * kill -9 of the owner while a client is connected: the client's next call makes it the
    owner; its open take fails on commit and its events are queued again, first.
  * a channel deleted (its directories removed) under its owner, then the owner killed:
    the client never becomes the owner of a new channel there; every later call raises
    ChannelGoneError and no directory of the channel comes back.
  * damaged checkpoints after a kill (flipped byte, truncated, deleted; primary, backup or
    both): with one valid copy, nothing lost and no committed take back; with none, nothing
    lost (takes committed before the last checkpoint may come back, as in Flume) and the
    recovery report says so.

The default run has a few trials of each; `-m slow` runs many more, each derived from its
number, e.g. `-m slow -k "test_owner_kill_keeps_the_contract_over_many_kills[37]"`.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from channel_helpers import make_config
from child_lines import ChildLines, load_script
from polling import wait_for

import channel_engine
from channel_engine import (
    Channel,
    ChannelConfig,
    ChannelEngineError,
    ChannelGoneError,
    Event,
    OwnerLostError,
    TakeExpiredError,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKER_SCRIPT = HERE / "channel_worker.py"
WAIT_S = 30.0  # longest wait for a worker's line
ENGINE_ROOT = Path(channel_engine.__file__).resolve().parents[1]  # the tree this test runs


def child_env() -> dict[str, str]:
    """A worker's environment: the engine this process imported first on its path, so
    that the child runs the same one (a worktree's, say, not the one an editable install
    of the venv points at)."""
    paths = [str(ENGINE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


worker = load_script(WORKER_SCRIPT, "weir_channel_worker")


# -- worker processes -------------------------------------------------------------------------
class Worker(ChildLines):
    """A channel_worker.py child; its stdout is read line by line on a thread."""

    def __init__(self, args: list[str], stderr_path: Path) -> None:
        self.args = args
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "w+")  # noqa: SIM115 - closed in kill()
        self._start_reading(subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT), *args], cwd=REPO, env=child_env(),
            stdout=subprocess.PIPE, stderr=self._stderr, text=True), WAIT_S)
        self.returncode: int | None = None

    def first_line(self, prefix: str, timeout: float = WAIT_S) -> str:
        """The first line starting with `prefix`; fail if none comes."""
        def found(lines: list[str]) -> bool:
            return any(line.startswith(prefix) for line in lines)
        assert self.wait_for(found, timeout), f"no {prefix!r} line from {self.describe()}"
        return next(line for line in self.lines if line.startswith(prefix))

    def finish(self, timeout: float) -> int:
        """Wait for a normal exit; fail (after a kill) if it takes longer than `timeout`."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"worker still running after {timeout} s: "
                                 f"{self.describe()}") from None
        return self.kill()

    def kill(self) -> int:
        """SIGKILL (if still running), reap, read what was left in the pipe."""
        if self.returncode is not None:
            return self.returncode
        try:
            self.returncode = self._kill()
        finally:
            self._stderr.close()
        return self.returncode

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def describe(self) -> str:
        return (f"worker {self.args} rc={self.proc.poll()} last lines={self.lines[-5:]}\n"
                f"{self.stderr()[-3000:]}")


@contextmanager
def workers() -> Iterator[list[Worker]]:
    """A list to start workers into; every one is killed on the way out, whatever happened."""
    started: list[Worker] = []
    try:
        yield started
    finally:
        for w in started:
            w.kill()


def spawn(started: list[Worker], tmp_path: Path, name: str, *args: str) -> Worker:
    w = Worker(list(args), tmp_path / f"{name}.stderr")
    started.append(w)
    return w


# -- 1. stress: producers and consumers in many processes, the owner changing mid-run ----------
@dataclass
class TakeRecord:
    """One committed take of a consumer: kind "C" (its commit returned) or "U" (its commit
    raised OwnerLostError); events as (partition, offset, producer, seq, batch, key)."""

    kind: str
    name: str
    events: list[tuple[int, int, int, int, int, str]]


def read_consumer_file(path: Path) -> list[TakeRecord]:
    takes: dict[str, TakeRecord] = {}
    for line in path.read_text().splitlines():
        kind, name, partition, offset, body, batch, key = line.split(" ")
        producer, seq, padding = body.split(":")
        assert padding == "x" * (int(seq) % 23), line
        take = takes.setdefault(name, TakeRecord(kind, name, []))
        assert take.kind == kind, line
        take.events.append((int(partition), int(offset), int(producer), int(seq), int(batch),
                            key))
    return list(takes.values())


def run_stress(tmp_path: Path, events: list[int], consumers: int, batch: int = 500,
               timeout: float = 120.0) -> dict[str, Any]:
    """Run producers (events[i] events each) and consumers on one channel; check and return
    the accounting."""
    config = make_config(tmp_path, partitions=3, durability="fsync", capacity=5_000_000)
    config.save()
    home = str(config.home)
    go, done = tmp_path / "go", tmp_path / "producers-done"
    started_at = time.monotonic()
    with workers() as started:
        producers = []
        for i, count in enumerate(events):
            producers.append(spawn(started, tmp_path, f"producer-{i}", "produce", home,
                                   "--producer", str(i), "--events", str(count),
                                   "--batch", str(batch), "--go", str(go),
                                   "--out", str(tmp_path / f"producer-{i}.out")))
            if i == 0:  # the first to open owns the channel
                assert producers[0].first_line("open") == "open owner", producers[0].describe()
        takers = [spawn(started, tmp_path, f"consumer-{j}", "consume", home,
                        "--consumer", str(j), "--seed", str(1000 + j), "--go", str(go),
                        "--done", str(done), "--out", str(tmp_path / f"consumer-{j}.out"),
                        "--checkpoint-every", "25" if j == 0 else "0")
                  for j in range(consumers)]
        for w in producers[1:] + takers:
            assert w.first_line("open") == "open client", w.describe()
        go.touch()  # everybody is connected: the owner's work and its exit happen mid-run
        stats: dict[str, dict[str, Any]] = {}
        for i, w in enumerate(producers):
            assert w.finish(timeout) == 0, w.describe()
            stats[f"producer-{i}"] = json.loads(w.first_line("done")[len("done "):])
        done.touch()
        for j, w in enumerate(takers):
            assert w.finish(timeout) == 0, w.describe()
            stats[f"consumer-{j}"] = json.loads(w.first_line("done")[len("done "):])
    run_s = time.monotonic() - started_at

    retried: dict[tuple[int, int], int] = {}
    for i in range(len(events)):
        for line in (tmp_path / f"producer-{i}.out").read_text().splitlines():
            word, batch_no, attempts = line.split()
            assert word == "R", line
            retried[(i, int(batch_no))] = int(attempts)
    takes = [t for j in range(consumers)
             for t in read_consumer_file(tmp_path / f"consumer-{j}.out")]
    accounting = check_stress(events, batch, retried, takes)

    with Channel.open(config) as channel:  # every process closed: this one owns it now
        assert channel.role == "owner"
        status = channel.status()
        assert status["events_untaken"] == 0, status
        assert status["recovery"]["lost_events"] == 0, status["recovery"]
        with channel.take() as tx:
            assert tx.take(100) == []

    owners = [name for name, s in stats.items() if s["became_owner"]]
    assert owners, f"the owner never changed mid-run: {stats}"
    return {"seconds": round(run_s, 1), "events": sum(events), "owner_changes": owners,
            "stats": stats, **accounting}


def check_stress(events: list[int], batch: int, retried: dict[tuple[int, int], int],
                 takes: list[TakeRecord]) -> dict[str, Any]:
    """The exact accounting of a stress run; see the module doc."""
    certain = Counter((p, o) for t in takes if t.kind == "C" for p, o, *_ in t.events)
    twice = [place for place, n in certain.items() if n > 1]
    assert not twice, f"events committed by two takes: {twice[:10]}"
    committed = [e for t in takes if t.kind == "C" for e in t.events]
    uncertain_committed = uncertain_returned = 0
    for take in (t for t in takes if t.kind == "U"):
        again = [(p, o) in certain for p, o, *_ in take.events]
        # a take's commit is all or nothing: its events all came back, or none did
        assert all(again) or not any(again), f"take {take.name} committed in part"
        if any(again):
            uncertain_returned += 1
        else:
            uncertain_committed += 1
            committed += take.events
    places = Counter((p, o) for p, o, *_ in committed)
    assert max(places.values()) == 1, "an event committed by two takes"

    # every event of every producer, exactly once; a retried batch at most once per attempt,
    # and whole (its events all equally often)
    seen = Counter((producer, seq) for _, _, producer, seq, _, _ in committed)
    unknown = set(seen) - {(i, s) for i, n in enumerate(events) for s in range(n)}
    assert not unknown, f"events nobody put: {sorted(unknown)[:10]}"
    duplicated_batches = duplicated_events = 0
    for i, n in enumerate(events):
        for first in range(0, n, batch):
            b = first // batch
            counts = {seen[(i, s)] for s in range(first, min(first + batch, n))}
            if (i, b) in retried:
                assert len(counts) == 1 and 1 <= min(counts) <= retried[(i, b)], \
                    f"retried batch {b} of producer {i} is there {sorted(counts)} times"
                if min(counts) > 1:
                    duplicated_batches += 1
                    duplicated_events += (min(counts) - 1) * (min(first + batch, n) - first)
            else:
                assert counts == {1}, f"batch {b} of producer {i} is there {sorted(counts)} " \
                                      "times, and its put never raised"

    # contents, and the order of each producer's puts per key within a partition
    key_partition: dict[str, int] = {}
    streams: dict[tuple[int, int, str], list[tuple[int, int, int]]] = defaultdict(list)
    for p, offset, producer, seq, batch_no, key in committed:
        assert batch_no == seq // batch, (producer, seq, batch_no)
        expected_key = worker.stress_key(producer, seq)
        assert key == ("-" if expected_key is None else expected_key.decode()), (producer, seq)
        if key != "-":
            assert key_partition.setdefault(key, p) == p, f"key {key} in two partitions"
        streams[(p, producer, key)].append((offset, seq, batch_no))
    for (p, producer, key), stream in streams.items():
        stream.sort()
        firsts, seen_seqs = [], set()
        for _, seq, _ in stream:
            if seq not in seen_seqs:
                seen_seqs.add(seq)
                firsts.append(seq)
        assert firsts == sorted(firsts), f"producer {producer} key {key}: out of order in " \
                                         f"partition {p}"
        batches = [b for _, _, b in stream]
        assert batches == sorted(batches), f"producer {producer} key {key}: a batch was " \
                                           f"overtaken in partition {p}"
    assert len(key_partition) == sum(k is not None for k in worker.STRESS_KEYS)
    assert len(set(key_partition.values())) == 3  # the keys do spread over the partitions
    return {"retried_batches": len(retried), "duplicated_batches": duplicated_batches,
            "duplicated_events": duplicated_events,
            "uncertain_take_commits": uncertain_committed + uncertain_returned,
            "uncertain_committed": uncertain_committed,
            "uncertain_returned": uncertain_returned}


def test_many_producers_and_consumers_take_every_event_exactly_once(tmp_path: Path) -> None:
    """4 producers (200,000 events in batches of 500), 2 consumers; producer 0 owns the
    channel first and closes after its 20,000 events, so the owner changes mid-run."""
    result = run_stress(tmp_path, [20_000, 60_000, 60_000, 60_000], consumers=2)
    print(f"\nstress: {json.dumps(result)}")


@pytest.mark.slow
@pytest.mark.parametrize("number", range(3))
def test_many_producers_and_consumers_over_long_runs(tmp_path: Path, number: int) -> None:
    rng = random.Random(number)
    producers = 4 + number
    events = [rng.randint(5_000, 30_000)] + [rng.randint(100_000, 250_000)
                                             for _ in range(producers - 1)]
    result = run_stress(tmp_path, events, consumers=2 + number % 2,
                        batch=rng.choice([100, 500, 1000]), timeout=600.0)
    print(f"\nstress {number}: {json.dumps(result)}")


# -- 2. kill -9 of the owner -------------------------------------------------------------------
@dataclass(frozen=True)
class CrashTrial:
    """One crash-worker run, its channel, and where it gets killed."""

    seed: int
    durability: str = "fsync"
    flush_messages: int | None = None
    dual: bool = False
    keyless: bool = False
    checkpointer: bool = False  # checkpoints in a thread, back to back
    checkpoint_every: int = 2  # else after every this many operations
    put_ratio: float = 0.5
    kill: str = "delay"  # delay: after `delay` s | puts: after `puts` acks | stop: stop hook
    delay: float = 0.3
    puts: int = 20
    stop_phase: str = "before_write"
    stop_at: int = 3
    segment_bytes: int = 16 * 1024
    slow_sync_ms: float = 0.0  # every commit-journal sync this much slower (a slow disk)

    def config(self, root: Path) -> ChannelConfig:
        return make_config(root, partitions=3, durability=self.durability,
                           flush_messages=self.flush_messages,
                           segment_bytes=self.segment_bytes,
                           use_dual_checkpoints=self.dual,
                           backup_checkpoint_dir=str(root / "backup") if self.dual else None)

    def args(self, home: Path, first_id: int) -> list[str]:
        max_put = 20 if self.segment_bytes < 16 * 1024 else 100  # a put's batches must fit
        args = ["crash", str(home), "--seed", str(self.seed), "--first-id", str(first_id),
                "--put-ratio", str(self.put_ratio), "--max-put", str(max_put),
                "--checkpoint-every", str(self.checkpoint_every)]
        if self.checkpointer:
            args.append("--checkpointer")
        if self.keyless:
            args.append("--keyless")
        if self.slow_sync_ms:
            args += ["--slow-sync-ms", str(self.slow_sync_ms)]
        if self.kill == "stop":
            args += ["--stop-phase", self.stop_phase, "--stop-at", str(self.stop_at)]
        return args


def random_trial(number: int, durability: str = "fsync", **fixed: Any) -> CrashTrial:
    rng = random.Random(number)
    kill = rng.choice(["delay", "delay", "puts", "stop", "stop"])
    dual = rng.random() < 0.5
    phases = [p for p in worker.STOP_PHASES if dual or p != "before_backup"]
    stop_phase = rng.choice(phases)
    checkpointer = rng.random() < 0.4
    settings: dict[str, Any] = {
        "seed": number, "durability": durability,
        "flush_messages": rng.choice([10**9, rng.randint(20, 500)])
        if durability == "policy" else None,
        "dual": dual, "keyless": rng.random() < 0.2, "checkpointer": checkpointer,
        "checkpoint_every": rng.randint(1, 4), "put_ratio": rng.uniform(0.4, 0.7),
        "kill": kill, "delay": rng.uniform(0.0, 1.0), "puts": rng.randint(1, 60),
        "stop_phase": stop_phase, "stop_at": rng.randint(1, 8),
        "segment_bytes": rng.choice([4096, 16 * 1024, 1 << 20]),
        "slow_sync_ms": rng.choice([0, 0, 0, 2, 10]) if checkpointer else 0,
    }
    if kill == "stop" and stop_phase == "mid_segment_delete":  # soon, so: small segments
        settings.update(segment_bytes=4096, stop_at=rng.randint(1, 3),
                        put_ratio=rng.uniform(0.3, 0.5))
    settings.update(fixed)
    return CrashTrial(**settings)


Token = tuple[int, int, int]  # id, partition, offset


def tokens(words: list[str]) -> list[Token]:
    out = []
    for word in words:
        event, partition, offset = word.split(":")
        out.append((int(event), int(partition), int(offset)))
    return out


@dataclass
class Take:
    """One take transaction of a crash worker, as its lines tell it."""

    round: int
    number: int
    events: list[Token] = field(default_factory=list)
    state: str = "inflight"  # inflight | committing | committed | rolled back
    acked_at: int = -1  # index of its `take` line in the run's lines


@dataclass
class Run:
    """What one crash worker printed before it died."""

    trial: CrashTrial
    round: int
    lines: list[str]
    returncode: int
    stderr: str
    puts: list[tuple[int, int]] = field(default_factory=list)  # acked (first id, last id)
    unacked_put: tuple[int, int] | None = None
    takes: list[Take] = field(default_factory=list)
    deliveries: list[Token] = field(default_factory=list)  # every inflight event, in order
    delivery_lines: list[tuple[int, list[Token]]] = field(default_factory=list)  # by line
    last_checkpoint_begin: int = -1  # index of the last ckpt-begin line
    checkpoints: int = 0
    stopped: str | None = None

    def describe(self) -> str:
        return (f"round {self.round} {self.trial} rc={self.returncode} "
                f"puts={len(self.puts)} takes={len(self.takes)} stopped={self.stopped} "
                f"checkpoints={self.checkpoints} last lines={self.lines[-4:]}\n"
                f"{self.stderr[-2000:]}")

    @property
    def at_kill(self) -> Take | None:
        """The take that was open when the kill came, if any."""
        last = self.takes[-1] if self.takes else None
        return last if last is not None and last.state in ("inflight", "committing") else None


def parse_run(trial: CrashTrial, round_no: int, lines: list[str], returncode: int,
              stderr: str) -> Run:
    run = Run(trial, round_no, lines, returncode, stderr)
    takes: dict[int, Take] = {}
    begun: tuple[int, int] | None = None
    for index, line in enumerate(lines):
        word, *rest = line.split(" ")
        if word == "begin-put":
            begun = (int(rest[0]), int(rest[1]))
        elif word == "put":
            assert begun == (int(rest[0]), int(rest[1])), run.describe()
            run.puts.append(begun)
            begun = None
        elif word == "inflight":
            take = takes.setdefault(int(rest[0]), Take(round_no, int(rest[0])))
            if take not in run.takes:
                run.takes.append(take)
            events = tokens(rest[1:])
            take.events += events
            run.deliveries += events
            run.delivery_lines.append((index, events))
        elif word == "committing":
            takes[int(rest[0])].state = "committing"
        elif word == "take":
            take = takes[int(rest[0])]
            assert take.events == tokens(rest[1:]), run.describe()
            take.state, take.acked_at = "committed", index
        elif word == "rollback":
            takes[int(rest[0])].state = "rolled back"
        elif word == "ckpt-begin":
            run.last_checkpoint_begin = index
        elif word == "ckpt":
            run.checkpoints += 1
        elif word == "STOP":
            run.stopped = rest[0]
        elif word != "open":
            raise AssertionError(f"unexpected line {line!r}\n{run.describe()}")
    run.unacked_put = begun
    assert lines and lines[0].startswith("open owner"), run.describe()
    assert run.returncode == -signal.SIGKILL, run.describe()
    if trial.kill == "stop":
        assert run.stopped == trial.stop_phase, f"the stop hook never fired: {run.describe()}"
    return run


def run_and_kill(tmp_path: Path, home: Path, trial: CrashTrial, round_no: int = 0,
                 first_id: int = 0) -> Run:
    """Start a crash worker on the channel, kill it as the trial says, parse its lines."""
    with workers() as started:
        w = spawn(started, tmp_path, f"crash-{round_no}", *trial.args(home, first_id))
        w.first_line("open")
        if trial.kill == "delay":
            time.sleep(trial.delay)
        elif trial.kill == "puts":
            w.wait_for(lambda lines: sum(x.startswith("put ") for x in lines) >= trial.puts)
        else:
            w.first_line("STOP")
            if trial.checkpointer:  # only the checkpointer froze: let the others go on a bit
                time.sleep(random.Random(trial.seed).uniform(0, 0.05))
        returncode = w.kill()
        lines = list(w.lines)
        errors = [line for line in lines if line.startswith("ERROR")]
        assert not errors, w.describe()
        return parse_run(trial, round_no, lines, returncode, w.stderr())


@dataclass
class Reopened:
    """The channel as the parent found it after the kills: recovery report and every event
    it still delivers, taken (and committed) to the end."""

    status: dict[str, Any]
    drained: list[Event]
    readable: list[Event]  # what read() served from each log start, before the drain


def read_everything(channel: Channel) -> list[Event]:
    """Every event read() serves, each partition from its log start (read_committed)."""
    events: list[Event] = []
    for partition in channel.status()["partitions"]:
        offset = partition["log_start_offset"]
        while batch := channel.read(partition["partition"], offset, 500):
            events += batch
            offset = batch[-1].offset + 1
    return events


def reopen_and_drain(config: ChannelConfig) -> Reopened:
    with Channel.open(config) as channel:
        assert channel.role == "owner"
        status = channel.status()
        readable = read_everything(channel)
        drained: list[Event] = []
        while True:
            with channel.take() as tx:
                events = tx.take(1000)
            if not events:
                break
            drained += events
        after = channel.status()
        assert after["events_untaken"] == 0 and after["open_takes"] == 0, after
        # the recovered channel works: a put and a take
        with channel.put() as put:
            put.put(b"after", key=b"k1")
        with channel.take() as tx:
            assert [bytes(e.body) for e in tx.take(10)] == [b"after"]
    return Reopened(status, drained, readable)


def check_history(runs: list[Run], reopened: Reopened, *, checkpoints_lost: bool = False
                  ) -> dict[str, int]:
    """The contract over one or more kill rounds and the final drain; see the module doc.
    checkpoints_lost: no checkpoint copy survived, so takes committed before the last
    checkpoint may be delivered again (single round only)."""
    where = "\n".join(run.describe() for run in runs) + f"\n{reopened.status['recovery']}"
    status, drained = reopened.status, reopened.drained
    recovery = status["recovery"]
    keyless = runs[0].trial.keyless
    for event in drained:
        expected = worker.crash_event(runs[0].trial.seed, worker.event_id(event), keyless)
        assert (bytes(event.body), event.key, event.headers, event.timestamp) == (
            expected.body, expected.key, expected.headers, expected.timestamp), where
    final = [(worker.event_id(e), e.partition, e.offset) for e in drained]
    assert status["events_untaken"] == len(final), where
    assert recovery["lost_events"] == 0, where  # a process kill keeps the page cache
    ids = Counter(event for event, _, _ in final)
    assert max(ids.values(), default=1) == 1, f"delivered twice by the drain\n{where}"
    place: dict[int, tuple[int, int]] = {}
    for event, partition, offset in [t for run in runs for t in run.deliveries] + final:
        assert place.setdefault(event, (partition, offset)) == (partition, offset), \
            f"event {event} moved\n{where}"
    for partition in range(3):
        mine = [(offset, event) for event, p, offset in final if p == partition]
        assert mine == sorted(mine), f"partition {partition} drained out of order\n{where}"
        assert [e for _, e in mine] == sorted(e for _, e in mine), \
            f"partition {partition}: puts out of order\n{where}"

    # the last time each event was delivered: (round, line of its inflight line), the final
    # drain after every round
    last_seen: dict[int, tuple[int, int]] = {}
    for r, run in enumerate(runs):
        for index, delivered_then in run.delivery_lines:
            for event, _, _ in delivered_then:
                last_seen[event] = max(last_seen.get(event, (-1, -1)), (r, index))
    for event, _, _ in final:
        last_seen[event] = (len(runs), 0)

    def seen_after(event: int, r: int, line: int) -> bool:
        """Was `event` delivered after line `line` of round `r`?"""
        return last_seen.get(event, (-1, -1)) > (r, line)

    # the take open at each kill: returned whole (first in its partitions, in order), or,
    # if its commit had started, maybe committed whole
    committed: list[Take] = [t for run in runs for t in run.takes if t.state == "committed"]
    resolved = {"returned": 0, "committed": 0}
    for r, run in enumerate(runs):
        take = run.at_kill
        if take is None:
            continue
        back = [seen_after(event, r, len(run.lines)) for event, _, _ in take.events]
        assert all(back) or not any(back), \
            f"take {take.number} open at the kill: {sum(back)} of its {len(back)} events came " \
            f"back (committed in part, or events lost)\n{where}"
        if not any(back):
            assert take.state == "committing", \
                f"take {take.number} never began its commit and its events are gone\n{where}"
            committed.append(take)
            resolved["committed"] += 1
            continue
        resolved["returned"] += 1
        if checkpoints_lost:
            continue
        after = [t for other in runs[r + 1:] for t in other.deliveries] + final
        for partition in range(3):
            returned = sorted((o, e) for e, p, o in take.events if p == partition)
            next_ones = [(o, e) for e, p, o in after if p == partition][:len(returned)]
            assert next_ones == returned, f"in-flight events of partition {partition} not " \
                                          f"first again after the kill\n{where}"

    # no committed take is delivered again (unless every checkpoint copy was lost)
    again_allowed: set[int] = set()
    for take in committed:
        if take.acked_at < 0:
            continue
        run = runs[take.round]
        back = [event for event, _, _ in take.events
                if seen_after(event, take.round, take.acked_at)]
        if back and checkpoints_lost and take.acked_at < run.last_checkpoint_begin:
            again_allowed.update(back)
            continue
        assert not back, f"committed take {take.number} of round {take.round} delivered " \
                         f"again: {back[:10]}\n{where}"

    # every acked put exactly once (taken for good, or still queued); an unacked put whole
    # or not at all
    taken = Counter(event for take in committed for event, _, _ in take.events)
    delivered = Counter(event for event, _, _ in final) + taken
    acked = {event for run in runs for first, last in run.puts
             for event in range(first, last + 1)}
    unacked_present = 0
    for run in runs:
        if run.unacked_put is None:
            continue
        first, last = run.unacked_put
        present = [seen_after(event, run.round, len(run.lines)) or event in taken
                   for event in range(first, last + 1)]
        assert all(present) or not any(present), f"unacked put {run.unacked_put} in part\n" \
                                                 f"{where}"
        if all(present):
            acked.update(range(first, last + 1))
            unacked_present += 1
    missing = sorted(event for event in acked if delivered[event] == 0)
    assert not missing, f"{len(missing)} acked events lost: {missing[:20]}\n{where}"
    extra = sorted(event for event in delivered if event not in acked)
    assert not extra, f"events nobody put: {extra[:20]}\n{where}"
    twice = sorted(event for event in acked if delivered[event] > 1
                   and not (event in again_allowed and delivered[event] == 2))
    assert not twice, f"{len(twice)} events delivered twice: {twice[:20]}\n{where}"
    # a read serves what a take delivers: every queued event, and nothing of a put that
    # never committed (its batches may be in the log, aborted)
    read_ids = [worker.event_id(e) for e in reopened.readable]
    assert not set(read_ids) - acked, f"read() served events of puts that never committed: " \
                                      f"{sorted(set(read_ids) - acked)[:20]}\n{where}"
    assert {event for event, _, _ in final} <= set(read_ids), f"queued events read() does " \
                                                              f"not serve\n{where}"
    assert max(Counter(read_ids).values(), default=1) == 1, f"read() served twice\n{where}"
    return {"acked_puts": len(acked), "drained": len(final), "again": len(again_allowed),
            "returned": resolved["returned"], "committed_unacked": resolved["committed"],
            "unacked_put_present": unacked_present}


def crash_once(tmp_path: Path, trial: CrashTrial) -> tuple[Run, Reopened, dict[str, int]]:
    config = trial.config(tmp_path)
    config.save()
    run = run_and_kill(tmp_path, config.home, trial)
    reopened = reopen_and_drain(config)
    source = reopened.status["recovery"]["checkpoint_source"]
    assert source in ("primary", "backup"), reopened.status["recovery"]
    return run, reopened, check_history([run], reopened)


def crash_loop(tmp_path: Path, trials: list[CrashTrial]) -> None:
    """Kill, reopen in a new worker and go on, kill again...; then reopen, drain, check."""
    config = trials[0].config(tmp_path)
    config.save()
    runs = []
    for r, trial in enumerate(trials):
        assert trial.config(tmp_path) == config and trial.seed == trials[0].seed
        runs.append(run_and_kill(tmp_path, config.home, trial, r, first_id=r * 1_000_000))
    check_history(runs, reopen_and_drain(config))


@pytest.mark.parametrize("trial", [
    CrashTrial(seed=1, kill="delay", delay=0.6, checkpoint_every=1),
    CrashTrial(seed=2, kill="puts", puts=30, dual=True, checkpointer=True),
    CrashTrial(seed=3, kill="stop", stop_phase="before_rename", stop_at=4, dual=True),
    CrashTrial(seed=4, kill="stop", stop_phase="before_backup", stop_at=3, dual=True,
               checkpointer=True),
    CrashTrial(seed=5, kill="stop", stop_phase="before_journal_removal", stop_at=5,
               segment_bytes=4096),
    CrashTrial(seed=6, kill="stop", stop_phase="mid_segment_delete", stop_at=2,
               segment_bytes=4096, put_ratio=0.4),
    # a slow journal fsync: checkpoints run while a multi-partition put waits for its commit
    # record to be durable; the kill comes right after the put returned
    CrashTrial(seed=13, kill="puts", puts=8, checkpointer=True, slow_sync_ms=20),
], ids=["delay", "acks-checkpointer", "mid-primary-write", "before-backup",
        "before-journal-removal", "mid-segment-delete", "checkpoint-during-put-sync"])
def test_owner_kill_keeps_the_contract(tmp_path: Path, trial: CrashTrial) -> None:
    crash_once(tmp_path, trial)


def test_owner_kill_in_policy_mode_keeps_every_returned_commit(tmp_path: Path) -> None:
    """flush_messages never reached: nothing is fsynced by a put, yet after a process kill
    (the page cache survives) every put and take whose commit returned is kept."""
    crash_once(tmp_path, CrashTrial(seed=7, durability="policy", flush_messages=10**9,
                                    kill="delay", delay=0.5, checkpointer=True))


def test_owner_kill_loop(tmp_path: Path) -> None:
    seed = 8
    crash_loop(tmp_path, [
        CrashTrial(seed, kill="puts", puts=15),
        CrashTrial(seed, kill="stop", stop_phase="before_write", stop_at=2),
        CrashTrial(seed, kill="delay", delay=0.2, put_ratio=0.3),
        CrashTrial(seed, kill="stop", stop_phase="mid_segment_delete", stop_at=1,
                   put_ratio=0.3, checkpointer=True),
    ])


@pytest.mark.slow
@pytest.mark.parametrize("number", range(120))
def test_owner_kill_keeps_the_contract_over_many_kills(tmp_path: Path, number: int) -> None:
    crash_once(tmp_path, random_trial(number))


@pytest.mark.slow
@pytest.mark.parametrize("number", range(40))
def test_owner_kill_in_policy_mode_over_many_kills(tmp_path: Path, number: int) -> None:
    crash_once(tmp_path, random_trial(10_000 + number, durability="policy"))


@pytest.mark.slow
@pytest.mark.parametrize("number", range(15))
def test_owner_kill_loops(tmp_path: Path, number: int) -> None:
    rng = random.Random(20_000 + number)
    first = random_trial(20_000 + number)
    rounds = [first]
    for _ in range(rng.randint(3, 6)):
        other = random_trial(rng.randrange(1 << 30))
        if other.stop_phase == "before_backup" and not first.dual:
            other = random_trial(rng.randrange(1 << 30), kill="delay")
        rounds.append(CrashTrial(
            first.seed, first.durability, first.flush_messages, first.dual, first.keyless,
            other.checkpointer, other.checkpoint_every, other.put_ratio, other.kill,
            other.delay, other.puts, other.stop_phase, other.stop_at, first.segment_bytes))
    crash_loop(tmp_path, rounds)


# -- 3. kill -9 of a client in the middle of a take --------------------------------------------
def put_events(channel: Channel, seed: int, ids: range, batch: int = 40) -> None:
    for first in range(ids.start, ids.stop, batch):
        with channel.put() as tx:
            tx.put_all([worker.crash_event(seed, i, False)
                        for i in range(first, min(first + batch, ids.stop))])


def take_all(channel: Channel) -> list[Event]:
    out: list[Event] = []
    while True:
        with channel.take() as tx:
            events = tx.take(1000)
        if not events:
            return out
        out += events


@pytest.mark.parametrize("commit_first", [0, 70])
def test_a_killed_clients_take_returns_to_the_queue_in_order(tmp_path: Path,
                                                              commit_first: int) -> None:
    config = make_config(tmp_path, partitions=3)
    with Channel.open(config) as channel, workers() as started:
        assert channel.role == "owner"
        put_events(channel, 9, range(400))
        client = spawn(started, tmp_path, "client", "hold", str(config.home),
                       "--commit-first", str(commit_first), "--take", "150")
        client.first_line("holding")
        assert client.lines[0].startswith("open client"), client.describe()
        committed = tokens(client.first_line("take ").split(" ")[2:]) if commit_first else []
        held = tokens(client.first_line("inflight ").split(" ")[2:])
        assert len(committed) == commit_first and len(held) == 150
        status = channel.status()
        assert (status["open_takes"], status["events_in_flight"]) == (1, 150), status
        assert client.kill() == -signal.SIGKILL
        wait_for(lambda: channel.status()["open_takes"] == 0, WAIT_S, "no open takes",
                 interval_s=0.01)
        status = channel.status()
        assert status["events_in_flight"] == 0
        assert status["events_queued"] == status["events_untaken"] == 400 - commit_first
        drained = [(worker.event_id(e), e.partition, e.offset) for e in take_all(channel)]
    assert len({e for e, _, _ in drained}) == len(drained), "an event delivered twice"
    assert {e for e, _, _ in drained} == set(range(400)) - {e for e, _, _ in committed}
    for partition in range(3):
        mine = [t for t in drained if t[1] == partition]
        returned = sorted((t for t in held if t[1] == partition), key=lambda t: t[2])
        assert mine[:len(returned)] == returned, f"partition {partition}"
        assert [t[2] for t in mine] == sorted(t[2] for t in mine)


def test_a_client_with_many_threads_keeps_its_live_owner(tmp_path: Path) -> None:
    """32 threads of one client process commit puts at once while the owner (this process)
    stays up: no request may fail with OwnerLostError (an unknown outcome, so a retry and a
    duplicate) or any other error, and every put is in the channel once."""
    config = make_config(tmp_path, partitions=3)
    with Channel.open(config) as channel, workers() as started:
        assert channel.role == "owner"
        client = spawn(started, tmp_path, "threads", "threads", str(config.home),
                       "--threads", "32", "--puts", "5")
        assert client.finish(20) == 0, client.describe()  # it takes well under a second
        assert client.lines[0].startswith("open client"), client.describe()
        result = json.loads(client.first_line("done")[len("done "):])
        untaken = channel.status()["events_untaken"]
    assert result["errors"] == {}, result
    assert (result["ok"], result["role"], untaken) == (160, "client", 320), result


# -- 4. kill -9 of the owner while a client is connected ---------------------------------------
@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_a_client_becomes_the_owner_when_the_owner_is_killed(tmp_path: Path,
                                                             delay: float) -> None:
    trial = CrashTrial(seed=11, put_ratio=1.0, checkpoint_every=3)  # the owner only puts
    config = trial.config(tmp_path)
    config.save()
    with workers() as started:
        owner = spawn(started, tmp_path, "owner", *trial.args(config.home, 0))
        owner.first_line("open owner")
        owner.wait_for(lambda lines: sum(x.startswith("put ") for x in lines) >= 10)
        channel = Channel.open(config.home)
        try:
            assert channel.role == "client"
            with channel.take() as tx:
                taken = tx.take(60)
            take = channel.take()
            held = take.take(90)
            assert len(taken) == 60 and len(held) == 90
            time.sleep(delay)
            assert owner.kill() == -signal.SIGKILL
            with pytest.raises((OwnerLostError, TakeExpiredError)):
                take.commit()
            status = channel.status()  # the next call elects a new owner: this process
            assert channel.role == "owner" and status["role"] == "owner"
            readable = read_everything(channel)
            drained = take_all(channel)
        finally:
            channel.close()
    lines = list(owner.lines)
    assert not [line for line in lines if line.startswith("ERROR")], owner.describe()
    run = parse_run(trial, 0, lines, -signal.SIGKILL, owner.stderr())
    # the client's takes, as if the worker had made them: one committed, one open at the kill
    run.takes = [Take(0, 1, [(worker.event_id(e), e.partition, e.offset) for e in taken],
                      "committed", len(lines)),
                 Take(0, 2, [(worker.event_id(e), e.partition, e.offset) for e in held],
                      "inflight")]
    run.deliveries = [t for take_ in run.takes for t in take_.events]
    run.delivery_lines = [(len(lines), take_.events) for take_ in run.takes]
    result = check_history([run], Reopened(status, drained, readable))
    assert result["returned"] == 1


# -- 4b. the channel deleted under its owner ----------------------------------------------------
def test_a_client_never_brings_back_a_channel_deleted_under_its_owner(tmp_path: Path) -> None:
    """The appliance deletes a channel's directories and closes its owner while a web worker
    is a client: the worker's next put must not elect itself the owner of a new, empty
    channel in the deleted one's place (acknowledging events nobody can take, files a
    channel later made under the same name would adopt)."""
    config = make_config(tmp_path, partitions=2)
    config.save()
    places = [config.home, *(config.partition_dir(p) for p in range(2))]
    outcomes: Counter[str] = Counter()
    deleted = threading.Event()

    def keep_putting(channel: Channel) -> None:  # puts in flight across the delete
        while not outcomes["ChannelGoneError"]:
            try:
                with channel.put() as tx:
                    tx.put(b"racing")
            except (ChannelEngineError, OwnerLostError) as exc:  # LogDirectoryError, say
                outcomes[type(exc).__name__] += 1
            else:
                outcomes["after delete" if deleted.is_set() else "ok"] += 1

    with workers() as started:
        owner = spawn(started, tmp_path, "owner", "hold", str(config.home), "--take", "1")
        owner.first_line("holding")
        assert owner.lines[0].startswith("open owner"), owner.describe()
        channel = Channel.open(config.home)
        putter = threading.Thread(target=keep_putting, args=(channel,))
        try:
            assert channel.role == "client"
            putter.start()
            wait_for(lambda: outcomes["ok"] > 0, WAIT_S, "a put committed", interval_s=0.01)
            for place in places:
                shutil.rmtree(place)
            assert owner.kill() == -signal.SIGKILL
            deleted.set()
            putter.join(WAIT_S)
            def put_one() -> None:
                with channel.put() as tx:
                    tx.put(b"x")

            for call in (put_one, channel.take, channel.checkpoint, channel.status):
                with pytest.raises(ChannelGoneError, match="deleted"):
                    call()
            assert channel.role == "electing"
        finally:
            deleted.set()
            outcomes["ChannelGoneError"] += 1  # stops the putter whatever happened
            putter.join(WAIT_S)
            channel.close()
    assert [place for place in places if place.exists()] == []
    assert outcomes["ok"] > 0
    # acknowledged once the owner was dead: only a reply read just before the kill, if any
    assert outcomes["after delete"] <= 1, outcomes


# -- 5. damaged checkpoints ---------------------------------------------------------------------
def flip(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def truncate(path: Path, rng: random.Random) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:rng.randrange(len(data))])


def delete(path: Path, rng: random.Random) -> None:
    path.unlink()


DAMAGE = {"flip": flip, "truncate": truncate, "delete": delete}


def damage_after_kill(tmp_path: Path, trial: CrashTrial, primary: str | None,
                      backup: str | None) -> dict[str, int]:
    """Kill the worker, damage the checkpoint copies as asked, reopen, drain and check."""
    config = trial.config(tmp_path)
    config.save()
    run = run_and_kill(tmp_path, config.home, trial)
    rng = random.Random(trial.seed)
    damaged = []
    for how, directory in ((primary, config.home),
                           (backup, Path(str(config.backup_checkpoint_dir)))):
        if how is not None:
            path = directory / "checkpoint"
            DAMAGE[how](path, rng)
            damaged.append(str(path))
    valid_left = (primary is None) or (trial.dual and backup is None)
    reopened = reopen_and_drain(config)
    recovery = reopened.status["recovery"]
    where = f"{recovery}\n{run.describe()}"
    if valid_left:
        assert recovery["checkpoint_source"] == ("backup" if primary else "primary"), where
        for path in damaged:
            assert any(path in problem for problem in recovery["problems"]), where
    else:
        assert recovery["checkpoint_source"] is None, where
        assert any("no valid checkpoint" in problem for problem in recovery["problems"]), \
            where
    return check_history([run], reopened, checkpoints_lost=not valid_left)


@pytest.mark.parametrize(("primary", "backup", "dual", "keyless"), [
    ("flip", None, True, False),
    ("truncate", None, True, False),
    ("delete", None, True, False),
    (None, "flip", True, False),
    ("flip", "delete", True, True),
    ("delete", None, False, True),
    ("truncate", "delete", True, False),
    ("delete", None, False, False),
], ids=["primary-flipped", "primary-truncated", "primary-deleted", "backup-flipped",
        "both-gone-keyless", "only-copy-deleted-keyless", "both-gone",
        "only-copy-deleted"])
def test_damaged_checkpoints_after_a_kill(tmp_path: Path, primary: str | None,
                                          backup: str | None, dual: bool,
                                          keyless: bool) -> None:
    trial = CrashTrial(seed=12, dual=dual, keyless=keyless, kill="stop",
                       stop_phase="before_backup" if dual else "before_journal_removal",
                       stop_at=6, checkpoint_every=2, put_ratio=0.6)
    damage_after_kill(tmp_path, trial, primary, backup)


@pytest.mark.slow
@pytest.mark.parametrize("number", range(60))
def test_damaged_checkpoints_over_many_kills(tmp_path: Path, number: int) -> None:
    rng = random.Random(30_000 + number)
    trial = random_trial(30_000 + number, checkpointer=False)
    choices: list[str | None] = [None, "flip", "truncate", "delete"]
    primary = rng.choice(choices[1:] if not trial.dual else choices)
    backup = rng.choice(choices) if trial.dual else None
    if primary is None and backup is None:
        primary = "flip"
    damage_after_kill(tmp_path, trial, primary, backup)

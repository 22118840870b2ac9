"""Benchmark: Channel put/take transactions, checkpoints and crash reopen, next to SQLite, one run.

What is measured.

1. Throughput. N events (default 200,000) of 200 distinct random bytes each, no key, built
   before any timing starts, go through transactions in batches of 100 and of 1000, by 1 and by
   2 processes. A put is `with ch.put() as tx: tx.put_all(batch)`; a take is `with ch.take() as
   tx: tx.take(batch)`, repeated until the channel is empty. With 2 processes, two forked
   producers put half of the batches each, concurrently, into the same channel: the first to
   open it is the owner, the other its client over owner.sock; then the same two processes take
   concurrently until the channel is empty. Contenders:

   * engine, durability="fsync": each commit returns once durable (group commit shared between
     processes);
   * engine, durability="policy", flush_ms=1000: no fsync per commit; each process calls
     `ch.flush()` once at the end of a phase, inside the timing;
   * reference "sqlite FULL": stdlib sqlite3, WAL, synchronous=FULL, table (id INTEGER PRIMARY
     KEY, body BLOB). Put = BEGIN IMMEDIATE, executemany INSERT of the batch, COMMIT. Take =
     BEGIN IMMEDIATE, SELECT id, body ORDER BY id LIMIT batch, DELETE the ids selected, COMMIT.
     Each process has its own connection (busy_timeout 60 s). The baseline to beat;
   * reference "sqlite NORMAL" (1 process): the same with synchronous=NORMAL, which in WAL mode
     does not fsync per commit: the off-the-shelf counterpart of policy mode;
   * limit "raw" (1 process): the floor for any Python queue on this disk with the same bytes.
     Put: each event framed as struct.pack(">IIQ", len, crc32c, seq) + body, a batch joined and
     written with one os.write, one os.fdatasync per batch. Take: the batch's frames read back
     with one os.pread, CRC-checked and sliced into bodies, then a 24-byte commit record
     appended to a journal file and fdatasynced. "raw write" does one fdatasync at the end of
     each phase instead, like policy mode.

2. Checkpoints. One process owns an fsync channel; it is filled to 0, 10,000, 100,000 and
   1,000,000 queued events (--checkpoint-events) and `ch.checkpoint()` runs 5 times at each
   size; then with T (default 10,000) take transactions of 10 events each left open (in
   flight), then with every second one of them committed (out-of-order commits), then with the
   rest rolled back (returned ranges). CheckpointResult.duration_ms and lock_held_ms are
   reported (median and max), with the checkpoint file size; and the time per begin+take of the
   first and last tenth of the T takes (does a call cost more as open takes pile up?), per
   out-of-order commit and per rollback. The limit: an atomic 4 KiB file replacement (write,
   fsync, rename, directory fsync), median of 20.

3. Reopen after a crash. A forked child owns an fsync channel (checkpoint_interval_ms one day;
   nothing calls the checkpointer), puts M events (default 1,000,000) in batches of 1000, says
   so and is SIGKILLed. The parent times `Channel.open(config)` (it becomes the owner: log
   recovery, checkpoint restore, journal replay and the checkpoint written on open) and reports
   the seconds, the bytes the log loader CRC-checked (RecoveryReport.bytes_scanned) and s/GB
   (GB = 1e9 bytes). Twice per repeat: "warm" (segment files still in the page cache, as after
   a process crash) and "cold" (the channel's files evicted with posix_fadvise(DONTNEED) before
   the open, as after a machine crash). The limit: reading the same files (1 MiB reads) and
   crc32c over them, warm and cold.

Reported: the median and min-max of R runs (default 5; runs interleaved across cases, a fresh
directory each) of events/s and MB/s (MB = 1e6 bytes of event bodies); the CPU used by the
processes doing the work (the sum over both processes with 2) as a percentage of the wall time;
the same for the whole machine ("mach%", from /proc/stat, at most 200 on 2 CPUs: far above cpu%
means the kernel's I/O work or other processes competed for the CPUs); and the cache flushes
that reached the block device per transaction (device-wide, from /sys/dev/block). A phase's
time runs from the earliest process start to the latest end (CLOCK_MONOTONIC is shared by all
processes). The 1-minute load average is printed at the start and at the end: other work on
the machine shows there. Targets printed next to the figures (issue 18): fsync mode, put and
take, batches of 100 and 1000, >= 1.5x SQLite FULL with 1 process and >= 1.2x with 2; policy
mode >= 2x SQLite NORMAL; a checkpoint < 50 ms at any queue size; a reopen after a crash < 2 s
per GB scanned. --throughput-only skips the checkpoint and reopen sections. Scratch
directories live under --dir (default /var/tmp, on the same
filesystem as the checkout) and are removed at the end. The prebuilt inputs are moved out of
the garbage collector's reach (gc.freeze) before the workers are forked, so that they share
them and its full passes scan only what the contenders allocate.

Why. See bench/log_append.py and /work/shared/reference/perf-baseline.md: the machine is a
noisy 2-vCPU VM with a virtual disk, so every figure is compared with references measured in the
same run.

The record batch codec the engine ran (compiled, or pure Python with
WEIR_PURE_PYTHON_CODEC=1) is printed in the header and written in the JSON.

Usage: python bench/channel_throughput.py [--quick] [--events N] [--repeats R] [--dir DIR]
       [--throughput-only] [--checkpoint-events N] [--open-takes T] [--reopen-events M]
       [--json PATH]
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import multiprocessing.connection
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from itertools import cycle, islice
from pathlib import Path
from typing import Any, Protocol

import crc32c
from common import chunk, flush_stat_path, machine_busy_seconds, make_bodies, read_flushes

from channel_engine import Channel, ChannelConfig, PendingEvent
from channel_engine.log import record_batch

BODY_SIZE = 200
BATCH_SIZES = (100, 1000)
PROCESS_COUNTS = (1, 2)
SCRATCH_ROOT = "/var/tmp"
CHANNEL_NAME = "bench"
FRAME = struct.Struct(">IIQ")
RECORD_BYTES = FRAME.size + BODY_SIZE
JOURNAL_RECORD = struct.Struct(">qqq")  # the raw take's commit record: take id, start, end
TRANSACTION_CAPACITY = 10_000
FILL_BATCH = 1000  # events per put when filling a channel for the checkpoint/reopen sections
CHECKPOINT_RUNS = 5
TAKE_SIZE_IN_FLIGHT = 10
LIMIT_RUNS = 20
WORKER_TIMEOUT_S = 900.0
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
SQLITE_INSERT = "INSERT INTO t (body) VALUES (?)"
SQLITE_SELECT = "SELECT id, body FROM t ORDER BY id LIMIT ?"
SQLITE_DELETE = "DELETE FROM t WHERE id <= ?"
TARGET_CHECKPOINT_MS = 50.0
# issue 18: (engine case, reference, limit, processes, engine/reference at least), every batch
TARGET_RATIOS = (("engine_fsync", "sqlite_full", "raw_fdatasync", 1, 1.5),
                 ("engine_fsync", "sqlite_full", "raw_fdatasync", 2, 1.2),
                 ("engine_policy", "sqlite_normal", "raw_write", 1, 2.0))
TARGET_REOPEN_S_PER_GB = 2.0


# -- inputs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Inputs:
    """Prebuilt batches of one batch size, in the shape each contender takes."""

    batch: int
    events: int
    bodies: list[list[bytes]]
    pending: list[list[PendingEvent]]
    rows: list[list[tuple[bytes]]]




def make_inputs(bodies: list[bytes], batch: int) -> Inputs:
    """Build every contender's batches of `batch` events from the same bodies."""
    return Inputs(
        batch=batch,
        events=len(bodies),
        bodies=chunk(bodies, batch),
        pending=chunk([PendingEvent(b, None, None, None) for b in bodies], batch),
        rows=chunk([(b,) for b in bodies], batch),
    )


def fill_batches(inputs: Inputs, events: int) -> Iterator[list[PendingEvent]]:
    """Batches of FILL_BATCH prebuilt events, reused cyclically, `events` in all."""
    assert inputs.batch == FILL_BATCH and events % FILL_BATCH == 0
    return islice(cycle(inputs.pending), events // FILL_BATCH)


# -- measuring ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One timed phase: wall and CPU seconds, work done, device flushes (None if unknown)."""

    seconds: float
    cpu_seconds: float
    events: int
    batches: int
    flushes: int | None
    machine_cpu_seconds: float




def measure(work: Callable[[], tuple[int, int]], directory: Path) -> Sample:
    """Run `work` (returning events and batches done) once in this process and time it."""
    stat_path = flush_stat_path(directory)
    gc.collect()
    flushes0, busy0 = read_flushes(stat_path), machine_busy_seconds()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    events, batches = work()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    flushes1, busy1 = read_flushes(stat_path), machine_busy_seconds()
    flushes = None if flushes0 is None or flushes1 is None else flushes1 - flushes0
    return Sample(wall, cpu, events, batches, flushes, busy1 - busy0)


# -- the stores the worker processes drive ------------------------------------------------------
class Store(Protocol):
    """What a worker process does with a channel or a database."""

    role: str

    def put(self, batch: Any) -> None: ...
    def take(self, max_events: int) -> int: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...


class EngineStore:
    """A Channel opened in this process (the owner, or a client of the owner)."""

    def __init__(self, config: ChannelConfig) -> None:
        self.channel = Channel.open(config)
        self.role = self.channel.role
        self.policy = config.durability == "policy"

    def put(self, batch: list[PendingEvent]) -> None:
        with self.channel.put() as tx:
            tx.put_all(batch)

    def take(self, max_events: int) -> int:
        with self.channel.take() as tx:
            return len(tx.take(max_events))

    def sync(self) -> None:
        if self.policy:
            self.channel.flush()

    def close(self) -> None:
        self.channel.close()


class SqliteStore:
    """One connection to a WAL database, one transaction per put or take."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self.role = "sqlite"
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=60.0)
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        mode = self.conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = self.conn.execute("PRAGMA synchronous").fetchone()[0]
        if (mode, sync) != ("wal", {"FULL": 2, "NORMAL": 1}[synchronous]):
            raise RuntimeError(f"sqlite refused WAL/{synchronous}: journal_mode={mode}, "
                               f"synchronous={sync}")

    def put(self, rows: list[tuple[bytes]]) -> None:
        execute = self.conn.execute
        execute("BEGIN IMMEDIATE")
        self.conn.executemany(SQLITE_INSERT, rows)
        execute("COMMIT")

    def take(self, max_events: int) -> int:
        execute = self.conn.execute
        execute("BEGIN IMMEDIATE")
        rows = execute(SQLITE_SELECT, (max_events,)).fetchall()
        if rows:
            execute(SQLITE_DELETE, (rows[-1][0],))
        execute("COMMIT")
        return len(rows)

    def sync(self) -> None:
        pass

    def close(self) -> None:
        self.conn.close()


def sqlite_create(path: Path) -> None:
    """Create the database in WAL mode with table t (before any worker connects)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise RuntimeError(f"sqlite refused WAL: journal_mode={mode}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
    finally:
        conn.close()


# -- worker processes -----------------------------------------------------------------------
def store_put(store: Store, batches: list[Any]) -> tuple[int, int]:
    """Put every batch, one transaction each; flush at the end (policy mode)."""
    put = store.put
    events = 0
    for batch in batches:
        put(batch)
        events += len(batch)
    store.sync()
    return events, len(batches)


def store_take(store: Store, batch: int) -> tuple[int, int]:
    """Take `batch` events per transaction until nothing is left; flush at the end."""
    take = store.take
    events = transactions = 0
    while True:
        got = take(batch)
        if not got:
            break
        events += got
        transactions += 1
    store.sync()
    return events, transactions


def worker(index: int, processes: int, open_store: Callable[[], Store], batches: list[Any],
           take_batch: int, conn: multiprocessing.connection.Connection) -> None:
    """A forked worker: open the store, then run the phases the parent asks for."""
    try:
        store = open_store()
        conn.send(("ready", store.role))
        mine = batches[index::processes]
        while True:
            command = conn.recv()
            if command == "close":
                store.close()
                conn.send(("closed",))
                return
            gc.collect()
            cpu0, start = time.process_time(), time.perf_counter()
            if command == "put":
                events, done = store_put(store, mine)
            else:
                events, done = store_take(store, take_batch)
            end, cpu = time.perf_counter(), time.process_time() - cpu0
            conn.send(("done", start, end, cpu, events, done))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def receive(conn: multiprocessing.connection.Connection) -> tuple[Any, ...]:
    """A worker's next message; its exception is raised here."""
    if not conn.poll(WORKER_TIMEOUT_S):
        raise TimeoutError(f"no answer from a worker within {WORKER_TIMEOUT_S:.0f} s")
    message = conn.recv()
    if message[0] == "error":
        raise RuntimeError(f"worker failed:\n{message[1]}")
    return tuple(message)


class Workers:
    """1 or 2 forked processes over one store; the first one opened is the owner."""

    def __init__(self, processes: int, open_store: Callable[[], Store], batches: list[Any],
                 take_batch: int) -> None:
        ctx = multiprocessing.get_context("fork")
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.conns: list[multiprocessing.connection.Connection] = []
        self.roles: list[str] = []
        try:
            for index in range(processes):  # one at a time: worker 0 becomes the owner
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=worker, daemon=True, args=(
                    index, processes, open_store, batches, take_batch, theirs))
                proc.start()
                theirs.close()
                self.procs.append(proc)
                self.conns.append(ours)
                self.roles.append(receive(ours)[1])
        except BaseException:
            self.kill()
            raise

    def run(self, phase: str, directory: Path) -> Sample:
        """Run one phase in every worker at once; time it from first start to last end."""
        stat_path = flush_stat_path(directory)
        flushes0, busy0 = read_flushes(stat_path), machine_busy_seconds()
        for conn in self.conns:
            conn.send(phase)
        replies = [receive(conn) for conn in self.conns]
        flushes1, busy1 = read_flushes(stat_path), machine_busy_seconds()
        flushes = None if flushes0 is None or flushes1 is None else flushes1 - flushes0
        start, end = min(r[1] for r in replies), max(r[2] for r in replies)
        return Sample(end - start, sum(r[3] for r in replies), sum(r[4] for r in replies),
                      sum(r[5] for r in replies), flushes, busy1 - busy0)

    def close(self) -> None:
        """Close the clients first, then the owner; wait for every process to exit."""
        for conn in reversed(self.conns):
            conn.send("close")
            receive(conn)
        for proc in self.procs:
            proc.join(WORKER_TIMEOUT_S)

    def kill(self) -> None:
        """After a failure: SIGKILL whatever is still running."""
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join()


def run_workers(directory: Path, processes: int, open_store: Callable[[], Store],
                batches: list[Any], inputs: Inputs, roles: list[str]) -> dict[str, Sample]:
    """Put every batch with `processes` workers, then take everything back with them."""
    workers = Workers(processes, open_store, batches, inputs.batch)
    try:
        if workers.roles != roles:
            raise RuntimeError(f"expected roles {roles}, got {workers.roles}")
        put = workers.run("put", directory)
        take = workers.run("take", directory)
        workers.close()
    except BaseException:
        workers.kill()
        raise
    if put.events != inputs.events or take.events != inputs.events:
        raise RuntimeError(f"put {put.events:,} and took {take.events:,} events, "
                           f"expected {inputs.events:,}")
    return {"put": put, "take": take}


# -- the engine -----------------------------------------------------------------------------
def channel_config(directory: Path, durability: str, capacity: int,
                   checkpoint_interval_ms: int = HOUR_MS) -> ChannelConfig:
    """A one-partition channel in `directory` (data/ and home/)."""
    return ChannelConfig(
        CHANNEL_NAME, [str(directory / "data")], str(directory / "home"), partitions=1,
        capacity=capacity, transaction_capacity=TRANSACTION_CAPACITY, durability=durability,
        flush_messages=None, flush_ms=1000 if durability == "policy" else None,
        minimum_required_space=0, checkpoint_interval_ms=checkpoint_interval_ms)


def run_engine(directory: Path, inputs: Inputs, durability: str,
               processes: int) -> dict[str, Sample]:
    """Put and take every event through channel transactions."""
    directory.mkdir()
    config = channel_config(directory, durability, capacity=max(2 * inputs.events, 1000))
    roles = ["owner", "client"][:processes]
    return run_workers(directory, processes, lambda: EngineStore(config), inputs.pending,
                       inputs, roles)


# -- reference 1: SQLite --------------------------------------------------------------------
def run_sqlite(directory: Path, inputs: Inputs, synchronous: str,
               processes: int) -> dict[str, Sample]:
    """INSERT every batch, then SELECT + DELETE the oldest batch until empty."""
    directory.mkdir()
    path = directory / "bench.db"
    sqlite_create(path)
    return run_workers(directory, processes, lambda: SqliteStore(path, synchronous),
                       inputs.rows, inputs, ["sqlite"] * processes)


# -- reference 2: the raw loop (the limit) --------------------------------------------------
def raw_put(fd: int, batches: list[list[bytes]], sync_each: bool) -> tuple[int, int]:
    """Frame, join and write each batch; fdatasync per batch, or once at the end."""
    pack, crc, write, sync = FRAME.pack, crc32c.crc32c, os.write, os.fdatasync
    seq = 0
    for batch in batches:
        data = b"".join([pack(len(b), crc(b), s) + b for s, b in enumerate(batch, seq)])
        if write(fd, data) != len(data):
            raise OSError("short write")
        seq += len(batch)
        if sync_each:
            sync(fd)
    if not sync_each:
        sync(fd)
    return seq, len(batches)


def raw_take(fd: int, journal_fd: int, batches: list[list[bytes]],
             sync_each: bool) -> tuple[int, int]:
    """Read each batch's frames back, check and slice them, journal the take and fdatasync."""
    unpack, crc, pread, write, sync = (FRAME.unpack_from, crc32c.crc32c, os.pread, os.write,
                                       os.fdatasync)
    position = seq = 0
    for take_id, batch in enumerate(batches):
        length = len(batch) * RECORD_BYTES
        data = pread(fd, length, position)
        bodies = []
        for offset in range(0, length, RECORD_BYTES):
            size, checksum, _ = unpack(data, offset)
            body = data[offset + FRAME.size:offset + FRAME.size + size]
            if crc(body) != checksum:
                raise OSError(f"bad crc at byte {position + offset}")
            bodies.append(body)
        assert len(bodies) == len(batch)
        write(journal_fd, JOURNAL_RECORD.pack(take_id, seq, seq + len(bodies)))
        if sync_each:
            sync(journal_fd)
        position += length
        seq += len(bodies)
    if not sync_each:
        sync(journal_fd)
    return seq, len(batches)


def run_raw(directory: Path, inputs: Inputs, sync_each: bool,
            processes: int) -> dict[str, Sample]:
    """Time the raw loop appending to a new file, then taking everything back from it."""
    assert processes == 1
    directory.mkdir()
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND
    fd = os.open(directory / "raw.log", flags, 0o644)
    journal_fd = os.open(directory / "raw.journal", flags, 0o644)
    try:
        put = measure(lambda: raw_put(fd, inputs.bodies, sync_each), directory)
        take = measure(lambda: raw_take(fd, journal_fd, inputs.bodies, sync_each), directory)
    finally:
        os.close(fd)
        os.close(journal_fd)
    return {"put": put, "take": take}


# -- the throughput cases -------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One contender: a key for the results, a label, process counts and how to run it."""

    key: str
    label: str
    processes: tuple[int, ...]
    run: Callable[[Path, Inputs, int], dict[str, Sample]]


CASES = [
    Case("engine_fsync", "engine fsync", PROCESS_COUNTS,
         lambda d, i, p: run_engine(d, i, "fsync", p)),
    Case("engine_policy", "engine policy (1 flush)", PROCESS_COUNTS,
         lambda d, i, p: run_engine(d, i, "policy", p)),
    Case("sqlite_full", "sqlite WAL FULL", PROCESS_COUNTS,
         lambda d, i, p: run_sqlite(d, i, "FULL", p)),
    Case("sqlite_normal", "sqlite WAL NORMAL", (1,),
         lambda d, i, p: run_sqlite(d, i, "NORMAL", p)),
    Case("raw_fdatasync", "raw write+fdatasync", (1,), lambda d, i, p: run_raw(d, i, True, p)),
    Case("raw_write", "raw write (1 fdatasync)", (1,), lambda d, i, p: run_raw(d, i, False, p)),
]
LABELS = {case.key: case.label for case in CASES}
TAKE_LABELS = {"raw_fdatasync": "raw read+journal fdatasync",
               "raw_write": "raw read+journal (1 fdatasync)"}


def label(case: str, phase: str) -> str:
    """A contender's name in a table: the raw loop's take is a read and a journal append."""
    return TAKE_LABELS.get(case, LABELS[case]) if phase == "take" else LABELS[case]

Key = tuple[str, int, int, str]  # case, batch, processes, phase
Results = dict[Key, list[Sample]]


def run_throughput(inputs: list[Inputs], repeats: int, scratch: Path) -> Results:
    """Run every case at every batch size and process count `repeats` times, interleaved."""
    results: Results = {}
    for rep in range(repeats):
        for inp in inputs:
            for case in CASES:
                for processes in case.processes:
                    directory = scratch / f"{case.key}-b{inp.batch}-p{processes}-r{rep}"
                    try:
                        samples = case.run(directory, inp, processes)
                    finally:
                        shutil.rmtree(directory, ignore_errors=True)
                    for phase, sample in samples.items():
                        key = (case.key, inp.batch, processes, phase)
                        results.setdefault(key, []).append(sample)
                    print(".", end="", flush=True, file=sys.stderr)
    print(file=sys.stderr)
    return results


# -- checkpoints ----------------------------------------------------------------------------
@dataclass
class CheckpointFigure:
    """The checkpoints of one scenario: durations and lock hold times in ms."""

    scenario: str
    queued: int
    in_flight: int
    file_bytes: int
    duration_ms: list[float] = field(default_factory=list)
    lock_held_ms: list[float] = field(default_factory=list)


@dataclass
class CheckpointReport:
    """Every checkpoint scenario, the per-take cost with many takes open, and the limit."""

    figures: list[CheckpointFigure]
    open_takes: int
    first_take_us: float
    last_take_us: float
    commit_us: float
    rollback_us: float
    limit_ms: float


def checkpoints(channel: Channel, scenario: str) -> CheckpointFigure:
    """Run CHECKPOINT_RUNS checkpoints now; record them with the queue's size."""
    status = channel.status()
    home = Path(channel.config.checkpoint_dir)
    figure = CheckpointFigure(scenario, status["events_queued"], status["events_in_flight"], 0)
    for _ in range(CHECKPOINT_RUNS):
        result = channel.checkpoint()
        figure.duration_ms.append(result.duration_ms)
        figure.lock_held_ms.append(result.lock_held_ms)
    figure.file_bytes = (home / "checkpoint").stat().st_size
    return figure


def atomic_write_limit(directory: Path) -> float:
    """Median ms of replacing a 4 KiB file atomically (write, fsync, rename, fsync dir)."""
    data = os.urandom(4096)
    target, tmp = directory / "limit", directory / "limit.tmp"
    times = []
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(LIMIT_RUNS):
            start = time.perf_counter()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, target)
            os.fsync(dir_fd)
            times.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(dir_fd)
    return statistics.median(times)


def run_checkpoints(directory: Path, fill: Inputs, sizes: Sequence[int],
                    open_takes: int) -> CheckpointReport:
    """Checkpoint at growing queue sizes, then with many takes open, committed out of order,
    and rolled back."""
    directory.mkdir()
    config = channel_config(directory, "fsync", capacity=2 * max(sizes) + 2 * FILL_BATCH)
    figures = []
    with Channel.open(config) as channel:
        queued = 0
        for size in sizes:
            for batch in fill_batches(fill, size - queued):
                with channel.put() as tx:
                    tx.put_all(batch)
            queued = size
            figures.append(checkpoints(channel, f"{size:,} queued"))
        takes, per_take = [], []
        for _ in range(open_takes):
            start = time.perf_counter()
            tx = channel.take()
            tx.take(TAKE_SIZE_IN_FLIGHT)
            per_take.append(time.perf_counter() - start)
            takes.append(tx)
        figures.append(checkpoints(channel, f"{open_takes:,} takes in flight"))
        start = time.perf_counter()
        for tx in takes[1::2]:
            tx.commit()
        commit_s = time.perf_counter() - start
        figures.append(checkpoints(channel, "every 2nd committed"))
        start = time.perf_counter()
        for tx in takes[0::2]:
            tx.rollback()
        rollback_s = time.perf_counter() - start
        figures.append(checkpoints(channel, "the rest rolled back"))
    tenth = max(1, open_takes // 10)
    halves = max(1, len(takes[1::2]))
    return CheckpointReport(
        figures, open_takes, 1e6 * statistics.mean(per_take[:tenth]),
        1e6 * statistics.mean(per_take[-tenth:]), 1e6 * commit_s / halves,
        1e6 * rollback_s / max(1, len(takes[0::2])), atomic_write_limit(directory))


# -- reopen after a crash -------------------------------------------------------------------
@dataclass(frozen=True)
class ReopenSample:
    """One timed Channel.open after SIGKILL, and the raw read+crc32c of the same files."""

    cache: str  # "warm" or "cold"
    events: int
    open_s: float
    log_recovery_ms: float
    restore_ms: float
    bytes_scanned: int
    log_bytes: int
    raw_s: float

    @property
    def s_per_gb(self) -> float:
        """Open seconds per GB the log loader scanned (per GB of log if it scanned none)."""
        return self.open_s / (max(self.bytes_scanned, self.log_bytes, 1) / 1e9)

    @property
    def raw_s_per_gb(self) -> float:
        """The limit: read + crc32c seconds per GB of the same log files."""
        return self.raw_s / (max(self.log_bytes, 1) / 1e9)


def crash_child(config: ChannelConfig, fill: Inputs, events: int,
                conn: multiprocessing.connection.Connection) -> None:
    """Own the channel, put `events` events, say so, and wait to be killed."""
    try:
        channel = Channel.open(config)
        for batch in fill_batches(fill, events):
            with channel.put() as tx:
                tx.put_all(batch)
        conn.send(("done", channel.role, channel.status()["events_queued"]))
        time.sleep(3600)
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def channel_files(config: ChannelConfig) -> list[Path]:
    """Every regular file of the channel: segments, indexes, journals, checkpoint, state."""
    roots = [Path(d) for d in config.data_dirs] + [config.home]
    return [p for root in roots for p in sorted(root.rglob("*")) if p.is_file()]


def evict(paths: Sequence[Path]) -> None:
    """Drop these files' pages from the page cache (they are clean: fsynced)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_scan(paths: Sequence[Path]) -> float:
    """Seconds to read these files in 1 MiB reads and crc32c every byte."""
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            crc = 0
            while chunk_bytes := f.read(1 << 20):
                crc = crc32c.crc32c(chunk_bytes, crc)
    return time.perf_counter() - start


def run_reopen(directory: Path, fill: Inputs, events: int, cache: str) -> ReopenSample:
    """Crash a child owning the channel after `events` puts; time the next Channel.open."""
    directory.mkdir()
    config = channel_config(directory, "fsync", capacity=events + 2 * FILL_BATCH,
                            checkpoint_interval_ms=DAY_MS)
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=crash_child, args=(config, fill, events, theirs), daemon=True)
    child.start()
    theirs.close()
    try:
        _, role, queued = receive(ours)
    finally:
        if child.pid is not None and child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
        child.join()
    if (role, queued) != ("owner", events):
        raise RuntimeError(f"the crash child was {role} with {queued:,} events queued")
    segments = sorted(Path(config.data_dirs[0]).rglob("*.log"))
    log_bytes = sum(p.stat().st_size for p in segments)
    if cache == "cold":
        evict(channel_files(config))
    gc.collect()
    start = time.perf_counter()
    channel = Channel.open(config)
    open_s = time.perf_counter() - start
    try:
        owner = channel.owner
        assert owner is not None and channel.role == "owner"
        reports = [log.last_recovery for log in owner.logs]
        if any(r.clean_shutdown for r in reports):
            raise RuntimeError("the log says it was shut down cleanly: the crash did not happen")
        if channel.status()["events_queued"] != events:
            raise RuntimeError(f"{channel.status()['events_queued']:,} events queued after "
                               f"reopen, expected {events:,}")
        sample_fields = (sum(r.duration_ms for r in reports), owner.recovery.duration_ms,
                         sum(r.bytes_scanned for r in reports))
    finally:
        channel.close()
    if cache == "cold":
        evict(segments)
    raw_s = raw_scan(segments)
    return ReopenSample(cache, events, open_s, *sample_fields, log_bytes, raw_s)


def run_reopens(scratch: Path, fill: Inputs, events: int, repeats: int) -> list[ReopenSample]:
    """`repeats` warm and cold crash reopens, interleaved, a fresh directory each."""
    samples = []
    for rep in range(repeats):
        for cache in ("warm", "cold"):
            directory = scratch / f"reopen-{cache}-r{rep}"
            try:
                samples.append(run_reopen(directory, fill, events, cache))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            print(".", end="", flush=True, file=sys.stderr)
    print(file=sys.stderr)
    return samples


# -- summarising ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Figure:
    """Median and range of events/s over the runs of one (case, batch, processes, phase)."""

    case: str
    batch: int
    processes: int
    phase: str
    events_per_s: float
    min_events_per_s: float
    max_events_per_s: float
    mb_per_s: float
    cpu_percent: float
    machine_cpu_percent: float
    flushes_per_batch: float | None
    runs: list[float]


def summarise(key: Key, samples: list[Sample]) -> Figure:
    """Reduce the runs of one measurement to a Figure."""
    rates = [s.events / s.seconds for s in samples]
    median = statistics.median(rates)
    cpu = statistics.median(100 * s.cpu_seconds / s.seconds for s in samples)
    machine = statistics.median(100 * s.machine_cpu_seconds / s.seconds for s in samples)
    flushes = [s.flushes / s.batches for s in samples if s.flushes is not None and s.batches]
    return Figure(*key, median, min(rates), max(rates), median * BODY_SIZE / 1e6, cpu, machine,
                  statistics.median(flushes) if flushes else None, rates)


def figures_by_key(results: Results) -> dict[Key, Figure]:
    """Summarise every measurement."""
    return {key: summarise(key, samples) for key, samples in results.items()}


# -- printing -------------------------------------------------------------------------------
def fmt_rate(value: float) -> str:
    """Events/s with thousands separators."""
    return f"{value:,.0f}"


def met(ok: bool) -> str:
    """The verdict printed next to a target."""
    return "met" if ok else "MISSED"


def table_row(fig: Figure) -> str:
    """One line of the detailed throughput table."""
    spread = f"({fmt_rate(fig.min_events_per_s)}-{fmt_rate(fig.max_events_per_s)})"
    flushes = "-" if fig.flushes_per_batch is None else f"{fig.flushes_per_batch:.2f}"
    return (f"  {label(fig.case, fig.phase):<31} {fig.processes:>5} {fig.batch:>5}  "
            f"{fmt_rate(fig.events_per_s):>10} {spread:<25} {fig.mb_per_s:>7.1f}  "
            f"{fig.cpu_percent:>5.0f} {fig.machine_cpu_percent:>5.0f}  {flushes:>8}")


def print_table(title: str, figs: list[Figure]) -> None:
    """Print a detailed table of figures."""
    print(title)
    print(f"  {'':<31} {'procs':>5} {'batch':>5}  {'events/s':>10} {'(min-max)':<25} "
          f"{'MB/s':>7}  {'cpu%':>5} {'mach%':>5}  {'fl/txn':>8}")
    for fig in figs:
        print(table_row(fig))
    print()


def side_by_side(figs: dict[Key, Figure], phase: str, batches: Sequence[int]) -> None:
    """Each engine mode next to SQLite and the raw limit, medians."""
    refs = {"engine_fsync": ("sqlite_full", "raw_fdatasync"),
            "engine_policy": ("sqlite_normal", "raw_write")}
    for batch in batches:
        for engine, (sqlite, raw) in refs.items():
            for processes in PROCESS_COUNTS:
                fig = figs[(engine, batch, processes, phase)]
                sql = figs.get((sqlite, batch, processes, phase))
                limit = figs[(raw, batch, 1, phase)]
                parts = [f"{LABELS[engine]:<23} procs={processes} batch={batch:<5} {phase} "
                         f"{fmt_rate(fig.events_per_s):>9} ev/s {fig.mb_per_s:>6.1f} MB/s"]
                if sql is not None:
                    parts.append(f"{label(sqlite, phase)} {fmt_rate(sql.events_per_s)} ev/s "
                                 f"({fig.events_per_s / sql.events_per_s:.2f}x)")
                parts.append(f"limit {label(raw, phase)} {fmt_rate(limit.events_per_s)} ev/s "
                             f"({fig.events_per_s / limit.events_per_s:.2f}x)")
                print("  " + " | ".join(parts))
    print()


def print_throughput(figs: dict[Key, Figure], batches: Sequence[int]) -> None:
    """Print the put and take tables and the side-by-side rows."""
    def ordered(phase: str) -> list[Figure]:
        return [figs[(case.key, b, p, phase)] for b in batches for case in CASES
                for p in case.processes]

    print_table("PUT (transactions until committed; policy, sqlite NORMAL, raw write: one "
                "flush at the end)", ordered("put"))
    print_table("TAKE (transactions until empty, each committed; the same flushes)",
                ordered("take"))
    print("SIDE BY SIDE (medians; ratio = engine / reference)")
    side_by_side(figs, "put", batches)
    side_by_side(figs, "take", batches)


def print_checkpoints(report: CheckpointReport) -> None:
    """Print every checkpoint scenario and the per-take costs."""
    print(f"CHECKPOINT (fsync channel, 1 partition, ch.checkpoint() x{CHECKPOINT_RUNS} per "
          f"scenario; median / max ms)")
    print(f"  {'scenario':<28} {'queued':>10} {'in flight':>10} {'file B':>8}  "
          f"{'duration_ms':>16}  {'lock_held_ms':>16}")
    for fig in report.figures:
        duration = f"{statistics.median(fig.duration_ms):.2f} / {max(fig.duration_ms):.2f}"
        lock = f"{statistics.median(fig.lock_held_ms):.3f} / {max(fig.lock_held_ms):.3f}"
        print(f"  {fig.scenario:<28} {fig.queued:>10,} {fig.in_flight:>10,} "
              f"{fig.file_bytes:>8,}  {duration:>16}  {lock:>16}")
    print(f"  limit: atomic 4 KiB file replace (write, fsync, rename, dir fsync) "
          f"{report.limit_ms:.2f} ms (median of {LIMIT_RUNS})")
    print(f"  begin+take({TAKE_SIZE_IN_FLIGHT}) with takes piling up to {report.open_takes:,}: "
          f"first tenth {report.first_take_us:,.0f} us/take, last tenth "
          f"{report.last_take_us:,.0f} us/take; commit every 2nd (out of order) "
          f"{report.commit_us:,.0f} us/commit; roll back the rest {report.rollback_us:,.0f} "
          f"us/rollback")
    print()


def print_reopens(samples: list[ReopenSample]) -> None:
    """Print every crash reopen and the medians per cache state."""
    print("REOPEN AFTER SIGKILL (fsync channel; every event put after the last checkpoint; "
          "Channel.open timed)")
    print(f"  {'cache':<5} {'events':>10} {'open s':>7} {'log ms':>8} {'restore ms':>10} "
          f"{'scanned GB':>10} {'log GB':>7} {'s/GB':>6}  {'limit read+crc s/GB':>19}")
    for s in samples:
        print(f"  {s.cache:<5} {s.events:>10,} {s.open_s:>7.3f} {s.log_recovery_ms:>8.1f} "
              f"{s.restore_ms:>10.1f} {s.bytes_scanned / 1e9:>10.3f} {s.log_bytes / 1e9:>7.3f} "
              f"{s.s_per_gb:>6.2f}  {s.raw_s_per_gb:>19.3f}")
    print()


def print_targets(figs: dict[Key, Figure], checkpoint: CheckpointReport | None,
                  reopens: list[ReopenSample]) -> None:
    """Each target, the figure it is judged on, and the limit measured in this run."""
    print("TARGETS")
    for engine, sqlite, raw, processes, goal in TARGET_RATIOS:
        for phase in ("put", "take"):
            for batch in BATCH_SIZES:
                fig = figs[(engine, batch, processes, phase)].events_per_s
                sql = figs[(sqlite, batch, processes, phase)].events_per_s
                limit = figs[(raw, batch, 1, phase)].events_per_s
                print(f"  {phase:<4} {LABELS[engine]} batch={batch} procs={processes}: "
                      f"{fmt_rate(fig)} ev/s vs {LABELS[sqlite]} {fmt_rate(sql)} ev/s = "
                      f"{fig / sql:.2f}x (target >= {goal:.2f}x) {met(fig >= goal * sql)}; "
                      f"limit {label(raw, phase)} {fmt_rate(limit)} ev/s "
                      f"(= {limit / sql:.2f}x sqlite)")
    if checkpoint is not None:
        worst = max(max(fig.duration_ms) for fig in checkpoint.figures)
        worst_lock = max(max(fig.lock_held_ms) for fig in checkpoint.figures)
        print(f"  checkpoint, any queue size and in-flight state: max duration {worst:.2f} ms, "
              f"max lock held {worst_lock:.3f} ms (target < {TARGET_CHECKPOINT_MS:.0f} ms) "
              f"{met(worst < TARGET_CHECKPOINT_MS)}; limit {checkpoint.limit_ms:.2f} ms")
    for cache in ("warm", "cold"):
        runs = [s for s in reopens if s.cache == cache]
        if not runs:
            continue
        per_gb = statistics.median(s.s_per_gb for s in runs)
        limit = statistics.median(s.raw_s_per_gb for s in runs)
        print(f"  reopen after SIGKILL ({cache} cache, {runs[0].events:,} events): median "
              f"{statistics.median(s.open_s for s in runs):.3f} s, {per_gb:.2f} s/GB "
              f"(target < {TARGET_REOPEN_S_PER_GB:.0f} s/GB) "
              f"{met(per_gb < TARGET_REOPEN_S_PER_GB)}; limit read+crc32c {limit:.3f} s/GB")


def print_header(args: argparse.Namespace, scratch: Path) -> None:
    """Print what ran where."""
    print(f"Weir channel throughput benchmark: {args.events:,} events of {BODY_SIZE} B per run, "
          f"no key, batches of {' and '.join(map(str, BATCH_SIZES))}, "
          f"{' and '.join(map(str, PROCESS_COUNTS))} processes, median of {args.repeats} runs "
          f"(min-max)")
    print(f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
          f"{os.cpu_count()} CPUs, 1 partition, segment_bytes=1 GiB, scratch {scratch}")
    print(f"checkpoints up to {max(args.checkpoint_sizes):,} queued and {args.open_takes:,} "
          f"takes in flight; reopen after SIGKILL with {args.reopen_events:,} events, "
          f"{args.reopen_repeats} run(s) warm and cold; load average {os.getloadavg()[0]:.2f}")
    print(f"record batch codec: {record_batch.CODEC} (WEIR_PURE_PYTHON_CODEC=1 for the pure "
          f"Python one)")
    print(flush=True)


# -- main -----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per throughput run")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 20,000 events, 1 run, 100,000 for checkpoint/reopen")
    parser.add_argument("--repeats", type=int, default=5, help="runs per throughput figure")
    parser.add_argument("--dir", type=Path, default=Path(SCRATCH_ROOT),
                        help="where the scratch directory is made (and removed)")
    parser.add_argument("--checkpoint-events", type=int, default=1_000_000,
                        help="largest queue to checkpoint")
    parser.add_argument("--open-takes", type=int, default=10_000,
                        help="take transactions left in flight during checkpoints")
    parser.add_argument("--reopen-events", type=int, default=1_000_000,
                        help="events put between the last checkpoint and the SIGKILL")
    parser.add_argument("--reopen-repeats", type=int, default=2,
                        help="crash reopens per cache state")
    parser.add_argument("--throughput-only", action="store_true",
                        help="run the throughput section only (no checkpoints, no reopens)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.repeats = 20_000, 1
        args.checkpoint_events = args.reopen_events = 100_000
        args.open_takes, args.reopen_repeats = 1000, 1
    for name in ("events", "checkpoint_events", "reopen_events"):
        value = getattr(args, name)
        if value < FILL_BATCH or value % FILL_BATCH:
            parser.error(f"--{name.replace('_', '-')} must be a positive multiple of "
                         f"{FILL_BATCH}")
    smaller = (n for n in (10_000, 100_000) if n < args.checkpoint_events)
    args.checkpoint_sizes = sorted({0, *smaller, args.checkpoint_events})
    if args.open_takes * TAKE_SIZE_IN_FLIGHT > args.checkpoint_events:
        parser.error("--open-takes x 10 must not exceed --checkpoint-events")
    return args


def write_json(path: Path, args: argparse.Namespace, figs: dict[Key, Figure],
               checkpoint: CheckpointReport | None, reopens: list[ReopenSample]) -> None:
    """Write the run's settings and every figure as JSON."""
    doc = {
        "benchmark": "bench/channel_throughput.py",
        "events": args.events, "body_bytes": BODY_SIZE, "repeats": args.repeats,
        "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
        "codec": record_batch.CODEC,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "throughput": [asdict(fig) for fig in figs.values()],
        "checkpoint": None if checkpoint is None else asdict(checkpoint),
        "reopen": [{**asdict(s), "s_per_gb": s.s_per_gb, "raw_s_per_gb": s.raw_s_per_gb}
                   for s in reopens],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Build the inputs, run every section, print the report (and the JSON)."""
    args = parse_args(argv)
    bodies = make_bodies(args.events, BODY_SIZE)
    inputs = [make_inputs(bodies, batch) for batch in BATCH_SIZES]
    fill = next(inp for inp in inputs if inp.batch == FILL_BATCH)
    gc.freeze()  # the prebuilt inputs: out of timed collections, shared by forked workers
    args.dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="weir-chbench-", dir=args.dir))
    try:
        print_header(args, scratch)
        results = run_throughput(inputs, args.repeats, scratch)
        checkpoint, reopens = None, []
        if not args.throughput_only:
            checkpoint = run_checkpoints(scratch / "checkpoint", fill, args.checkpoint_sizes,
                                         args.open_takes)
            shutil.rmtree(scratch / "checkpoint", ignore_errors=True)
            reopens = run_reopens(scratch, fill, args.reopen_events, args.reopen_repeats)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_end = os.getloadavg()[0]
    figs = figures_by_key(results)
    print_throughput(figs, BATCH_SIZES)
    if checkpoint is not None:
        print_checkpoints(checkpoint)
        print_reopens(reopens)
    print_targets(figs, checkpoint, reopens)
    print(f"\nload average at the end {load_end:.2f}")
    if args.json:
        write_json(args.json, args, figs, checkpoint, reopens)
        print(f"\nJSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: one channel read by 3 subscriptions, next to 3 channels given the same events
(Flume's replicating channel selector) and SQLite with one table per consumer, one run.

What is measured. N events (default 200,000) of 100-200 random bytes each (sizes uniform,
fixed seed), no key, built before any timing starts, go in batches of B (default 1000) to
K consumers (default 3), in three ways:

  (a) subscriptions: one channel with K subscriptions ("default", "s1", "s2", ...): each
      batch put once (`with ch.put() as tx: tx.put_all(batch)`); then each subscription
      drained in turn (`with ch.take(subscription=s) as tx: tx.take(B)`, committed, until
      empty);
  (b) replicating: K channels, each batch put into each of them in turn (one transaction
      per channel, as Flume's replicating selector commits to each of its channels); then
      each channel drained the same way;
  (c) sqlite: one database in WAL mode with synchronous=FULL, tables c0..c{K-1} (id INTEGER
      PRIMARY KEY, body BLOB); a batch is one transaction (BEGIN IMMEDIATE, executemany
      INSERT into each table, COMMIT); then each consumer drains its table: BEGIN
      IMMEDIATE, SELECT id, body ORDER BY id LIMIT B, DELETE the ids selected, COMMIT, until
      empty;
  limit "raw": the floor for storing the events once, durably, on this disk: each event
      framed as struct.pack(">IIQ", len, crc32c, seq) + body, a batch joined and written
      with one os.write and one os.fdatasync, appending to a new file (bench/log_append.py's
      and bench/channel_throughput.py's loop).

The channels have durability="fsync" (a commit returns once durable, like SQLite FULL), one
partition (--partitions), 1 GiB segments, and are opened in this process: it is their owner
(no socket). Every consumer's drain is checked: N events, and the bytes of the bodies.

Reported: the median and min-max of R runs (default 3; runs interleaved across cases, a
fresh directory each) of: put events/s (events made durable for all K consumers per
second); drain events/s (deliveries per second: K x N in all); end-to-end events/s (N over
put + drain time: each event stored and delivered to every consumer); the bytes on disk once
every batch is put, before any drain (allocated blocks of every file of the case, as du
counts them), also per event; the cache flushes that reached the block device per put
batch (device-wide, from /sys/dev/block: other processes' I/O can inflate it); and the CPU
this process used as a percentage of the wall time. The raw loop's events/s, MB/s (framed
bytes) and fdatasyncs/s are printed next to the figures. Scratch directories live under
--dir (default /var/tmp, on the same filesystem as the checkout) and are removed at the
end. The prebuilt inputs are moved out of the garbage collector's reach (gc.freeze).

Why. Subscriptions store an event once for every reader; the alternatives a Flume or
SQLite user has store it once per reader. The machine is a noisy 2-vCPU VM with a virtual
disk (/work/shared/reference/perf-baseline.md), so every figure is compared with the others
and with the disk's limit measured in the same run.

Usage: python bench/subscriptions.py [--quick] [--events N] [--batch B] [--consumers K]
       [--repeats R] [--partitions P] [--min-size S] [--max-size S] [--dir DIR] [--json PATH]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import crc32c
from common import chunk, flush_stat_path, read_flushes

from channel_engine import Channel, ChannelConfig, PendingEvent

SCRATCH_ROOT = "/var/tmp"
FRAME = struct.Struct(">IIQ")
HOUR_MS = 3_600_000
SEED = 16  # the number: the same sizes every run


# -- inputs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Inputs:
    """The same batches in the shape each contender takes."""

    events: int
    batch: int
    body_bytes: int
    bodies: list[list[bytes]]
    pending: list[list[PendingEvent]]
    rows: list[list[tuple[bytes]]]


def make_inputs(events: int, batch: int, min_size: int, max_size: int) -> Inputs:
    """`events` distinct random bodies of min_size..max_size bytes, in batches of `batch`."""
    rng = random.Random(SEED)
    sizes = [rng.randint(min_size, max_size) for _ in range(events)]
    blob = os.urandom(sum(sizes))
    bodies, at = [], 0
    for size in sizes:
        bodies.append(blob[at:at + size])
        at += size
    return Inputs(events, batch, at, chunk(bodies, batch),
                  chunk([PendingEvent(b, None, None, None) for b in bodies], batch),
                  chunk([(b,) for b in bodies], batch))


# -- measuring ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One timed phase: wall and CPU seconds, events and batches done, device flushes."""

    seconds: float
    cpu_seconds: float
    events: int
    batches: int
    flushes: int | None


def measure(work: Callable[[], tuple[int, int]], directory: Path) -> Sample:
    """Run `work` (returning events and batches done) in this process and time it."""
    stat_path = flush_stat_path(directory)
    gc.collect()
    flushes0 = read_flushes(stat_path)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    events, batches = work()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    flushes1 = read_flushes(stat_path)
    flushes = None if flushes0 is None or flushes1 is None else flushes1 - flushes0
    return Sample(wall, cpu, events, batches, flushes)


def disk_bytes(directory: Path) -> int:
    """Bytes allocated to every file under `directory` (what du counts)."""
    return sum(os.stat(Path(root) / name).st_blocks * 512
               for root, _, files in os.walk(directory) for name in files)


@dataclass(frozen=True)
class CaseRun:
    """One run of a case: its put and drain phases, and its bytes on disk after the puts."""

    put: Sample
    drain: Sample
    disk: int


def check_drained(case: str, consumer: str, inputs: Inputs, got: tuple[int, int]) -> None:
    """Every consumer receives every event: count and body bytes."""
    if got != (inputs.events, inputs.body_bytes):
        raise RuntimeError(f"{case}: consumer {consumer} received {got[0]:,} events of "
                           f"{got[1]:,} B, expected {inputs.events:,} of {inputs.body_bytes:,}")


# -- the engine: (a) subscriptions, (b) replicating ----------------------------------------------
def channel_config(directory: Path, name: str, partitions: int, events: int) -> ChannelConfig:
    return ChannelConfig(
        name, (str(directory / "data"),), str(directory / f"home-{name}"), partitions=partitions,
        capacity=max(2 * events, 1000), transaction_capacity=10_000, durability="fsync",
        flush_messages=None, flush_ms=None, minimum_required_space=0,
        checkpoint_interval_ms=HOUR_MS)


def put_all(channels: list[Channel], batches: list[list[PendingEvent]]) -> tuple[int, int]:
    """Each batch into each channel, one transaction per channel."""
    events = 0
    for batch in batches:
        for channel in channels:
            with channel.put() as tx:
                tx.put_all(batch)
        events += len(batch)
    return events, len(batches) * len(channels)


def drain(channel: Channel, subscription: str, batch: int) -> tuple[int, int, int]:
    """Take until empty, each take committed: events, body bytes, transactions."""
    events = size = takes = 0
    while True:
        with channel.take(subscription=subscription) as tx:
            got = tx.take(batch)
        if not got:
            return events, size, takes
        events += len(got)
        size += sum(len(e.body) for e in got)
        takes += 1


def drain_each(case: str, readers: list[tuple[Channel, str]], inputs: Inputs
               ) -> tuple[int, int]:
    """Drain every (channel, subscription) in turn; check each got everything."""
    events = takes = 0
    for channel, subscription in readers:
        got, size, done = drain(channel, subscription, inputs.batch)
        check_drained(case, f"{channel.name}/{subscription}", inputs, (got, size))
        events, takes = events + got, takes + done
    return events, takes


def run_subscriptions(directory: Path, inputs: Inputs, consumers: int,
                      partitions: int) -> CaseRun:
    """(a) One channel, put once, `consumers` subscriptions each drained."""
    config = channel_config(directory, "subs", partitions, inputs.events)
    names = ["default", *(f"s{i}" for i in range(1, consumers))]
    with Channel.open(config) as channel:
        for name in names[1:]:
            channel.add_subscription(name)
        put = measure(lambda: put_all([channel], inputs.pending), directory)
        disk = disk_bytes(directory)
        drained = measure(lambda: drain_each("subscriptions", [(channel, n) for n in names],
                                             inputs), directory)
    return CaseRun(put, drained, disk)


def run_replicating(directory: Path, inputs: Inputs, consumers: int,
                    partitions: int) -> CaseRun:
    """(b) `consumers` channels, each batch put into each, each channel drained."""
    channels = [Channel.open(channel_config(directory, f"rep{i}", partitions, inputs.events))
                for i in range(consumers)]
    try:
        put = measure(lambda: put_all(channels, inputs.pending), directory)
        disk = disk_bytes(directory)
        drained = measure(lambda: drain_each("replicating", [(c, "default") for c in channels],
                                             inputs), directory)
    finally:
        for channel in channels:
            channel.close()
    # put_all counted a batch per channel: count the batches of events (one per put)
    put = Sample(put.seconds, put.cpu_seconds, put.events, put.batches // consumers,
                 put.flushes)
    return CaseRun(put, drained, disk)


# -- (c) SQLite, one table per consumer ---------------------------------------------------------
def sqlite_open(path: Path, consumers: int) -> sqlite3.Connection:
    """The database in WAL mode, synchronous=FULL, with tables c0..c{consumers-1}."""
    conn = sqlite3.connect(path, isolation_level=None)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    conn.execute("PRAGMA synchronous=FULL")
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    if (mode, sync) != ("wal", 2):
        raise RuntimeError(f"sqlite refused WAL/FULL: journal_mode={mode}, synchronous={sync}")
    for i in range(consumers):
        conn.execute(f"CREATE TABLE c{i} (id INTEGER PRIMARY KEY, body BLOB)")
    return conn


def sqlite_put(conn: sqlite3.Connection, tables: list[str],
               batches: list[list[tuple[bytes]]]) -> tuple[int, int]:
    """Each batch into every table, one transaction per batch."""
    execute, executemany = conn.execute, conn.executemany
    inserts = [f"INSERT INTO {t} (body) VALUES (?)" for t in tables]
    events = 0
    for rows in batches:
        execute("BEGIN IMMEDIATE")
        for insert in inserts:
            executemany(insert, rows)
        execute("COMMIT")
        events += len(rows)
    return events, len(batches)


def sqlite_drain(conn: sqlite3.Connection, table: str, batch: int) -> tuple[int, int, int]:
    """SELECT + DELETE the oldest `batch` rows per transaction until empty."""
    execute = conn.execute
    select = f"SELECT id, body FROM {table} ORDER BY id LIMIT ?"
    delete = f"DELETE FROM {table} WHERE id <= ?"
    events = size = takes = 0
    while True:
        execute("BEGIN IMMEDIATE")
        rows = execute(select, (batch,)).fetchall()
        if rows:
            execute(delete, (rows[-1][0],))
        execute("COMMIT")
        if not rows:
            return events, size, takes
        events += len(rows)
        size += sum(len(body) for _, body in rows)
        takes += 1


def run_sqlite(directory: Path, inputs: Inputs, consumers: int, partitions: int) -> CaseRun:
    """(c) One table per consumer, a transaction per batch into all of them; each drained."""
    directory.mkdir()
    conn = sqlite_open(directory / "bench.db", consumers)
    tables = [f"c{i}" for i in range(consumers)]

    def drain_tables() -> tuple[int, int]:
        events = takes = 0
        for table in tables:
            got, size, done = sqlite_drain(conn, table, inputs.batch)
            check_drained("sqlite", table, inputs, (got, size))
            events, takes = events + got, takes + done
        return events, takes

    try:
        put = measure(lambda: sqlite_put(conn, tables, inputs.rows), directory)
        disk = disk_bytes(directory)
        drained = measure(drain_tables, directory)
    finally:
        conn.close()
    return CaseRun(put, drained, disk)


# -- the limit: the raw loop ----------------------------------------------------------------------
def run_raw(directory: Path, inputs: Inputs) -> tuple[Sample, int]:
    """Frame, join and write each batch, one fdatasync each; the sample and bytes written."""
    directory.mkdir()
    fd = os.open(directory / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    written = 0

    def loop() -> tuple[int, int]:
        nonlocal written
        pack, crc, write, sync = FRAME.pack, crc32c.crc32c, os.write, os.fdatasync
        seq = 0
        for batch in inputs.bodies:
            data = b"".join([pack(len(b), crc(b), s) + b for s, b in enumerate(batch, seq)])
            if write(fd, data) != len(data):
                raise OSError("short write")
            sync(fd)
            written += len(data)
            seq += len(batch)
        return seq, len(inputs.bodies)

    try:
        sample = measure(loop, directory)
    finally:
        os.close(fd)
    return sample, written


# -- running --------------------------------------------------------------------------------
CASES: dict[str, tuple[str, Callable[[Path, Inputs, int, int], CaseRun]]] = {
    "subscriptions": ("(a) 1 channel, K subscriptions", run_subscriptions),
    "replicating": ("(b) K channels (replicating)", run_replicating),
    "sqlite": ("(c) sqlite, K tables, WAL FULL", run_sqlite),
}


@dataclass
class Results:
    """Every run of every case, and of the raw loop."""

    runs: dict[str, list[CaseRun]]
    raw: list[tuple[Sample, int]]


def run_all(inputs: Inputs, args: argparse.Namespace, scratch: Path) -> Results:
    """Every case and the raw loop `repeats` times, interleaved, a fresh directory each."""
    results = Results({case: [] for case in CASES}, [])
    for rep in range(args.repeats):
        for case, (_, run) in CASES.items():
            directory = scratch / f"{case}-r{rep}"
            try:
                results.runs[case].append(run(directory, inputs, args.consumers,
                                              args.partitions))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            print(".", end="", flush=True, file=sys.stderr)
        directory = scratch / f"raw-r{rep}"
        try:
            results.raw.append(run_raw(directory, inputs))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        print(".", end="", flush=True, file=sys.stderr)
    print(file=sys.stderr)
    return results


# -- summarising and printing ---------------------------------------------------------------------
@dataclass(frozen=True)
class Figure:
    """The medians (and ranges) of one case over its runs."""

    case: str
    put_events_per_s: float
    put_range: tuple[float, float]
    drain_events_per_s: float
    drain_range: tuple[float, float]
    end_to_end_events_per_s: float
    end_to_end_range: tuple[float, float]
    disk_bytes: float
    flushes_per_batch: float | None
    put_cpu_percent: float
    drain_cpu_percent: float


def summarise(case: str, runs: list[CaseRun], events: int) -> Figure:
    puts = [r.put.events / r.put.seconds for r in runs]
    drains = [r.drain.events / r.drain.seconds for r in runs]
    ends = [events / (r.put.seconds + r.drain.seconds) for r in runs]
    flushes = [r.put.flushes / r.put.batches for r in runs if r.put.flushes is not None]
    return Figure(
        case, statistics.median(puts), (min(puts), max(puts)), statistics.median(drains),
        (min(drains), max(drains)), statistics.median(ends), (min(ends), max(ends)),
        statistics.median(r.disk for r in runs),
        statistics.median(flushes) if flushes else None,
        statistics.median(100 * r.put.cpu_seconds / r.put.seconds for r in runs),
        statistics.median(100 * r.drain.cpu_seconds / r.drain.seconds for r in runs))


def rate(value: float, spread: tuple[float, float]) -> str:
    return f"{value:>9,.0f} ({spread[0]:,.0f}-{spread[1]:,.0f})"


def print_report(figs: dict[str, Figure], raw: list[tuple[Sample, int]], inputs: Inputs,
                 consumers: int) -> None:
    print(f"{'':<33} {'put events/s (min-max)':>31} {'drain deliveries/s (min-max)':>31} "
          f"{'end-to-end events/s (min-max)':>31} {'disk MB':>8} {'B/event':>8} "
          f"{'fl/batch':>8} {'cpu% put/drain':>14}")
    for case, fig in figs.items():
        flushes = "-" if fig.flushes_per_batch is None else f"{fig.flushes_per_batch:.2f}"
        print(f"  {CASES[case][0]:<31} {rate(fig.put_events_per_s, fig.put_range):>31} "
              f"{rate(fig.drain_events_per_s, fig.drain_range):>31} "
              f"{rate(fig.end_to_end_events_per_s, fig.end_to_end_range):>31} "
              f"{fig.disk_bytes / 1e6:>8.1f} {fig.disk_bytes / inputs.events:>8.0f} "
              f"{flushes:>8} {fig.put_cpu_percent:>6.0f}/{fig.drain_cpu_percent:<7.0f}")
    rates = [s.events / s.seconds for s, _ in raw]
    mbs = [n / 1e6 / s.seconds for s, n in raw]
    syncs = [s.batches / s.seconds for s, _ in raw]
    print(f"  limit: raw write+fdatasync per batch (stored once): "
          f"{statistics.median(rates):,.0f} events/s ({min(rates):,.0f}-{max(rates):,.0f}), "
          f"{statistics.median(mbs):,.0f} MB/s framed, {statistics.median(syncs):,.0f} "
          f"fdatasyncs/s, {raw[0][1] / 1e6:.1f} MB")
    print()
    a, b, c = figs["subscriptions"], figs["replicating"], figs["sqlite"]
    limit = statistics.median(rates)
    print(f"RATIOS (medians; K = {consumers})")
    for other, name in ((b, "(b) replicating"), (c, "(c) sqlite")):
        print(f"  (a) / {name:<16} put {a.put_events_per_s / other.put_events_per_s:5.2f}x  "
              f"drain {a.drain_events_per_s / other.drain_events_per_s:5.2f}x  end-to-end "
              f"{a.end_to_end_events_per_s / other.end_to_end_events_per_s:5.2f}x  "
              f"disk {a.disk_bytes / other.disk_bytes:5.2f}x")
    for fig in (a, b, c):
        print(f"  {CASES[fig.case][0]:<31} put = {fig.put_events_per_s / limit:.2f}x the raw "
              f"limit")
    print()


def print_header(args: argparse.Namespace, inputs: Inputs, scratch: Path) -> None:
    print(f"Weir subscriptions benchmark: {inputs.events:,} events of {args.min_size}-"
          f"{args.max_size} B ({inputs.body_bytes / 1e6:.1f} MB of bodies, mean "
          f"{inputs.body_bytes / inputs.events:.0f} B), no key, batches of {inputs.batch}, "
          f"K = {args.consumers} consumers, median of {args.repeats} runs (min-max)")
    print(f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
          f"{os.cpu_count()} CPUs; channels: durability fsync, {args.partitions} partition(s), "
          f"opened in this process (the owner); scratch {scratch}; load average "
          f"{os.getloadavg()[0]:.2f}")
    print("put: events made durable for every consumer; drain: deliveries (K x N) per s, "
          "consumers one after another; end-to-end: N / (put + drain s); disk: after the "
          "puts, before any drain", flush=True)
    print()


# -- main -----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per run")
    parser.add_argument("--batch", type=int, default=1000, help="events per transaction")
    parser.add_argument("--consumers", type=int, default=3,
                        help="K: subscriptions, channels or tables")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure")
    parser.add_argument("--partitions", type=int, default=1, help="partitions per channel")
    parser.add_argument("--min-size", type=int, default=100, help="smallest body, bytes")
    parser.add_argument("--max-size", type=int, default=200, help="largest body, bytes")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 events, 1 run")
    parser.add_argument("--dir", type=Path, default=Path(SCRATCH_ROOT),
                        help="where the scratch directory is made (and removed)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.repeats = 20_000, 1
    if not 1 <= args.batch <= 10_000:
        parser.error("--batch must be 1..10000 (the channels' transaction_capacity)")
    if args.events < 1 or args.consumers < 1 or args.repeats < 1 or args.partitions < 1:
        parser.error("--events, --consumers, --repeats and --partitions must be positive")
    if not 1 <= args.min_size <= args.max_size:
        parser.error("need 1 <= --min-size <= --max-size")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    inputs = make_inputs(args.events, args.batch, args.min_size, args.max_size)
    gc.freeze()  # the prebuilt inputs: out of timed collections
    args.dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="weir-subbench-", dir=args.dir))
    try:
        print_header(args, inputs, scratch)
        results = run_all(inputs, args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figs = {case: summarise(case, runs, inputs.events) for case, runs in results.runs.items()}
    print_report(figs, results.raw, inputs, args.consumers)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        doc: dict[str, Any] = {
            "benchmark": "bench/subscriptions.py", "events": inputs.events,
            "body_bytes": inputs.body_bytes, "batch": inputs.batch,
            "consumers": args.consumers, "partitions": args.partitions,
            "repeats": args.repeats, "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "figures": [asdict(fig) for fig in figs.values()],
            "raw": [{**asdict(s), "bytes": n} for s, n in results.raw],
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: PartitionLog append and read rates next to a raw write loop and SQLite, one run.

What is measured. N events (default 200,000) of 200 distinct random bytes each, no key, built
before any timing starts, are appended in batches of 100 and of 1000:

* engine, durability="fsync": `log.append(batch)` returns once the batch is on disk;
* engine, fsync with preallocate=True (segments pre-sized, trimmed on close);
* engine, fsync with two small headers per event (the header encoding cost);
* engine, durability="policy" with flush_ms=1000: no fsync per batch, one `log.flush()` at the
  end, inside the timing;
* reference "raw": the floor for any Python log. Each event is framed as
  struct.pack(">IIQ", len, crc32c, seq) + body, a batch is joined and written with one
  os.write, then one os.fdatasync per batch; the no-fsync variant does one fdatasync at the end,
  like the policy-mode engine;
* reference "sqlite": stdlib sqlite3, WAL, synchronous=FULL, table (id INTEGER PRIMARY KEY,
  body BLOB), one transaction per batch with executemany. The baseline to beat.

After each fsync-mode run the log is read back from the page cache: `for ev in
log.iter_events(0)` and a `log.read(offset, max_bytes=1 MiB)` paging loop; SQLite is read back
with SELECT body ORDER BY id.

Why. The engine pays for Kafka's record-batch format, indexes and its bookkeeping; the raw loop
shows what the same durability costs with none of that, and SQLite what an off-the-shelf
embedded store gives. Running all three in one process and one session puts them on the same
(noisy, 2-vCPU, virtual-disk) machine state; see /work/shared/reference/perf-baseline.md.

Reported: the median and min-max of 3 runs (runs interleaved across cases, a fresh directory
each) of events/s and MB/s (MB = 1e6 bytes of event bodies), the CPU used by this process as a
percentage of the wall time, and the cache flushes that reached the block device per batch (read
from /sys/dev/block; device-wide, so other processes' I/O can inflate it). Scratch directories
live under /var/tmp, on the same filesystem as the checkout, and are removed at the end. The
prebuilt inputs (0.8 M containers at 200,000 events) are moved out of the garbage collector's
reach (gc.freeze), so that its full passes scan what the contenders allocate, not the harness.

Usage: python bench/log_append.py [--events N] [--quick] [--repeats R] [--json PATH]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
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

import crc32c
from common import chunk, flush_stat_path, make_bodies, read_flushes

from channel_engine import LogConfig, PartitionLog, PendingEvent

BODY_SIZE = 200
BATCH_SIZES = (100, 1000)
READ_BYTES = 1 << 20
SCRATCH_ROOT = "/var/tmp"
FRAME = struct.Struct(">IIQ")
HEADERS = {"source": b"bench", "kind": b"log-append"}
SQLITE_INSERT = "INSERT INTO t (body) VALUES (?)"


# -- inputs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Inputs:
    """Prebuilt batches of one batch size, in the shape each contender takes."""

    batch: int
    events: int
    bodies: list[list[bytes]]
    pending: list[list[PendingEvent]]
    pending_headers: list[list[PendingEvent]]
    rows: list[list[tuple[bytes]]]




def make_inputs(bodies: list[bytes], batch: int) -> Inputs:
    """Build every contender's batches of `batch` events from the same bodies."""
    return Inputs(
        batch=batch,
        events=len(bodies),
        bodies=chunk(bodies, batch),
        pending=chunk([PendingEvent(b) for b in bodies], batch),
        pending_headers=chunk([PendingEvent(b, None, HEADERS) for b in bodies], batch),
        rows=chunk([(b,) for b in bodies], batch),
    )


# -- measuring ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One timed phase: wall and CPU seconds, work done, device flushes (None if unknown)."""

    seconds: float
    cpu_seconds: float
    events: int
    batches: int
    flushes: int | None




def measure(work: Callable[[], object], events: int, batches: int, directory: Path) -> Sample:
    """Run `work` once and time it (wall, CPU, device flushes)."""
    stat_path = flush_stat_path(directory)
    gc.collect()
    flushes0 = read_flushes(stat_path)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    work()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    flushes1 = read_flushes(stat_path)
    flushes = None if flushes0 is None or flushes1 is None else flushes1 - flushes0
    return Sample(wall, cpu, events, batches, flushes)


# -- the engine -----------------------------------------------------------------------------
def engine_put(log: PartitionLog, batches: list[list[PendingEvent]], flush_at_end: bool) -> None:
    """Append every batch; flush once at the end in policy mode."""
    append = log.append
    for batch in batches:
        append(batch)
    if flush_at_end:
        log.flush()


def engine_iter(log: PartitionLog, expected: int) -> None:
    """Iterate every event with iter_events(0)."""
    ev = None
    for ev in log.iter_events(0):  # noqa: B007 - the last one is checked below
        pass
    assert ev is not None and ev.offset == expected - 1, "iter_events missed events"


def engine_read_pages(log: PartitionLog, expected: int) -> None:
    """Read every event with read(offset, max_bytes=READ_BYTES) pages."""
    offset, end = 0, log.high_watermark
    while offset < end:
        events = log.read(offset, max_bytes=READ_BYTES)
        offset = events[-1].offset + 1
    assert offset == expected, "read() paging missed events"


def run_engine(directory: Path, inputs: Inputs, config: LogConfig, headers: bool = False,
               reads: bool = False) -> dict[str, Sample]:
    """Time the appends (and, if asked, the reads) of one engine configuration."""
    batches = inputs.pending_headers if headers else inputs.pending
    n, nb = inputs.events, len(batches)
    samples: dict[str, Sample] = {}
    with PartitionLog.open(directory, config) as log:
        flush_at_end = config.durability == "policy"
        samples["put"] = measure(lambda: engine_put(log, batches, flush_at_end), n, nb, directory)
        assert log.log_end_offset == n
        if reads:
            samples["iter"] = measure(lambda: engine_iter(log, n), n, nb, directory)
            samples["read"] = measure(lambda: engine_read_pages(log, n), n, nb, directory)
    return samples


# -- reference 1: the raw loop --------------------------------------------------------------
def raw_put(fd: int, batches: list[list[bytes]], sync_each: bool) -> None:
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


def run_raw(directory: Path, inputs: Inputs, sync_each: bool) -> dict[str, Sample]:
    """Time the raw loop appending to a new, growing file."""
    directory.mkdir()
    fd = os.open(directory / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        work = lambda: raw_put(fd, inputs.bodies, sync_each)  # noqa: E731
        return {"put": measure(work, inputs.events, len(inputs.bodies), directory)}
    finally:
        os.close(fd)


# -- reference 2: SQLite --------------------------------------------------------------------
def sqlite_open(path: Path) -> sqlite3.Connection:
    """Open a new database in WAL mode with synchronous=FULL (checked) and create table t."""
    conn = sqlite3.connect(path, isolation_level=None)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    conn.execute("PRAGMA synchronous=FULL")
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    if (mode, sync) != ("wal", 2):
        raise RuntimeError(f"sqlite refused WAL/FULL: journal_mode={mode}, synchronous={sync}")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
    return conn


def sqlite_put(conn: sqlite3.Connection, batches: list[list[tuple[bytes]]]) -> None:
    """One transaction per batch, inserted with executemany."""
    execute, executemany = conn.execute, conn.executemany
    for rows in batches:
        execute("BEGIN")
        executemany(SQLITE_INSERT, rows)
        execute("COMMIT")


def sqlite_read(conn: sqlite3.Connection, expected: int) -> None:
    """Iterate every body in id order."""
    count = 0
    for _ in conn.execute("SELECT body FROM t ORDER BY id"):
        count += 1
    assert count == expected, "sqlite read missed rows"


def run_sqlite(directory: Path, inputs: Inputs) -> dict[str, Sample]:
    """Time SQLite's inserts and the read back."""
    directory.mkdir()
    conn = sqlite_open(directory / "bench.db")
    n, nb = inputs.events, len(inputs.rows)
    try:
        put = measure(lambda: sqlite_put(conn, inputs.rows), n, nb, directory)
        read = measure(lambda: sqlite_read(conn, n), n, nb, directory)
    finally:
        conn.close()
    return {"put": put, "read": read}


# -- the cases ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One contender: a key for the results, a label for the table, and how to run it."""

    key: str
    label: str
    run: Callable[[Path, Inputs], dict[str, Sample]]


def make_cases(segment_bytes: int) -> list[Case]:
    """Every contender, engine first."""
    fsync = LogConfig(durability="fsync", segment_bytes=segment_bytes)
    prealloc = fsync.replace(preallocate=True)
    policy = LogConfig(durability="policy", flush_ms=1000, segment_bytes=segment_bytes)
    return [
        Case("engine_fsync", "engine fsync",
             lambda d, i: run_engine(d, i, fsync, reads=True)),
        Case("engine_fsync_prealloc", "engine fsync prealloc",
             lambda d, i: run_engine(d, i, prealloc)),
        Case("engine_fsync_headers", "engine fsync +2 headers",
             lambda d, i: run_engine(d, i, fsync, headers=True)),
        Case("engine_policy", "engine policy (1 flush)",
             lambda d, i: run_engine(d, i, policy)),
        Case("raw_fdatasync", "raw write+fdatasync", lambda d, i: run_raw(d, i, True)),
        Case("raw_write", "raw write (1 fdatasync)", lambda d, i: run_raw(d, i, False)),
        Case("sqlite", "sqlite WAL FULL", run_sqlite),
    ]


Results = dict[tuple[str, int, str], list[Sample]]


def run_all(cases: list[Case], inputs: list[Inputs], repeats: int, scratch: Path) -> Results:
    """Run every case at every batch size `repeats` times, interleaved; fresh dir each time."""
    results: Results = {}
    for rep in range(repeats):
        for inp in inputs:
            for case in cases:
                directory = scratch / f"{case.key}-b{inp.batch}-r{rep}"
                try:
                    samples = case.run(directory, inp)
                finally:
                    shutil.rmtree(directory, ignore_errors=True)
                for phase, sample in samples.items():
                    results.setdefault((case.key, inp.batch, phase), []).append(sample)
                print(".", end="", flush=True, file=sys.stderr)
    print(file=sys.stderr)
    return results


# -- summarising ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Figure:
    """Median and range of events/s over the runs of one (case, batch, phase)."""

    case: str
    batch: int
    phase: str
    events_per_s: float
    min_events_per_s: float
    max_events_per_s: float
    mb_per_s: float
    cpu_percent: float
    flushes_per_batch: float | None
    runs: list[float]


def summarise(key: tuple[str, int, str], samples: list[Sample]) -> Figure:
    """Reduce the runs of one measurement to a Figure."""
    rates = [s.events / s.seconds for s in samples]
    median = statistics.median(rates)
    cpu = statistics.median(100 * s.cpu_seconds / s.seconds for s in samples)
    flushes = [s.flushes / s.batches for s in samples if s.flushes is not None]
    return Figure(*key, median, min(rates), max(rates), median * BODY_SIZE / 1e6, cpu,
                  statistics.median(flushes) if flushes else None, rates)


def figures_by_key(results: Results) -> dict[tuple[str, int, str], Figure]:
    """Summarise every measurement."""
    return {key: summarise(key, samples) for key, samples in results.items()}


# -- printing -------------------------------------------------------------------------------
def fmt_rate(value: float) -> str:
    """Events/s with thousands separators."""
    return f"{value:,.0f}"


def table_row(label: str, fig: Figure) -> str:
    """One line of the detailed table."""
    spread = f"({fmt_rate(fig.min_events_per_s)}-{fmt_rate(fig.max_events_per_s)})"
    flushes = "-" if fig.flushes_per_batch is None else f"{fig.flushes_per_batch:.2f}"
    return (f"  {label:<28} {fig.batch:>5}  {fmt_rate(fig.events_per_s):>10} "
            f"{spread:<25} {fig.mb_per_s:>7.1f}  {fig.cpu_percent:>5.0f}  {flushes:>8}")


def print_table(title: str, rows: list[tuple[str, Figure]]) -> None:
    """Print a detailed table of labelled figures."""
    print(title)
    print(f"  {'':<28} {'batch':>5}  {'events/s':>10} {'(min-max)':<25} {'MB/s':>7}  "
          f"{'cpu%':>5}  {'fl/batch':>8}")
    for label, fig in rows:
        print(table_row(label, fig))
    print()


READ_LABELS = {
    ("engine_fsync", "iter"): "engine iter_events(0)",
    ("engine_fsync", "read"): f"engine read() {READ_BYTES >> 20} MiB pages",
    ("sqlite", "read"): "sqlite SELECT ORDER BY id",
}

SIDE_BY_SIDE = [
    ("engine_fsync", ["raw_fdatasync", "sqlite"]),
    ("engine_fsync_prealloc", ["raw_fdatasync", "sqlite"]),
    ("engine_fsync_headers", ["raw_fdatasync", "sqlite"]),
    ("engine_policy", ["raw_write"]),
]


def side_by_side_row(figs: dict[tuple[str, int, str], Figure], labels: dict[str, str],
                     engine: str, refs: list[str], batch: int) -> str:
    """`engine ... put N ev/s M MB/s | ref N ev/s | ...` for one engine mode and batch."""
    fig = figs[(engine, batch, "put")]
    parts = [f"{labels[engine]:<24} batch={batch:<5} put {fmt_rate(fig.events_per_s):>9} ev/s "
             f"{fig.mb_per_s:>6.1f} MB/s"]
    for ref in refs:
        parts.append(f"{labels[ref]} {fmt_rate(figs[(ref, batch, 'put')].events_per_s)} ev/s")
    return " | ".join(parts)


def ratio_line(figs: dict[tuple[str, int, str], Figure], batch: int) -> str:
    """Engine fsync put rate over SQLite's and over the raw loop's, and the same for reads."""
    def rate(case: str, phase: str = "put") -> float:
        return figs[(case, batch, phase)].events_per_s

    return (f"  batch={batch:<5} engine/sqlite put {rate('engine_fsync') / rate('sqlite'):.2f}x"
            f"   engine/raw put {rate('engine_fsync') / rate('raw_fdatasync'):.2f}x"
            f"   engine iter_events/sqlite read "
            f"{rate('engine_fsync', 'iter') / rate('sqlite', 'read'):.2f}x")


def print_report(figs: dict[tuple[str, int, str], Figure], cases: list[Case],
                 batches: Sequence[int]) -> None:
    """Print the put table, the read table, the side-by-side rows and the ratios."""
    labels = {case.key: case.label for case in cases}
    put_rows = [(case.label, figs[(case.key, b, "put")]) for b in batches for case in cases]
    print_table("PUT (append until durable; policy/raw-write: one flush at the end)", put_rows)
    read_rows = [(label, figs[(key, b, phase)]) for b in batches
                 for (key, phase), label in READ_LABELS.items()]
    print_table("READ (everything back, from the page cache; fl/batch per written batch)",
                read_rows)
    print("SIDE BY SIDE (medians)")
    for batch in batches:
        for engine, refs in SIDE_BY_SIDE:
            print("  " + side_by_side_row(figs, labels, engine, refs, batch))
    print()
    print("RATIOS (engine fsync, medians)")
    for batch in batches:
        print(ratio_line(figs, batch))


def print_header(args: argparse.Namespace, scratch: Path) -> None:
    """Print what ran where."""
    print(f"Weir PartitionLog append/read benchmark: {args.events:,} events of {BODY_SIZE} B, "
          f"no key, batches of {' and '.join(map(str, BATCH_SIZES))}, median of {args.repeats} "
          f"runs (min-max)")
    print(f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
          f"{os.cpu_count()} CPUs, segment_bytes={args.segment_bytes:,}, scratch {scratch}")
    print(flush=True)


# -- main -----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line: --events, --quick, --repeats, --segment-bytes, --json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per run")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 events")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement")
    parser.add_argument("--segment-bytes", type=int, default=1024**3, help="engine segment size")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.events = 20_000
    return args


def write_json(path: Path, args: argparse.Namespace,
               figs: dict[tuple[str, int, str], Figure]) -> None:
    """Write the run's settings and every figure as JSON."""
    doc = {
        "benchmark": "bench/log_append.py",
        "events": args.events, "body_bytes": BODY_SIZE, "repeats": args.repeats,
        "segment_bytes": args.segment_bytes, "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "figures": [asdict(fig) for fig in figs.values()],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Build the inputs, run every case, print the report (and the JSON)."""
    args = parse_args(argv)
    bodies = make_bodies(args.events, BODY_SIZE)
    inputs = [make_inputs(bodies, batch) for batch in BATCH_SIZES]
    gc.freeze()  # keep the ~0.8 M prebuilt input containers out of timed collections
    cases = make_cases(args.segment_bytes)
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-", dir=SCRATCH_ROOT))
    try:
        print_header(args, scratch)
        results = run_all(cases, inputs, args.repeats, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figs = figures_by_key(results)
    print_report(figs, cases, BATCH_SIZES)
    if args.json:
        write_json(args.json, args, figs)
        print(f"\nJSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: what one durable small write costs on this disk, by the way it is made durable.

What is measured. N (default 1500) writes of B bytes (default 20,997: a batch of 100
events of 200 B as the engine frames it) appended back to back to one file that is kept
zero-filled 1 MiB ahead (the engine's fsync durability: each write overwrites blocks
already written, segment_file.py), each made durable before the next. Reported per
variant: the median and mean time of the whole write+sync step (us) and of its sync call
alone where there is one, median of R rounds (default 3), variants interleaved per round:

  * fdatasync: pwrite, then fdatasync (the engine's way);
  * RWF_DSYNC: one pwritev(..., os.RWF_DSYNC) (write and sync of just those pages);
  * O_DSYNC: pwrite on a descriptor opened with O_DSYNC;
  * stat+fdatasync: os.stat of the file's path before each pwrite (what the engine's
    per-append identity check did until the statx in log/file_identity.py): on Linux
    6.13+ a reported mtime marks it queried and the next write gets a fine-grained
    timestamp, so every write dirties the inode;
  * statx+fdatasync: the same check through file_identity.path_identity (no timestamp
    asked for).

The limit, in the same interleaved rounds: "sqlite WAL FULL", N transactions of
channel_throughput.py's SQLite put (WAL, synchronous=FULL, BEGIN IMMEDIATE, executemany
INSERT of a batch of --batch bodies of B/--batch bytes, COMMIT) into a fresh database.
Issue 18 wants a fsync'd put at >= 1.5x its rate, so the whole put (engine work and all)
must take at most its median / 1.5: that budget is printed under the variants, next to
what the sync alone takes.

The device's cache flushes per write (from /sys/dev/block) are printed too: every variant
needs one (this virtual disk has a write-back cache and no FUA). So is the kernel release:
the stat-vs-statx difference exists only with multigrain timestamps (Linux 6.13+).

Numbers are noisy on this shared VM: compare rows within one run.

Usage: python bench/fsync_cost.py [--writes N] [--bytes B] [--batch K] [--rounds R] [--dir DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from channel_throughput import SqliteStore, sqlite_create
from common import flush_stat_path, make_bodies, read_flushes

from channel_engine.log.file_identity import path_identity

ZERO_AHEAD = 1 << 20
PAGE = 4096

Step = Callable[[int, bytes, int, Path], float]  # (fd, data, position, path) -> sync seconds


def sync_after(fd: int, data: bytes, position: int, path: Path) -> float:
    """pwrite, then fdatasync; the seconds the fdatasync took."""
    os.pwrite(fd, data, position)
    start = time.perf_counter()
    os.fdatasync(fd)
    return time.perf_counter() - start


def rwf_dsync(fd: int, data: bytes, position: int, path: Path) -> float:
    """One pwritev with RWF_DSYNC; the seconds it took."""
    start = time.perf_counter()
    os.pwritev(fd, [data], position, os.RWF_DSYNC)
    return time.perf_counter() - start


def o_dsync(fd: int, data: bytes, position: int, path: Path) -> float:
    """pwrite on an O_DSYNC descriptor; the seconds it took."""
    start = time.perf_counter()
    os.pwrite(fd, data, position)
    return time.perf_counter() - start


def checked(check: Callable[[str], object]) -> Step:
    """sync_after with `check` of the file's path before each write."""
    def step(fd: int, data: bytes, position: int, path: Path) -> float:
        check(str(path))
        return sync_after(fd, data, position, path)
    return step


VARIANTS: dict[str, tuple[Step, int]] = {
    "fdatasync": (sync_after, 0),
    "RWF_DSYNC": (rwf_dsync, 0),
    "O_DSYNC": (o_dsync, os.O_DSYNC),
    "stat+fdatasync": (checked(os.stat), 0),
    "statx+fdatasync": (checked(path_identity), 0),
}
SQLITE = "sqlite WAL FULL"


def run(directory: Path, step: Step, flags: int, writes: int,
        size: int) -> tuple[list[float], list[float], int | None]:
    """Every write's whole step and sync times (us), and the device flushes."""
    path = directory / "log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
    data = os.urandom(size)
    whole, syncs = [], []
    stat_path = flush_stat_path(directory)
    flushes0 = read_flushes(stat_path)
    zeroed = position = 0
    try:
        for _ in range(writes):
            end = position + size
            if end + ZERO_AHEAD // 2 > zeroed:  # as segment_file.zero_fill_ahead
                target = -(-(end + ZERO_AHEAD) // PAGE) * PAGE
                os.pwrite(fd, bytes(target - max(zeroed, end)), max(zeroed, end))
                zeroed = target
            start = time.perf_counter()
            syncs.append(step(fd, data, position, path) * 1e6)
            whole.append((time.perf_counter() - start) * 1e6)
            position = end
    finally:
        os.close(fd)
        path.unlink()
    flushes1 = read_flushes(stat_path)
    flushes = None if flushes0 is None or flushes1 is None else flushes1 - flushes0
    return whole, syncs, flushes


def run_sqlite(directory: Path, transactions: int, size: int,
               batch: int) -> tuple[list[float], int | None]:
    """Every SQLite FULL put transaction's time (us) into a fresh database, and the flushes."""
    path = directory / "reference.db"
    sqlite_create(path)
    store = SqliteStore(path, "FULL")
    rows = [(body,) for body in make_bodies(batch, size // batch)]
    times = []
    stat_path = flush_stat_path(directory)
    flushes0 = read_flushes(stat_path)
    try:
        for _ in range(transactions):
            start = time.perf_counter()
            store.put(rows)
            times.append((time.perf_counter() - start) * 1e6)
    finally:
        store.close()
        for leftover in directory.glob("reference.db*"):
            leftover.unlink()
    flushes1 = read_flushes(stat_path)
    flushes = None if flushes0 is None or flushes1 is None else flushes1 - flushes0
    return times, flushes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=1500, help="durable writes per run")
    parser.add_argument("--bytes", type=int, default=20_997, help="bytes per write")
    parser.add_argument("--batch", type=int, default=100,
                        help="rows per SQLite transaction (the bytes split among them)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per variant")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="scratch parent")
    return parser.parse_args(argv)


def print_row(name: str, runs: list[tuple[float, float, float | None, int | None]],
              writes: int) -> None:
    """One variant's medians over its rounds."""
    flushes = [f for *_, f in runs if f is not None]
    per_write = f"{statistics.median(flushes) / writes:.2f}" if flushes else "-"
    syncs = [r[2] for r in runs if r[2] is not None]
    sync = f"{statistics.median(syncs):.0f}" if syncs else "-"
    print(f"  {name:<17} {statistics.median(r[0] for r in runs):>14.0f} "
          f"{statistics.median(r[1] for r in runs):>12.0f} {sync:>14} {per_write:>13}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run every variant and the SQLite limit R times, interleaved, and print the medians."""
    args = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="weir-fsync-", dir=args.dir))
    results: dict[str, list[tuple[float, float, float | None, int | None]]] = {
        name: [] for name in [*VARIANTS, SQLITE]}
    print(f"{args.writes} durable writes of {args.bytes} B over zero-filled blocks, "
          f"{args.rounds} rounds, kernel {os.uname().release}, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    try:
        for _ in range(args.rounds):
            for name, (step, flags) in VARIANTS.items():
                whole, syncs, flushes = run(scratch, step, flags, args.writes, args.bytes)
                results[name].append((statistics.median(whole), statistics.mean(whole),
                                      statistics.median(syncs), flushes))
            times, flushes = run_sqlite(scratch, args.writes, args.bytes, args.batch)
            results[SQLITE].append((statistics.median(times), statistics.mean(times), None,
                                    flushes))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"  {'variant':<17} {'step median us':>14} {'step mean us':>12} "
          f"{'sync median us':>14} {'flushes/write':>13}")
    for name, runs in results.items():
        print_row(name, runs, args.writes)
    limit = statistics.median(r[0] for r in results[SQLITE])
    print(f"  budget: a whole fsync'd put of {args.batch} "
          f"<= {limit / 1.5:.0f} us ({SQLITE} median / 1.5, issue 18)")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0

if __name__ == "__main__":
    sys.exit(main())

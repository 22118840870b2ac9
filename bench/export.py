"""Benchmark: the exactly-once export of a channel to Parquet, next to Spark writing the
same rows from memory to Parquet in the same session (the ceiling this machine gives).

    .venv/bin/python bench/export.py [--events 1000000] [--body 200] [--partitions 3]
                                     [--warmup EVENTS] [--rounds 1]

The export is the whole protocol (recover, take, read the segments with the "weir"
source, write, commit record, moves, take commit); the baseline writes the same rows,
already cached in Spark's memory, with the same partitioning columns and the session's
Parquet codec (the same for both sides). Target: the export at >= 50% of the baseline's
rate.

Both sides are timed the same way: after the session started (its start-up is printed,
and is in neither figure) and after a warm-up round of both on another channel (as large
as the timed ones unless --warmup says otherwise), so neither pays for the JVM's first
jobs (class loading, JIT: 10-15 s and 15-20 CPU s on 2 CPUs) or the first start of Spark's
Python workers. A fresh export process does pay those, and the baseline in the warm-up
round already runs warm, so the warm-up round's figures are printed too, not as the
target. Each timed export still pays its own per-run costs (planning the "weir" source,
the protocol's file moves). Every channel is filled before Spark starts, so filling
competes with neither side. CPU seconds (this process, the JVM and its Python workers)
are printed next to wall time: on a shared machine they vary less.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import chunk, make_bodies  # noqa: E402

from channel_engine import Channel, ChannelConfig, PendingEvent  # noqa: E402
from channel_engine.spark.export import (  # noqa: E402
    PIECE_ROWS,
    Exporter,
    ExportSettings,
    spark_session,
)


def fill(root: Path, name: str, events: int, body: int, partitions: int) -> ChannelConfig:
    config = ChannelConfig(name, (str(root / name / "data"),), str(root / name / "home"),
                           partitions=partitions, minimum_required_space=0,
                           capacity=10**9, transaction_capacity=10_000)
    with Channel.open(config) as channel:
        for batch in chunk(make_bodies(events, body), 4000):
            with channel.put() as tx:
                tx.put_all([PendingEvent(b) for b in batch])
    return config


class Clock:
    """Wall seconds and the CPU seconds this process, the JVM and its Python workers
    spend (other load on the machine stretches the first, hardly the second)."""

    def __init__(self, spark: Any) -> None:
        self.jvm = spark.sparkContext._gateway.proc.pid

    def cpu(self) -> float:
        mine = os.times()
        return mine.user + mine.system + self._tree(self.jvm)

    def _tree(self, root: int) -> float:
        """utime + stime of root and its descendants (dead ones are in cutime, cstime)."""
        parents: dict[int, list[int]] = {}
        ticks: dict[int, int] = {}
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # not a process, or gone
            parents.setdefault(int(fields[1]), []).append(int(entry))
            ticks[int(entry)] = sum(int(f) for f in fields[11:15])
        total, todo = 0, [root]
        while todo:
            pid = todo.pop()
            total += ticks.get(pid, 0)
            todo += parents.get(pid, [])
        return total / os.sysconf("SC_CLK_TCK")

    def start(self) -> tuple[float, float]:
        return time.perf_counter(), self.cpu()

    def stop(self, started: tuple[float, float]) -> tuple[float, float]:
        return time.perf_counter() - started[0], self.cpu() - started[1]


def export(spark: Any, clock: Clock, config: ChannelConfig, output: Path,
           events: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one export run of the whole channel."""
    started = clock.start()
    report = Exporter(spark, ExportSettings(str(config.home), output.as_uri(),
                                            max_events=events),
                      progress=lambda line: None).run()
    spent = clock.stop(started)
    assert report["rows"] == events, json.dumps(report)[:500]
    return spent


def from_memory(spark: Any, clock: Clock, exported: Path, target: Path,
                events: int) -> tuple[float, float]:
    """(wall, CPU) seconds for Spark to write the exported rows, cached in memory first
    (not timed), as Parquet files laid out as the export lays them out: one file per
    (partition, piece, hour). The rows are grouped that way before they are cached, so
    the timed write has no shuffle, as the export has none."""
    from pyspark.sql import functions as F

    cached = (spark.read.option("recursiveFileLookup", "true").parquet(str(exported))
              .withColumn("_p", F.col("partition"))
              .withColumn("_chunk", F.col("offset") - F.col("offset") % PIECE_ROWS)
              .withColumn("_bucket", F.date_format(F.timestamp_millis("timestamp"),
                                                   "yyyy/MM/dd/HH"))
              .repartition("_p", "_chunk", "_bucket")
              .cache())
    assert cached.count() == events
    started = clock.start()
    cached.write.partitionBy("_p", "_chunk", "_bucket").parquet(str(target))
    spent = clock.stop(started)
    cached.unpersist()
    return spent


def rate(name: str, events: int, body: int, spent: tuple[float, float]) -> str:
    seconds, cpu = spent
    return (f"  {name:<44} {events / seconds:>10,.0f} events/s "
            f"{events * body / 1e6 / seconds:>7.1f} MB/s  ({seconds:.1f} s, "
            f"{cpu:.1f} CPU s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=None,
                        help="events of the warm-up round (default: --events)")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds in one session")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="weir-exportbench-", dir="/var/tmp"))
    try:
        sizes = {"warmup": args.warmup or args.events,
                 **{f"bench{i + 1}": args.events for i in range(args.rounds)}}
        configs = {name: fill(root, name, events, args.body, args.partitions)
                   for name, events in sizes.items()}
        started = time.perf_counter()
        spark = spark_session("local[*]")
        spark.sparkContext.setLogLevel("ERROR")
        session_s = time.perf_counter() - started
        codec = spark.conf.get("spark.sql.parquet.compression.codec")
        clock = Clock(spark)
        print(f"{args.events:,} events of {args.body} B, {args.partitions} partitions, "
              f"Parquet ({codec}, both sides), local[*] on {os.cpu_count()} CPUs; "
              f"session start {session_s:.1f} s (in neither figure)")
        results = []
        for name, events in sizes.items():
            export_s = export(spark, clock, configs[name], root / "out", events)
            baseline_s = from_memory(spark, clock, root / "out" / name,
                                     root / f"baseline-{name}", events)
            results.append((name, events, export_s, baseline_s))
        spark.stop()
        for name, events, export_s, baseline_s in results:
            if name == "warmup":
                print(f"warm-up round: the first jobs of this JVM, {events:,} events "
                      "(not the target):")
            else:
                print(f"timed round {name.removeprefix('bench')}:")
            print(rate("weir export (exactly-once, from segments)", events, args.body,
                       export_s))
            print(rate("spark alone: same rows from memory", events, args.body, baseline_s))
            print(f"  export / Spark's own rate: {baseline_s[0] / export_s[0]:.0%}"
                  + ("" if name == "warmup" else " (target >= 50%)")
                  + f"; by CPU seconds: {baseline_s[1] / export_s[1]:.0%}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

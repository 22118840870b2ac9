"""Benchmark: the exactly-once export of a channel, next to Spark writing the same rows
in the same format to the same filesystem in the same session (the limit this machine
and that filesystem give).

    .venv/bin/python bench/export.py [--events 1000000] [--body 200] [--partitions 3]
                                     [--warmup EVENTS] [--rounds 1]
                                     [--format parquet|json|avro] [--output URI]

--output is where every side writes (a fresh directory under it, deleted at the end):
file:// under /var/tmp by default, or hdfs://host:port/dir (e.g. a `scripts/hdfs.sh
start` cluster; its JVM's CPU is in no CPU figure). Each round prints three figures:

  weir export           the whole protocol (recover, take, read the segments with the
                        "weir" source, write, commit record, moves, take commit);
  spark: channel, no protocol
                        the same DataFrame the export writes (the channel's ranges read
                        by the "weir" source) written with the same writer and options,
                        straight to a fresh directory: no take, record or moves;
  spark alone: from memory
                        those rows cached in Spark's memory first (not timed), then
                        written so: the write alone. Target (issue 18): the export at
                        >= 0.9x its rate.

Every side writes through the exporter's own write path (exporter.write_files: the
format's writer in the export's schema version, the same partitioning columns, one file
per piece and hour, the same session settings: open files per task, Parquet's timestamp
type; the session's Parquet codec; Avro is Spark's own Avro writer with Weir's schema,
deflate), never a copy of it. Both baselines run before the export of a round, which
then takes the events.

Every side is timed the same way: after the session started (its start-up is printed,
and is in no figure) and after a warm-up round of all on another channel (as large as
the timed ones unless --warmup says otherwise), so none pays for the JVM's first jobs
(class loading, JIT: 10-15 s and 15-20 CPU s on 2 CPUs) or the first start of Spark's
Python workers. A fresh export process does pay those, so the warm-up round's figures
are printed too, not as the target. Each timed export still pays its own per-run costs
(planning the "weir" source, the protocol's file moves). Every channel is filled before
Spark starts, so filling competes with no side. CPU seconds (this process, the JVM and
its Python workers) are printed next to wall time: on a shared machine they vary less.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import chunk, make_bodies  # noqa: E402

from channel_engine import Channel, ChannelConfig, PendingEvent  # noqa: E402
from channel_engine.spark.dfs import Dfs  # noqa: E402
from channel_engine.spark.export import spark_session  # noqa: E402
from channel_engine.spark.export_settings import ExportSettings  # noqa: E402
from channel_engine.spark.exporter import Exporter, write_files  # noqa: E402
from channel_engine.spark.file_formats import FORMATS, LATEST_SCHEMA  # noqa: E402
from channel_engine.spark.output_layout import Pieces, piece_rows  # noqa: E402


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


def export(spark: Any, clock: Clock, config: ChannelConfig, output: str, file_format: str,
           events: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one export run of the whole channel."""
    started = clock.start()
    report = Exporter(spark, ExportSettings(str(config.home), output, file_format,
                                            max_events=events),
                      progress=lambda line: None).run()
    spent = clock.stop(started)
    assert report["rows"] == events, json.dumps(report)[:500]
    return spent


def channel_frame(spark: Any, config: ChannelConfig, output: str,
                  file_format: str) -> tuple[Any, ExportSettings]:
    """The DataFrame an export of the whole channel writes (without taking anything), and
    the settings it is written with."""
    settings = ExportSettings(str(config.home), output, file_format,
                              schema_version=LATEST_SCHEMA)
    exporter = Exporter(spark, settings, progress=lambda line: None)
    with Channel.open(config.home) as channel:
        status = channel.status()
    pieces = Pieces(piece_rows(settings, status),
                    [(p["partition"], (p["log_start_offset"], p["log_end_offset"]))
                     for p in status["partitions"]])
    return exporter.frame(pieces), settings


def from_channel(spark: Any, clock: Clock, frame: Any, settings: ExportSettings,
                 target: str, events: int) -> tuple[float, float]:
    """(wall, CPU) seconds for Spark to read the channel's rows and write them as the
    export does, with no protocol around it."""
    started = clock.start()
    write_files(spark, frame, settings, LATEST_SCHEMA, target)
    spent = clock.stop(started)
    assert spark.read.format(FORMATS[settings.format]).load(target).count() == events
    return spent


def from_memory(spark: Any, clock: Clock, frame: Any, settings: ExportSettings,
                target: str, events: int) -> tuple[float, float]:
    """(wall, CPU) seconds for Spark to write the channel's rows, cached in memory first
    (not timed), as the export lays them out: one file per (partition, piece, hour). The
    cache keeps the frame's partitions (one a piece), so the write has no shuffle, as
    the export has none."""
    cached = frame.cache()
    assert cached.count() == events
    started = clock.start()
    write_files(spark, cached, settings, LATEST_SCHEMA, target)
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
    parser.add_argument("--format", default="parquet", choices=sorted(FORMATS))
    parser.add_argument("--output", default=None,
                        help="base URI every side writes under (default: file:// in a "
                             "temp dir), e.g. hdfs://127.0.0.1:PORT/bench")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="weir-exportbench-", dir="/var/tmp"))
    spark = None
    try:
        sizes = {"warmup": args.warmup or args.events,
                 **{f"bench{i + 1}": args.events for i in range(args.rounds)}}
        configs = {name: fill(root, name, events, args.body, args.partitions)
                   for name, events in sizes.items()}
        started = time.perf_counter()
        spark = spark_session("local[*]")
        spark.sparkContext.setLogLevel("ERROR")
        session_s = time.perf_counter() - started
        base = ((args.output.rstrip("/") + f"/weir-bench-{uuid.uuid4().hex[:8]}")
                if args.output else (root / "out").as_uri())
        dfs = Dfs(spark, base)
        what = {"parquet": f"Parquet ({spark.conf.get('spark.sql.parquet.compression.codec')})",
                "avro": "Avro (Spark's writer, deflate)", "json": "JSON lines"}
        clock = Clock(spark)
        print(f"{args.events:,} events of {args.body} B, {args.partitions} partitions, "
              f"{what[args.format]} on every side, to {base}; local[*] on "
              f"{os.cpu_count()} CPUs; session start {session_s:.1f} s (in no figure)")
        results = []
        for name, events in sizes.items():
            frame, settings = channel_frame(spark, configs[name], base, args.format)
            memory_s = from_memory(spark, clock, frame, settings,
                                   dfs.join(f"memory-{name}"), events)
            channel_s = from_channel(spark, clock, frame, settings,
                                     dfs.join(f"channel-{name}"), events)
            export_s = export(spark, clock, configs[name], base, args.format, events)
            results.append((name, events, export_s, channel_s, memory_s))
        for name, events, export_s, channel_s, memory_s in results:
            if name == "warmup":
                print(f"warm-up round: the first jobs of this JVM, {events:,} events "
                      "(not the target):")
            else:
                print(f"timed round {name.removeprefix('bench')}:")
            print(rate("weir export (exactly-once, from segments)", events, args.body,
                       export_s))
            print(rate("spark: same DataFrame, no protocol", events, args.body, channel_s))
            print(rate("spark alone: same rows from memory", events, args.body, memory_s))
            print(f"  export / Spark's own rate from memory: {memory_s[0] / export_s[0]:.2f}x"
                  + ("" if name == "warmup" else " (target >= 0.9x)")
                  + f"; by CPU seconds: {memory_s[1] / export_s[1]:.2f}x; "
                  f"the export takes {export_s[0] / channel_s[0]:.2f}x the no-protocol time")
        if args.output:
            dfs.delete(base, recursive=True)
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

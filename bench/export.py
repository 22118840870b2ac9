"""Benchmark: the exactly-once export of a channel to Parquet, next to Spark writing the
same rows from memory to Parquet in the same session (the ceiling this machine gives).

    .venv/bin/python bench/export.py [--events 1000000] [--body 200] [--partitions 3]

The export is the whole protocol (recover, take, read the segments with the "weir"
source, write, commit record, moves, take commit); the baseline writes the same rows,
already cached in Spark's memory, with the same partitioning columns. Target: the
export at >= 50% of the baseline's rate.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import chunk, make_bodies  # noqa: E402

from channel_engine import Channel, ChannelConfig, PendingEvent  # noqa: E402
from channel_engine.spark.export import Exporter, ExportSettings, spark_session  # noqa: E402


def fill(config: ChannelConfig, events: int, body: int) -> None:
    with Channel.open(config) as channel:
        for batch in chunk(make_bodies(events, body), 4000):
            with channel.put() as tx:
                tx.put_all([PendingEvent(b) for b in batch])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="weir-exportbench-", dir="/var/tmp"))
    try:
        config = ChannelConfig("bench", [str(root / "data")], str(root / "home"),
                               partitions=args.partitions, minimum_required_space=0,
                               capacity=10**9, transaction_capacity=10_000)
        fill(config, args.events, args.body)
        spark = spark_session("local[*]")
        spark.sparkContext.setLogLevel("ERROR")
        megabytes = args.events * args.body / 1e6
        started = time.perf_counter()
        report = Exporter(spark, ExportSettings(str(config.home), (root / "out").as_uri(),
                                                max_events=args.events),
                          progress=lambda line: None).run()
        export_s = time.perf_counter() - started
        assert report["rows"] == args.events, json.dumps(report)[:500]

        from pyspark.sql import functions as F

        cached = (spark.read.option("recursiveFileLookup", "true")
                  .parquet(str(root / "out" / "bench"))
                  .withColumn("_p", F.col("partition"))
                  .withColumn("_chunk", F.col("offset") - F.col("offset") % 1_000_000)
                  .withColumn("_bucket", F.date_format(F.timestamp_millis("timestamp"),
                                                       "yyyy/MM/dd/HH"))
                  .cache())
        assert cached.count() == args.events
        started = time.perf_counter()
        (cached.repartition("_p", "_chunk", "_bucket").write
         .partitionBy("_p", "_chunk", "_bucket").parquet(str(root / "baseline")))
        baseline_s = time.perf_counter() - started
        spark.stop()
        print(f"{args.events:,} events of {args.body} B, {args.partitions} partitions, "
              "Parquet, local[*]")
        for name, seconds in (("weir export (exactly-once, from segments)", export_s),
                              ("spark alone: same rows from memory", baseline_s)):
            print(f"  {name:<44} {args.events / seconds:>10,.0f} events/s "
                  f"{megabytes / seconds:>7.1f} MB/s  ({seconds:.1f} s)")
        print(f"target: export >= 50% of Spark's own rate: {baseline_s / export_s:.0%}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

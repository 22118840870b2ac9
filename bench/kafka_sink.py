"""The Kafka sink's throughput next to Kafka's own producer, on the same broker, same run.

    .venv/bin/python bench/kafka_sink.py [--events 500000] [--size 200] [--partitions 2]
                                         [--repeats 3] [--quick] [--json PATH]

It starts a broker of its own (scripts/kafka.sh, KRaft, one node, data in a temp dir)
and, for each repeat:

* (a) the sink: a channel (fsync durability, `--partitions`) is filled with N events of
  `--size` random bytes with a key, in put transactions of 1000 (not timed), then one run
  of the sink's job (`python -m channel_engine.kafka_sink`, defaults: transactions of up to
  100,000 events, batches of 512 KiB, no compression) forwards them into a fresh topic of
  as many partitions, exactly once. Timed: the job's whole run, from process start to
  exit (Python's start, the producer's InitProducerId, the offsets record read, every
  take and Kafka transaction), and the sink's own duration from its report;
* (b) Kafka's own producer: `kafka-producer-perf-test` (org.apache.kafka.tools.
  ProducerPerformance, the pinned Kafka's) sends N records of `--size` bytes into a fresh
  topic of as many partitions with acks=all, as fast as it can: once with the producer's
  defaults (batch.size 16 KiB, linger.ms 5), once with the sink's batch size
  (batch.size 524288). Its own records/s figure is taken (it excludes the JVM's start).

Figures: events/s and MB/s of values for each, and the sink's share of Kafka's producer
(the issue's target: at least 0.5x). Medians of the repeats, min-max beside.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import make_bodies  # noqa: E402

from channel_engine import Channel, ChannelConfig  # noqa: E402


def start_broker(state: Path) -> tuple[str, dict[str, str]]:
    env = {**os.environ, "WEIR_KAFKA_DIR": str(state)}
    out = subprocess.run([str(ROOT / "scripts" / "kafka.sh"), "start"], env=env, text=True,
                         capture_output=True, check=True)
    return out.stdout.strip().splitlines()[-1], env


def create_topic(bootstrap: str, partitions: int) -> str:
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    name = f"bench-{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            await admin.close()
    asyncio.run(create())
    return name


def fill_channel(home: Path, events: int, size: int, partitions: int) -> ChannelConfig:
    config = ChannelConfig(name="bench", checkpoint_dir=str(home),
                           data_dirs=[str(home / "data")], partitions=partitions,
                           transaction_capacity=1000)
    bodies = make_bodies(min(events, 10_000), size)
    with Channel.open(config) as channel:
        for start in range(0, events, 1000):
            with channel.put() as tx:
                for i in range(start, min(events, start + 1000)):
                    tx.put(bodies[i % len(bodies)], key=b"key-%d" % (i % 1000))
        channel.add_subscription("kafka", "earliest")
    return config


def run_sink(config: ChannelConfig, bootstrap: str, topic: str) -> dict[str, Any]:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "channel_engine.kafka_sink", "--home",
                          config.checkpoint_dir, "--bootstrap", bootstrap, "--topic", topic,
                          "--max-run-s", "3600"], cwd=ROOT, text=True,
                         capture_output=True, check=False)
    wall = time.monotonic() - started
    report = next((json.loads(line)["report"] for line in out.stdout.splitlines()
                   if line.startswith('{"report"')), None)
    if out.returncode != 0 or not report:
        raise SystemExit(f"the sink failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return {"wall_s": wall, "sink_s": report["duration_s"], "events": report["events"],
            "transactions": report["transactions"]}


def producer_perf(bootstrap: str, topic: str, events: int, size: int,
                  extra: list[str]) -> float:
    lib = subprocess.run([sys.executable, str(ROOT / "scripts" / "jvm_deps.py"), "kafka-tools"],
                         text=True, capture_output=True, check=True).stdout.strip()
    out = subprocess.run(["java", "-Xmx1g", f"-Dlog4j.configuration=file:{ROOT}/scripts/jvm/"
                          "kafka-tools/log4j.properties", "-cp", f"{lib}/*",
                          "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
                          "--num-records", str(events), "--record-size", str(size),
                          "--throughput", "-1", "--producer-props",
                          f"bootstrap.servers={bootstrap}", "acks=all", *extra],
                         text=True, capture_output=True, check=True)
    last = [line for line in out.stdout.splitlines() if "records sent" in line][-1]
    return float(re.search(r"([\d.]+) records/sec", last).group(1))  # type: ignore[union-attr]


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> None:
    """Run the cases, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20,000 events, one repeat")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.events, args.repeats = 20_000, 1
    figures: dict[str, list[float]] = {"sink_wall": [], "sink_own": [], "perf_default": [],
                                       "perf_512k": []}
    with tempfile.TemporaryDirectory(prefix="weir-bench-kafka-") as tmp:
        bootstrap, env = start_broker(Path(tmp) / "kafka")
        try:
            for repeat in range(args.repeats):
                config = fill_channel(Path(tmp) / f"channel-{repeat}", args.events, args.size,
                                      args.partitions)
                sink = run_sink(config, bootstrap, create_topic(bootstrap, args.partitions))
                assert sink["events"] == args.events, sink
                figures["sink_wall"].append(args.events / sink["wall_s"])
                figures["sink_own"].append(args.events / sink["sink_s"])
                figures["perf_default"].append(producer_perf(
                    bootstrap, create_topic(bootstrap, args.partitions), args.events, args.size,
                    []))
                figures["perf_512k"].append(producer_perf(
                    bootstrap, create_topic(bootstrap, args.partitions), args.events, args.size,
                    ["batch.size=524288"]))
                print(f"repeat {repeat + 1}: " + ", ".join(
                    f"{k} {v[-1]:,.0f} ev/s" for k, v in figures.items()), flush=True)
        finally:
            subprocess.run([str(ROOT / "scripts" / "kafka.sh"), "stop"], env=env,
                           capture_output=True, check=False)
    mb = args.size / 1e6
    print(f"\n{args.events:,} events of {args.size} B, {args.partitions} partitions, "
          f"acks=all, medians of {args.repeats} (min-max)")
    print(f"{'case':<58} {'events/s':>28} {'MB/s':>8}")
    for label, key in (("(a) Weir's Kafka sink, whole job (process start to exit)", "sink_wall"),
                       ("(a) Weir's Kafka sink, its run (report's duration)", "sink_own"),
                       ("(b) kafka-producer-perf-test, producer defaults", "perf_default"),
                       ("(b) kafka-producer-perf-test, batch.size=524288", "perf_512k")):
        values = figures[key]
        print(f"{label:<58} {summary(values):>28} {statistics.median(values) * mb:>8.1f}")
    best = max(statistics.median(figures["perf_default"]), statistics.median(figures["perf_512k"]))
    print(f"\nsink (whole job) / Kafka's producer (its better setting): "
          f"{statistics.median(figures['sink_wall']) / best:.2f}x (target >= 0.5x)")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "figures": figures}, indent=1))


if __name__ == "__main__":
    main()

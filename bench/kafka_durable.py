"""Weir's durable put next to Kafka's producer into a topic that fsyncs every append
(`flush.messages=1`), same record size and batch, same run (issue 18).

    .venv/bin/python bench/kafka_durable.py [--events 300000] [--size 200] [--partitions 3]
                                            [--rounds 3]

Kafka acknowledges acks=all once the leader and in-sync replicas have the batch in their
page cache; its durability on power loss comes from replication, not fsync. The closest
single-node equivalent of Weir's fsync durability is a topic with `flush.messages=1`: the
broker fsyncs the partition's log after each append (one produce batch), before it
answers. Contenders, taking turns for --rounds rounds, for each batch size B (1000, 100):
  * weir: one process, a channel of --partitions partitions (fsync durability, the
    default), `with channel.put() as tx: tx.put_all(batch)` of B events of --size random
    bytes, keyless (round-robin over partitions per transaction, as Kafka's sticky
    partitioner does per batch);
  * kafka: `kafka-producer-perf-test` (the pinned Kafka's ProducerPerformance, its own
    records/s, which leaves out the JVM's start) into a fresh topic of as many partitions
    with flush.messages=1, acks=all, batch.size = B records' bytes, linger.ms 5; one
    broker (scripts/kafka.sh, KRaft, data in a temp dir on the same disk);
  * limit: a raw loop writing B events' bytes and calling fdatasync, on the same disk.
Each contender's median round is shown with every round, and weir / kafka.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import make_bodies  # noqa: E402
from kafka_sink import producer_perf, start_broker, summary  # noqa: E402

from channel_engine import Channel, ChannelConfig, PendingEvent  # noqa: E402


def flushing_topic(bootstrap: str, partitions: int) -> str:
    """A fresh topic whose broker fsyncs after every append."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    name = f"durable-{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1,
                                                topic_configs={"flush.messages": "1"})])
        finally:
            await admin.close()
    asyncio.run(create())
    return name


def weir_put(home: Path, events: int, size: int, batch: int, partitions: int) -> float:
    """Events/s of fsync-durable put transactions of `batch` events."""
    config = ChannelConfig("bench", [str(home / "data")], str(home), partitions=partitions,
                           minimum_required_space=0, capacity=10**9,
                           transaction_capacity=batch)
    bodies = [PendingEvent(body) for body in make_bodies(batch, size)]
    with Channel.open(config) as channel:
        started = time.perf_counter()
        for _ in range(events // batch):
            with channel.put() as tx:
                tx.put_all(bodies)
        elapsed = time.perf_counter() - started
    shutil.rmtree(home)
    return events // batch * batch / elapsed


def raw_fdatasync(path: Path, events: int, size: int, batch: int) -> float:
    """Events/s of a loop appending `batch` events' bytes and calling fdatasync each time."""
    block = os.urandom(batch * size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        started = time.perf_counter()
        for _ in range(events // batch):
            os.write(fd, block)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    return events // batch * batch / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="weir-kafkadurable-", dir="/var/tmp"))
    bootstrap, env = start_broker(root / "kafka")
    try:
        print(f"{args.events:,} events of {args.size} B, {args.partitions} partitions, "
              f"{args.rounds} rounds (median, min-max), {os.cpu_count()} CPUs")
        for batch in (1000, 100):
            weir, kafka, raw = [], [], []
            for index in range(args.rounds):
                weir.append(weir_put(root / f"weir-{batch}-{index}", args.events, args.size,
                                     batch, args.partitions))
                topic = flushing_topic(bootstrap, args.partitions)
                kafka.append(producer_perf(bootstrap, topic, args.events, args.size,
                                           [f"batch.size={batch * args.size}",
                                            "linger.ms=5"]))
                raw.append(raw_fdatasync(root / "raw", args.events, args.size, batch))
            print(f"batch {batch}:")
            print(f"  weir durable put (fsync)            {summary(weir)} events/s")
            print(f"  kafka acks=all, flush.messages=1    {summary(kafka)} events/s")
            print(f"  limit: raw write + fdatasync        {summary(raw)} events/s")
            ratio = sorted(weir)[len(weir) // 2] / sorted(kafka)[len(kafka) // 2]
            print(f"  weir / kafka: {ratio:.2f}x (target >= 1x)")
    finally:
        subprocess.run([str(ROOT / "scripts" / "kafka.sh"), "stop"], env=env,
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""What the Kafka sink's tests share: a channel filled with numbered events, the sink's job
run as a process of its own (so that it can be killed), and a topic read back the way a
consumer downstream reads it (read_committed)."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from channel_engine import Channel, ChannelConfig

ROOT = Path(__file__).resolve().parents[2]
BASE_TS = 1_700_000_000_000
T = TypeVar("T")


def run_async(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end on an event loop of its own, in a thread of its own: a
    test process may already run a loop (Playwright's sync API leaves one in the main
    thread of a worker that ran a browser test), where asyncio.run() refuses."""
    async def main() -> T:
        return await make()
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


def new_channel(tmp_path: Path, partitions: int = 2, name: str = "orders") -> ChannelConfig:
    """A channel in tmp_path (fsync durability, the default)."""
    home = tmp_path / name
    return ChannelConfig(name=name, checkpoint_dir=str(home), data_dirs=[str(home / "data")],
                         partitions=partitions)


def event_fields(i: int) -> dict[str, Any]:
    """Event number i: its key (one of 7), headers (two, in order), timestamp and body."""
    return {"body": f"event-{i}".encode(), "key": f"k{i % 7}".encode(),
            "headers": {"i": str(i).encode(), "z-last": b"\x00\xff"},
            "timestamp": BASE_TS + i}


def put_events(config: ChannelConfig, start: int, count: int, batch: int = 100) -> None:
    """Put events start .. start+count-1, `batch` per transaction."""
    with Channel.open(config) as channel:
        for first in range(start, start + count, batch):
            with channel.put() as tx:
                for i in range(first, min(start + count, first + batch)):
                    tx.put(**event_fields(i))


def channel_partitions(config: ChannelConfig) -> dict[int, list[tuple]]:
    """Every event of each channel partition, in offset order, as a record reads back."""
    out: dict[int, list[tuple]] = {}
    with Channel.open(config, read_only=True) as channel:
        for partition in range(config.partitions):
            events, offset = [], 0
            while batch := channel.read(partition, offset, 10_000):
                events += batch
                offset = batch[-1].offset + 1
            out[partition] = [(e.key, e.body, list(e.headers.items()), e.timestamp)
                              for e in events]
    return out


@dataclass
class SinkRun:
    """One run of the sink's job: exit status, report line, committed lines, output."""

    returncode: int
    report: dict[str, Any] | None
    error: str | None
    committed: list[dict[str, Any]]
    output: str


def sink_command(config: ChannelConfig, bootstrap: str, topic: str, **options: Any) -> list[str]:
    """The job's command line (options as SinkSettings fields; True for a flag)."""
    argv = [sys.executable, "-m", "channel_engine.kafka_sink", "--home", config.checkpoint_dir,
            "--bootstrap", bootstrap, "--topic", topic]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def run_sink(config: ChannelConfig, bootstrap: str, topic: str, env: dict[str, str] | None = None,
             timeout: float = 120, **options: Any) -> SinkRun:
    """Run the job to its end (or its kill)."""
    result = subprocess.run(sink_command(config, bootstrap, topic, **options),
                            capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                            env={**os.environ, **(env or {})}, check=False)
    return parse_run(result.returncode, result.stdout + result.stderr)


def parse_run(returncode: int, output: str) -> SinkRun:
    """A SinkRun from the job's exit status and output."""
    report, error, committed = None, None, []
    for line in output.splitlines():
        if line.startswith('{"report"'):
            doc = json.loads(line)
            report, error = doc["report"], doc.get("error") or (doc["report"] or {}).get("error")
        elif line.startswith('{"committed"'):
            committed.append(json.loads(line)["committed"])
    return SinkRun(returncode, report, error, committed, output)


def new_topic(bootstrap: str, partitions: int = 2, **configs: str) -> str:
    """A topic of its own for a test."""
    name = f"t-{uuid.uuid4().hex[:10]}"

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            answer = await admin.create_topics([NewTopic(name, partitions, 1,
                                                         topic_configs=configs)])
            assert all(code == 0 for _, code, _ in answer.topic_errors), answer
            deadline = time.monotonic() + 30
            while True:  # until every partition has a leader (a new topic has none at first)
                [topic] = await admin.describe_topics([name])
                if topic["error_code"] == 0 and len(topic["partitions"]) == partitions and all(
                        p["error_code"] == 0 and p["leader"] >= 0 for p in topic["partitions"]):
                    return
                assert time.monotonic() < deadline, f"topic {name} has no leaders: {topic}"
                await asyncio.sleep(0.1)
        finally:
            await admin.close()
    run_async(create)
    return name


def read_topic(bootstrap: str, topic: str) -> dict[int, list[tuple]]:
    """Every committed record of each partition, in order, as (key, value, headers,
    timestamp): what a read_committed consumer sees."""
    async def read() -> dict[int, list[tuple]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                    isolation_level="read_committed",
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            partitions = [TopicPartition(topic, p)
                          for p in sorted(consumer.partitions_for_topic(topic) or
                                          await _partitions(consumer, topic))]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            ends = await consumer.end_offsets(partitions)
            out: dict[int, list[tuple]] = {tp.partition: [] for tp in partitions}
            for _ in range(600):
                pending = [tp for tp in partitions if await consumer.position(tp) < ends[tp]]
                if not pending:
                    return out
                for tp, messages in (await consumer.getmany(*pending, timeout_ms=500)).items():
                    out[tp.partition] += [(m.key, m.value, [(k, bytes(v)) for k, v in m.headers],
                                           m.timestamp) for m in messages]
            raise AssertionError(f"could not read {topic} to its end {ends}")
        finally:
            await consumer.stop()
    return run_async(read)


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await consumer._client.force_metadata_update()  # noqa: SLF001 -- a test's first look
    return consumer.partitions_for_topic(topic) or set()


def drain(config: ChannelConfig, bootstrap: str, topic: str, **options: Any) -> list[SinkRun]:
    """Run the sink until a run sends nothing more; every run made."""
    runs = []
    for _ in range(20):
        run = run_sink(config, bootstrap, topic, **options)
        runs.append(run)
        assert run.returncode == 0, run.output[-3000:]
        if run.report and run.report["transactions"] == 0 and run.report["skipped"] == 0:
            return runs
    raise AssertionError("the sink never caught up")

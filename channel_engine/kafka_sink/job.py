"""The Kafka sink's job: forward a channel into a Kafka topic, exactly once.

    python -m channel_engine.kafka_sink --home /data/orders/checkpoint \\
        --bootstrap kafka1:9092,kafka2:9092 --topic orders [--subscription kafka] \\
        [--partitioning key|same] [--compression none|gzip|snappy|lz4|zstd] \\
        [--create-topic [--topic-partitions N] [--topic-replication N]] \\
        [--offsets-topic weir-sink-offsets] [--max-events 100000] [--max-run-s 60] \\
        [--transaction-timeout-ms 60000] [--batch-bytes 524288] \\
        [--request-timeout-ms 30000] [--max-block-ms 60000] \\
        [--security-protocol PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL] \\
        [--sasl-mechanism PLAIN|SCRAM-SHA-256|SCRAM-SHA-512 --sasl-username U \\
         --sasl-password-file F] [--ssl-cafile F] [--ssl-certfile F --ssl-keyfile F]
    (manage.py drain_to_kafka NAME runs it for a channel of the appliance)

Output on stdout, one line each: progress lines for people ("kafka orders: transaction 3
committed, 100,000 events"), a JSON line `{"committed": {...}}` after each Kafka
transaction commits (its number, events and ranges: what the appliance records while the
run goes on, so a killed run's row still tells what it committed), and last one JSON
report line `{"report": {...}}` (sink.py's report: outcome, events, skipped, lost,
transactions, ranges, duration) whose "error" says why a failed run failed. Exit status
0 when the run is ok, 1 when it failed, 75 when another run of the channel holds its
lock (nothing done), 2 for bad options.

One run of a channel at a time: the job holds `kafka-sink.lock` (flock) in the channel's
home while it runs; the kernel drops it when the job dies, so it is never stale.

Where the rest is written down, each beside the code that owns it:

    module             what
    -----------------  -------------------------------------------------------------------
    sink.py            the protocol (steps 1-9, what a kill at each leaves), partitioning
    offsets_record.py  the offsets record: format, where it lives, why it is the truth
    settings.py        a run's settings and their limits
    client.py          the Kafka clients and how a failure is told
"""
from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from channel_engine.errors import ChannelEngineError, ConfigError
from channel_engine.kafka_sink.settings import SinkSettings

LOCK_FILE = "kafka-sink.lock"
EXIT_FAILED, EXIT_USAGE, EXIT_BUSY = 1, 2, 75  # 75: EX_TEMPFAIL, try again later


def parse(argv: list[str]) -> SinkSettings:
    """SinkSettings from a command line (every field is an option: --max-events ...)."""
    parser = argparse.ArgumentParser(prog="python -m channel_engine.kafka_sink",
                                     description="Forward a channel into a Kafka topic, "
                                                 "exactly once.")
    for field in fields(SinkSettings):
        flag = "--" + field.name.replace("_", "-")
        if field.type == "bool":
            parser.add_argument(flag, action="store_true")
        else:
            convert = {"int": int, "float": float}.get(str(field.type), str)
            required = field.name in ("home", "bootstrap", "topic")
            parser.add_argument(flag, type=convert, required=required,
                                default=None if required else field.default)
    return SinkSettings(**vars(parser.parse_args(argv)))


def emit(line: str, committed: dict[str, Any] | None = None) -> None:
    """A progress line, and the JSON line of a committed transaction."""
    print(line, flush=True)
    if committed is not None:
        print(json.dumps({"committed": committed}), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the sink once; print the report line; the exit status."""
    from channel_engine.kafka_sink.sink import KafkaSink

    try:
        settings = parse(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"python -m channel_engine.kafka_sink: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        sink = KafkaSink(settings, emit)
        lock = _lock(Path(settings.home))
    except (ChannelEngineError, OSError) as exc:
        print(json.dumps({"report": None, "error": str(exc)}), flush=True)
        return EXIT_FAILED
    if lock is None:
        print(json.dumps({"report": None, "error": f"busy: a run of the Kafka sink of "
                          f"channel {sink.name!r} is already going (it holds "
                          f"{Path(settings.home) / LOCK_FILE})"}), flush=True)
        return EXIT_BUSY
    try:
        report = asyncio.run(sink.run())
    except Exception:  # noqa: BLE001 -- told in the report line; the status says failed
        print(json.dumps({"report": sink.report("failed", sink.error)}), flush=True)
        return EXIT_FAILED
    finally:
        os.close(lock)
    print(json.dumps({"report": report}), flush=True)
    return 0


def _lock(home: Path) -> int | None:
    """A descriptor holding <home>/kafka-sink.lock, or None when another process holds it."""
    fd = os.open(home / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd

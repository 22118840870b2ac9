"""`python -m channel_engine produce PATH`: append stdin lines as events.

Into a partition directory (one PartitionLog append per --batch lines) or, when
PATH holds channel.json, through the channel (as a client when another process
owns it), one put transaction per --batch lines. Not for concurrent use with
another writer of the same partition directory (its `.lock` refuses it).
Failures: UsageError for bad options; the engine's errors propagate to main.
"""
from __future__ import annotations

import argparse
import sys
from typing import TextIO

from channel_engine.channel import Channel
from channel_engine.errors import (
    UsageError,
)
from channel_engine.event import PendingEvent
from channel_engine.log.config import LogConfig
from channel_engine.log.partition_log import PartitionLog
from channel_engine.tools.cli_paths import is_channel


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Append stdin's lines; print how many events and where."""
    if args.batch < 1:
        raise UsageError("--batch must be at least 1")
    headers = {}
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--header {item!r}: expected K=V")
        headers[name] = value.encode()
    key = args.key.encode() if args.key is not None else None
    try:
        config = LogConfig(compression=args.compression, segment_bytes=args.segment_bytes)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if is_channel(args.path):
        return _produce_to_channel(args, key, headers, out)
    events = batches = 0
    first = last = None
    with PartitionLog.open(args.path, config) as log:
        batch: list[PendingEvent] = []
        for line in sys.stdin.buffer:
            batch.append(PendingEvent(line.rstrip(b"\r\n"), key, headers or None))
            if len(batch) == args.batch:
                first, last = _append(log, batch, first)
                events, batches, batch = events + len(batch), batches + 1, []
        if batch:
            first, last = _append(log, batch, first)
            events, batches = events + len(batch), batches + 1
    span = f", offsets {first}..{last}" if events else ""
    print(f"appended {events} events in {batches} batches{span}", file=out)
    return 0


def _produce_to_channel(args: argparse.Namespace, key: bytes | None,
                        headers: dict[str, bytes], out: TextIO) -> int:
    events = transactions = 0
    with Channel.open(args.path, create=False) as channel:  # never makes a channel
        lines = iter(sys.stdin.buffer)
        while True:
            with channel.put() as tx:
                for line in lines:
                    tx.put(line.rstrip(b"\r\n"), key=key, headers=headers or None)
                    if len(tx) == args.batch:
                        break
                count = len(tx)
            if not count:
                break
            events, transactions = events + count, transactions + 1
    print(f"put {events} events in {transactions} transactions into channel "
          f"{channel.name!r}", file=out)
    return 0


def _append(log: PartitionLog, batch: list[PendingEvent], first: int | None) -> tuple[int, int]:
    result = log.append(batch)
    return (result.first_offset if first is None else first), result.last_offset

"""Benchmark: take + commit transactions of several consumers of one channel at once,
through the owner (fsync durability: each commit acknowledged once journalled on disk).

    .venv/bin/python bench/consumers.py [--consumers 1,4,8] [--events 5] [--seconds 5]

A channel of 3 partitions is filled with 1,000,000 events of 100 B and owned by a child
process; this process opens it as a client and, for each count of --consumers, runs that
many threads (a connection each) for --seconds, each looping: begin a take, take
--events, commit (a take that finds fewer says the channel ran dry: the figures are then
void, and printed so). Reported: commits a second, all consumers together, and the owner's
fdatasync calls a commit (counted in the owner process: how many commits one fsync
carries; this disk's flush time varies a lot from minute to minute, the count does
not). The owner's loop
begins the take commits that arrive together and waits for their journal fsync once
(owner/server.py), so more consumers share fsyncs; each row's rate is also printed as a
multiple of the first row's (by default one consumer alone: a commit with nobody to
share its fsync with).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from channel_engine import Channel, ChannelConfig, PendingEvent  # noqa: E402


def own(home: str, ready: EventType, stop: EventType, fsyncs: Any) -> None:
    """The owner process: open the channel (as its owner) until told to stop, counting its
    fdatasync calls in `fsyncs`."""
    real = os.fdatasync

    def counted(fd: int) -> None:
        real(fd)
        with fsyncs.get_lock():
            fsyncs.value += 1

    os.fdatasync = counted
    with Channel.open(ChannelConfig.load(home)):
        ready.set()
        stop.wait()


def commits(client: Channel, consumers: int, events: int, seconds: float) -> tuple[int, float]:
    """Take + commit transactions by `consumers` threads of `client` in `seconds`, and the
    seconds they took."""
    done, dry, lock = [0], threading.Event(), threading.Lock()
    end = time.monotonic() + seconds

    def consume() -> None:
        while time.monotonic() < end and not dry.is_set():
            with client.take() as tx:
                if len(tx.take(events)) < events:
                    dry.set()
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=consume) for _ in range(consumers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if dry.is_set():
        raise SystemExit("the channel ran dry: these figures are void (fill more, take fewer)")
    return done[0], time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--consumers", default="1,4,8")
    parser.add_argument("--events", type=int, default=5, help="events a take")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="weir-consumers-", dir="/var/tmp"))
    config = ChannelConfig("bench", (str(root / "data"),), str(root / "home"), partitions=3,
                           minimum_required_space=0, capacity=10**8)
    ready, stop = multiprocessing.Event(), multiprocessing.Event()
    fsyncs = multiprocessing.Value("q", 0)
    owner = None
    try:
        with Channel.open(config) as channel:
            for _ in range(200):
                with channel.put() as tx:
                    tx.put_all([PendingEvent(b"x" * 100)] * 5_000)
        owner = multiprocessing.Process(target=own, args=(str(config.home), ready, stop, fsyncs))
        owner.start()
        if not ready.wait(60) or not owner.is_alive():
            raise SystemExit("the owner process did not start")
        print(f"take({args.events}) + commit through the owner, fsync durability, "
              f"{args.seconds:g} s each:")
        with Channel.open(config.home) as client:
            assert client.role == "client", "this process must be the owner's client"
            alone = None
            for consumers in (int(n) for n in args.consumers.split(",")):
                before = fsyncs.value
                done, spent = commits(client, consumers, args.events, args.seconds)
                rate = done / spent
                alone = alone or rate
                print(f"  {consumers} consumers: {rate:8,.0f} commits/s "
                      f"({rate / alone:.2f}x the first row's), "
                      f"{(fsyncs.value - before) / max(done, 1):.2f} fsyncs/commit")
    finally:
        stop.set()
        if owner is not None:
            owner.join(30)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

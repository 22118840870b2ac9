"""Benchmark: what the owner socket costs a put, apart from the put.

    .venv/bin/python bench/owner_rtt.py [--calls 3000] [--threads 1,8]

A channel (3 partitions) is owned by a child process; this process opens it as a client
(channel_engine/owner/client.py -> server.py over owner.sock) and, for each number of
--threads, times:
  * hello: the round trip alone (the owner answers without touching the channel);
  * put, policy: a 1-event put transaction committed through the owner, flush_ms=1000
    (no fsync: the socket and the owner's commit);
  * put, owner: the same put in a channel this process owns (no socket), policy too;
  * put, fsync: through the owner again, in fsync durability (group commit).
Reported per row: calls/s, p50 and p99 latency, and the CPU a call of this process and of
the owner's (user + system, from /proc). Same run, same machine: compare the rows.
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
from bench.common import cpu_s  # noqa: E402
from channel_engine import Channel  # noqa: E402
from channel_engine.owner import protocol  # noqa: E402
from channel_engine.queue.channel_config import ChannelConfig  # noqa: E402


def config(root: str, durability: str) -> ChannelConfig:
    """The bench channel under root."""
    return ChannelConfig(name="rtt", data_dirs=(f"{root}/data",),
                         checkpoint_dir=f"{root}/home", partitions=3, durability=durability,
                         flush_ms=1000 if durability == "policy" else None,
                         minimum_required_space=0)


def own(root: str, durability: str, ready: EventType, stop: EventType) -> None:
    """The owner process: hold the channel until told to stop."""
    channel = Channel.open(config(root, durability))
    ready.set()
    stop.wait()
    channel.close()


def measure(channel: Channel, op: str, threads: int, calls: int, owner_pid: int | None
            ) -> str:
    """Run `calls` calls of `op` over `threads` threads; one report line."""
    latencies: list[float] = []
    client = channel._client

    def work() -> None:
        for _ in range(calls // threads):
            start = time.perf_counter()
            if op == "hello":
                assert client is not None
                client.call(protocol.HELLO)
            else:
                with channel.put() as tx:
                    tx.put(b"x" * 200)
            latencies.append(time.perf_counter() - start)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    mine, theirs = cpu_s(os.getpid()), cpu_s(owner_pid) if owner_pid else 0.0
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    mine, theirs = cpu_s(os.getpid()) - mine, (cpu_s(owner_pid) - theirs) if owner_pid else 0
    latencies.sort()
    n = len(latencies)
    return (f"{n / elapsed:9,.0f}/s   p50 {latencies[n // 2] * 1e6:6.0f} us   p99 "
            f"{latencies[int(n * 0.99)] * 1e6:6.0f} us   CPU a call: this process "
            f"{mine / n * 1e6:4.0f} us, owner {theirs / n * 1e6:4.0f} us")


def run(durability: str, threads: int, calls: int, ops: tuple[str, ...]) -> None:
    """Measure `ops` through a channel owned by a child process."""
    root = tempfile.mkdtemp(prefix="weir-rtt-", dir="/var/tmp")
    ready, stop = multiprocessing.Event(), multiprocessing.Event()
    owner = multiprocessing.Process(target=own, args=(root, durability, ready, stop))
    owner.start()
    ready.wait()
    channel = Channel.open(config(root, durability))
    try:
        for op in ops:
            line = measure(channel, op, threads, calls, owner.pid)
            print(f"  {op + ', ' + durability:<14} client   {threads:>2} threads {line}",
                  flush=True)
    finally:
        channel.close()
        stop.set()
        owner.join()
        shutil.rmtree(root, ignore_errors=True)


def run_local(threads: int, calls: int) -> None:
    """The same put in a channel this process owns."""
    root = tempfile.mkdtemp(prefix="weir-rtt-", dir="/var/tmp")
    channel = Channel.open(config(root, "policy"))
    try:
        line = measure(channel, "put", threads, calls, None)
        print(f"  {'put, policy':<14} owner    {threads:>2} threads {line}", flush=True)
    finally:
        channel.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--threads", default="1,8")
    args: Any = parser.parse_args()
    for threads in (int(n) for n in args.threads.split(",")):
        run("policy", threads, args.calls, ("hello", "put"))
        run_local(threads, args.calls)
        run("fsync", threads, max(threads, args.calls // 5), ("put",))


if __name__ == "__main__":
    main()

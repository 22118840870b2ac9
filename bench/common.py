"""What the benchmarks share: their inputs, the device's flush counter, CPU time from
/proc, a private Redis."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def make_bodies(count: int, size: int) -> list[bytes]:
    """Return `count` distinct random bodies of `size` bytes."""
    blob = os.urandom(count * size)
    return [blob[i:i + size] for i in range(0, len(blob), size)]


def chunk(items: Sequence[Any], size: int) -> list[list[Any]]:
    """Split items into lists of `size` (the last may be shorter)."""
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def flush_stat_path(directory: Path) -> Path | None:
    """The sysfs stat file of the block device holding `directory`, if there is one."""
    dev = os.stat(directory).st_dev
    path = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return path if path.exists() else None


def read_flushes(path: Path | None) -> int | None:
    """Flush requests completed by the device so far (field 16 of its stat), or None."""
    if path is None:
        return None
    fields = path.read_text().split()
    return int(fields[15]) if len(fields) >= 16 else None


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not in iowait) since boot."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def private_redis() -> subprocess.Popen[bytes] | None:
    """A private redis-server when nothing answers at REDIS_URL (its URL exported)."""
    import redis

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
        return None
    except redis.RedisError:
        pass
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            redis.Redis.from_url(os.environ["REDIS_URL"]).ping()
            return server
        except redis.RedisError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not answer")

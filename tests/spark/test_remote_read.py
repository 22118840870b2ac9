"""Executors that do not share the appliance's disks read over its HTTP API: the same
ranges give the same rows as reading the files, and a token that may not consume, or a
range the appliance cannot serve, fails the job clearly."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from channel_engine import Channel, ChannelConfig

ROOT = Path(__file__).resolve().parents[2]
# request line, status, the range a batches answer covered (X-Weir-Range)
ACCESS_LOG_FORMAT = '"%(r)s" %(s)s %({x-weir-range}o)s'


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture()
def appliance(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path]]:
    """A live appliance (2 gunicorn workers) with channel "orders": (url, its environment,
    the channel's home). Its access log, tmp_path / "access.log" (ACCESS_LOG_FORMAT), shows
    who read what over HTTP."""
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "WEIR_DATA_ROOT": str(tmp_path / "channels")}
    env.pop("DATABASE_URL", None)
    manage(env, "migrate", "--noinput")
    manage(env, "create_channel", "orders", "--partitions", "2",
           "--set", "minimum_required_space=0", "--set", "segment_bytes=8192")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    web = subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "appliance.wsgi",
                            "--bind", f"127.0.0.1:{port}", "--workers", "2",
                            "--no-control-socket", "--access-logfile",
                            str(tmp_path / "access.log"), "--access-logformat",
                            ACCESS_LOG_FORMAT], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the appliance did not start"
                time.sleep(0.2)
        yield url, env, tmp_path / "channels" / "orders" / "checkpoint"
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)


def put_events(home: Path, count: int, prefix: str) -> None:
    """`count` events (bodies prefix-0, prefix-1, ...; keys k0-k2) in puts of 50, through
    the appliance (this process a client of a web worker's owner)."""
    with Channel.open(ChannelConfig.load(home)) as channel:
        for first in range(0, count, 50):
            with channel.put() as tx:
                for i in range(first, min(first + 50, count)):
                    tx.put(f"{prefix}-{i}".encode(), key=f"k{i % 3}".encode())


def consume_token(env: dict[str, str]) -> str:
    """A new API token with the consume role (what the export's executors read with)."""
    return manage(env, "create_token", "export", "--role", "consume").split()[-1]


def read(spark: Any, home: Path, ranges: dict[str, list[int]], **options: str) -> list[Any]:
    reader = spark.read.format("weir").option("home", str(home)) \
        .option("ranges", json.dumps(ranges)).option("max_rows_per_split", "70")
    for name, value in options.items():
        reader = reader.option(name, value)
    return sorted(tuple(row) for row in reader.load().collect())


def test_the_remote_read_path_returns_the_same_rows_as_the_file_path(
        appliance: tuple[str, dict[str, str], Path], spark: Any) -> None:
    url, env, home = appliance
    with Channel.open(ChannelConfig.load(home)) as channel:  # a client of a web worker
        for first in range(0, 300, 30):
            with channel.put() as tx:
                for i in range(first, first + 30):
                    tx.put(f"body-{i}".encode() * 3, key=f"k{i % 5}".encode(),
                           headers={"n": str(i).encode()} if i % 2 else None)
        ends = [p["log_end_offset"] for p in channel.status()["partitions"]]
    ranges = {"0": [3, ends[0] - 2], "1": [0, ends[1]]}
    token = manage(env, "create_token", "spark", "--role", "consume").split()[-1]
    local = read(spark, home, ranges)
    remote = read(spark, home, ranges, url=url, token=token)
    assert len(local) == ends[0] - 5 + ends[1] and remote == local
    producer = manage(env, "create_token", "p", "--role", "produce").split()[-1]
    with pytest.raises(Exception, match="403"):
        read(spark, home, ranges, url=url, token=producer)
    with pytest.raises(Exception, match="416"):
        read(spark, home, {"0": [0, ends[0] + 5]}, url=url, token=token)
    with pytest.raises(Exception, match="option token"):
        read(spark, home, ranges, url=url)

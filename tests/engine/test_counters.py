"""Counters count since the channel was made (queue/counters.py): a close and reopen keeps
them exactly, a damaged primary checkpoint gives the backup's, and after a kill -9 the
open restores the last checkpoint's and recounts the puts and take commits since."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from channel_helpers import make_config

from channel_engine import Channel
from channel_engine.queue import checkpoint as checkpoint_file

ROOT = Path(__file__).resolve().parents[2]


def _busy(channel: Channel) -> None:
    """Puts (one across partitions), a put rolled back, takes committed and rolled back, a
    subscription's take: every counter the appliance's /metrics shows moves."""
    with channel.put() as tx:
        for i in range(10):
            tx.put(b"e%d" % i, key=b"k%d" % i)
    tx = channel.put()
    tx.put(b"never")
    tx.rollback()
    with channel.take() as taken:
        assert len(taken.take(4)) == 4
    back = channel.take()
    back.take(2)
    back.rollback()
    channel.add_subscription("archive")
    with channel.take(subscription="archive") as taken:
        assert len(taken.take(3)) == 3


def _counters(status: dict[str, Any]) -> dict[str, Any]:
    return {"channel": status["counters"],
            **{name: sub["counters"] for name, sub in status["subscriptions"].items()}}


def test_a_reopen_keeps_every_counter_exactly(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as channel:
        _busy(channel)
        before = _counters(channel.status())
    assert before["channel"]["put_successes"] == 10 and before["channel"]["rollbacks"] == 2
    assert before["archive"]["take_successes"] == 3
    with Channel.open(config.replace(capacity=50_000)) as channel:  # a settings change too
        status = channel.status()
        assert _counters(status) == before
        assert status["recovery"]["counters_recounted"] == {}  # the close saved them all
        with channel.put() as tx:
            tx.put(b"more")
        assert channel.status()["counters"]["put_successes"] == 11


def test_the_backup_checkpoint_gives_its_counters_when_the_primary_is_damaged(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2, use_dual_checkpoints=True,
                         backup_checkpoint_dir=str(tmp_path / "backup"))
    with Channel.open(config) as channel:
        _busy(channel)
        before = _counters(channel.status())
    primary = config.home / checkpoint_file.FILE_NAME
    data = bytearray(primary.read_bytes())
    data[-10] ^= 0xFF  # inside the counters: the CRC fails
    primary.write_bytes(bytes(data))
    with Channel.open(config) as channel:
        status = channel.status()
        assert status["recovery"]["checkpoint_source"] == "backup"
        assert _counters(status) == before


WORKER = textwrap.dedent("""
    import json, sys, time
    from channel_engine import Channel, ChannelConfig
    channel = Channel.open(ChannelConfig.load(sys.argv[1]))
    def put(n, first):
        with channel.put() as tx:
            for i in range(first, first + n):
                tx.put(b"e%d" % i, key=b"k%d" % i)
    put(20, 0)
    with channel.take() as tx:
        tx.take(5)
    tx = channel.take()
    tx.take(1)
    tx.rollback()
    channel.checkpoint()
    print(json.dumps({"checkpoint": channel.status()["counters"]}), flush=True)
    put(7, 20)  # after the checkpoint: in the logs and the journal only
    put(1, 27)
    with channel.take() as tx:
        tx.take(6)
    tx = channel.take()
    tx.take(2)
    tx.rollback()  # leaves no durable record: undercounted after the kill
    print(json.dumps({"killed": channel.status()["counters"]}), flush=True)
    time.sleep(600)
""")


def test_after_a_kill_the_counters_are_the_checkpoints_plus_what_replay_recounts(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2, durability="fsync")
    config.save()
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(config.home)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert worker.stdout is not None
        saved = json.loads(worker.stdout.readline())["checkpoint"]
        killed = json.loads(worker.stdout.readline())["killed"]
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    assert worker.returncode == -signal.SIGKILL
    with Channel.open(config) as channel:
        status = channel.status()
    counters = status["counters"]
    assert status["recovery"]["counters_recounted"] == {
        "put_attempts": 8, "put_successes": 8, "take_attempts": 6, "take_successes": 6}
    # what the logs and the journal hold is counted exactly
    for name in ("put_attempts", "put_successes", "take_successes"):
        assert counters[name] == killed[name], name
    # what left no record since the checkpoint (the rollback, the 2 events asked for) is
    # not: the checkpoint's count, never less (counters.py)
    assert counters["rollbacks"] == saved["rollbacks"] == killed["rollbacks"] - 1
    assert counters["take_attempts"] == killed["take_attempts"] - 2
    assert all(counters[name] >= saved[name] for name in saved)
    assert status["subscriptions"]["default"]["counters"]["take_successes"] == 5 + 6

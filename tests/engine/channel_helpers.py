"""Helpers shared by the channel tests: configs, and an in-process "crash"."""
from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from channel_engine import Channel, ChannelConfig, PartitionLog
from channel_engine.errors import DiskFullError


def make_config(root: Path, name: str = "ch", **settings: Any) -> ChannelConfig:
    """A channel under `root` with two data dirs; the disk guard off unless asked for."""
    settings.setdefault("minimum_required_space", 0)
    if "capacity" in settings:
        settings.setdefault("transaction_capacity", min(settings["capacity"], 10_000))
    return ChannelConfig(name, [str(root / "data-a"), str(root / "data-b")],
                         str(root / "home"), **settings)


def small_channel(root: Path) -> ChannelConfig:
    """A two-partition channel under `root`, closed cleanly: six keyed events put, two of
    them taken and committed (four untaken)."""
    config = make_config(root, partitions=2)
    with Channel.open(config) as channel:
        with channel.put() as tx:
            for i in range(6):
                tx.put(f"e{i}".encode(), key=str(i).encode())
        with channel.take() as tx:
            tx.take(2)
    return config


def crash(channel: Channel) -> None:
    """The owner process dies between two steps: no checkpoint, no clean close of the logs,
    the journal left as written, every descriptor and lock dropped. The page cache survives
    (as after kill -9), so everything written stays readable."""
    owner = channel.owner
    assert owner is not None, "only the owner can crash in process"
    if channel._server is not None:
        server = channel._server  # stops answering at once, as a killed process does
        with server._lock:
            server._stopping = True
        server._wake()
        server._thread.join()
        for conn in list(server._connections):
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        server._listener.close()
        os.close(server._dir_fd)
    if owner.state.journal is not None:
        os.close(owner.state.journal._fd)
        owner.state.journal._fd = -1
    for log in owner.logs:
        log.state.release_dir_lock()
        if log.state.state_fd >= 0:  # log.state, held open for in-place writes
            os.close(log.state.state_fd)
            log.state.state_fd = -1
        for segment in log.segments + tuple(log.state.pending_deletes):
            segment.close()
    if owner.home_lock.fd >= 0:
        os.close(owner.home_lock.fd)
        owner.home_lock.fd = -1
    owner.state.closing = owner.state.closed = True
    channel._closed = True


def crashed_channel(tmp_path: Path, **settings: Any) -> ChannelConfig:
    """A two-partition channel whose owner died before any checkpoint after its open: 12
    events in one journalled two-partition put, three journalled take commits of 2 events
    each, then a put of 4 more over both partitions (16 put in all)."""
    config = make_config(tmp_path, partitions=2, **settings)
    channel = Channel.open(config)
    with channel.put() as tx:
        for i in range(12):
            tx.put(f"e{i}".encode(), key=str(i).encode())
    for _ in range(3):
        with channel.take() as tx:
            assert len(tx.take(2)) == 2
    with channel.put() as tx:
        for i in range(4):
            tx.put(f"late{i}".encode(), key=str(i).encode())
    crash(channel)
    return config


@contextlib.contextmanager
def appends_refused(partition: int) -> Iterator[None]:
    """Inside: every append to `partition` fails as a full disk does (DiskFullError), so a
    put touching it and another partition fails after its other batches were written."""
    append = PartitionLog.append_batch

    def refuse(log: PartitionLog, batch: bytearray, defer_flush: bool = False) -> Any:
        if log.partition == partition:
            raise DiskFullError(log.directory, OSError(28, "No space left"), "appending")
        return append(log, batch, defer_flush)

    PartitionLog.append_batch = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        PartitionLog.append_batch = append  # type: ignore[method-assign]

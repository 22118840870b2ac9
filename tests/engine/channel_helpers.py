"""Helpers shared by the channel tests: configs, and an in-process "crash"."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from channel_engine import Channel, ChannelConfig


def make_config(root: Path, name: str = "ch", **settings: Any) -> ChannelConfig:
    """A channel under `root` with two data dirs; the disk guard off unless asked for."""
    settings.setdefault("minimum_required_space", 0)
    if "capacity" in settings:
        settings.setdefault("transaction_capacity", min(settings["capacity"], 10_000))
    return ChannelConfig(name, [str(root / "data-a"), str(root / "data-b")],
                         str(root / "home"), **settings)


def crash(channel: Channel) -> None:
    """The owner process dies between two steps: no checkpoint, no clean close of the logs,
    the journal left as written, every descriptor and lock dropped. The page cache survives
    (as after kill -9), so everything written stays readable."""
    owner = channel.owner
    assert owner is not None, "only the owner can crash in process"
    if channel._server is not None:
        server = channel._server
        server._server.shutdown()
        server._server.close_connections(idle_only=False)
        server._server.server_close()
        os.close(server._dir_fd)
    if owner._journal is not None:
        os.close(owner._journal._fd)
        owner._journal._fd = -1
    for log in owner.logs:
        log._release_dir_lock()
        for segment in log.segments + tuple(log._pending_deletes):
            segment.close()
    if owner._lock_fd >= 0:
        os.close(owner._lock_fd)
        owner._lock_fd = -1
    owner._closing = owner._closed = True
    channel._closed = True

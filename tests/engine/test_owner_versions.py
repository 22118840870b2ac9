"""A rolling upgrade (owner/protocol.py): a new client reaches an owner of version 3 (hello as
version 3, then requests of the owner's version, without `movable`), and an owner refuses
a request whose argument count is not its version's."""
from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from channel_helpers import make_config

from channel_engine import Channel, PendingEvent
from channel_engine.filenames import SOCKET_NAME
from channel_engine.owner import protocol
from channel_engine.owner.client import OwnerClient
from channel_engine.owner.server import socket_path
from channel_engine.queue.put_batch import Partitioner, encode


class OldOwner:
    """An owner of version 3 as it answered before `movable`: any other version refused,
    commit_batches called with exactly its three arguments."""

    def __init__(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self._dir_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(socket_path(home / SOCKET_NAME, self._dir_fd))
        self.listener.listen(4)
        self.requests: list[list[Any]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            while True:
                try:
                    request = protocol.receive(conn)
                except (EOFError, OSError):
                    return
                self.requests.append(request)
                protocol.send(conn, self._answer(*request))

    def _answer(self, version: int, op: str, args: list[Any]) -> list[Any]:
        if version != 3:
            return [1, "ValueError", f"owner protocol version {version} is not supported "
                    "(this owner speaks 3)", {}]
        if op == protocol.HELLO:
            return [0, {"pid": os.getpid(), "name": "old", "version": 3}]
        if op == "commit_batches" and len(args) == 3:
            return [0, [[args[1][0][0], 7, 7]]]
        return [1, "TypeError", f"{op}() takes 3 arguments, got {len(args)}", {}]

    def close(self) -> None:
        self.listener.close()
        os.close(self._dir_fd)


def test_a_new_client_reaches_a_version_3_owner_and_sends_it_no_movable(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=3)
    old = OldOwner(config.home)
    try:
        client = OwnerClient.connect(config, 5.0)
        put = encode([PendingEvent(b"to an old owner")], Partitioner(), 3, "none")
        assert put.movable
        committed = client.commit_batches(None, put.batches, 3, movable=True)
        client.close()
    finally:
        old.close()
    assert client.version == 3
    assert committed == [(put.batches[0][0], 7, 7)]
    assert [(version, op, len(args)) for version, op, args in old.requests] == \
        [(3, "hello", 0), (3, "commit_batches", 3)]


def test_a_client_of_a_version_4_owner_speaks_version_4(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config):
        client = OwnerClient.connect(config, 5.0)
        try:
            assert client.version == protocol.VERSION == 4
            put = encode([PendingEvent(b"x")], Partitioner(), 2, "none")
            assert client.commit_batches(None, put.batches, 2, movable=True)[0][1] == 0
        finally:
            client.close()


@pytest.mark.parametrize(("version", "count"), [(3, 4), (4, 3), (4, 5), (3, 2)])
def test_an_owner_refuses_commit_batches_with_another_versions_argument_count(
        tmp_path: Path, version: int, count: int) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as owner_channel:
        put = encode([PendingEvent(b"refused")], Partitioner(), 2, "none")
        args: list[Any] = [None, [[p, bytes(b)] for p, b in put.batches], 2, True, True]
        client = OwnerClient.connect(config, 5.0)
        try:
            protocol.send(client._connection(), [version, "commit_batches", args[:count]])
            reply = protocol.receive(client._connection())
        finally:
            client.close()
        assert reply[:2] == [1, "ValueError"]
        assert f"commit_batches of version {version} takes {version} arguments, got " \
            f"{count}" in reply[2]
        assert owner_channel.list_offsets() == [(0, 0), (0, 0)]  # nothing written


def test_the_owner_logs_why_it_closes_a_connection_out_of_step(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = make_config(tmp_path, partitions=1)
    with Channel.open(config), caplog.at_level("WARNING", "channel_engine.owner.server"):
        client = OwnerClient.connect(config, 5.0)
        sock = client._connection()
        hello = [protocol.HELLO_VERSION, protocol.HELLO, []]
        frame = msgpack.packb(hello)
        sock.sendall(protocol.LENGTH.pack(len(frame)) + frame + b"\0\0")  # bytes past it
        assert sock.recv(100) == b""  # closed, unanswered
        client.close()
        deadline = time.monotonic() + 5
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "closed a client's connection to the owner: 2 bytes past a frame" in caplog.text

"""OwnerClient.close() from another thread while a call waits for its owner's reply (a web
worker closing the handle of a channel deleted meanwhile): the call ends at once with
OwnerLostError instead of waiting out its timeout on a descriptor closed under it, and
every descriptor the client opened is closed once the call is over. The owner here is a
fake at the socket boundary that answers the handshake and never answers a request."""
from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from channel_helpers import make_config

from channel_engine.errors import OwnerLostError, OwnerProtocolError, OwnerUnreachableError
from channel_engine.event import Event
from channel_engine.filenames import SOCKET_NAME
from channel_engine.owner import protocol
from channel_engine.owner.client import OwnerClient
from channel_engine.queue.channel_config import ChannelConfig

TIMEOUT_S = 30.0  # the client's own timeout: a call that waits it out fails the test


@dataclass
class SilentOwner:
    """The fake owner's channel and the connections it accepted (descriptors of this
    process that are not the client's)."""

    config: ChannelConfig
    held: list[socket.socket]

    def client_descriptors(self) -> set[int]:
        """This process's open sockets, the fake owner's aside (sockets only: a background
        thread of an earlier test, such as the row cache's watch, may open a file meanwhile)."""
        return {fd for fd in map(int, os.listdir("/proc/self/fd")) if _is_socket(fd)} - {
            conn.fileno() for conn in self.held}


def _is_socket(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    except OSError:  # closed since the listing
        return False


def fake_owner_socket(config: ChannelConfig) -> socket.socket:
    """A listening owner.sock in config's home, for a fake owner."""
    config.home.mkdir(parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(config.home / SOCKET_NAME))
    listener.listen(16)
    return listener


def serve_each(listener: socket.socket, serve: Callable[[socket.socket], None],
               held: list[socket.socket]) -> None:
    """Accept connections in a thread until the listener closes, each served by `serve` in a
    thread of its own and kept in `held`."""
    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


@pytest.fixture()
def silent_owner(tmp_path: Path) -> Iterator[SilentOwner]:
    """A channel home whose owner socket answers HELLO, then reads requests and never
    answers them."""
    config = make_config(tmp_path)
    listener = fake_owner_socket(config)
    held: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        try:
            while True:
                request = protocol.receive(conn)
                if request[1] == protocol.HELLO:
                    protocol.send(conn, [0, {"pid": os.getpid()}])
        except (OSError, EOFError):
            pass

    serve_each(listener, serve, held)
    try:
        yield SilentOwner(config, held)
    finally:
        listener.close()
        for conn in held:
            conn.close()


def test_close_from_another_thread_ends_a_call_waiting_for_its_reply_at_once(
        silent_owner: SilentOwner) -> None:
    before = silent_owner.client_descriptors()
    client = OwnerClient.connect(silent_owner.config, timeout_s=TIMEOUT_S)
    outcome: list[BaseException | None] = []

    def waiting_call() -> None:
        try:
            client.status()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 -- handed to the test thread
            outcome.append(exc)

    caller = threading.Thread(target=waiting_call)
    caller.start()
    time.sleep(0.3)  # the request is sent and the call waits for the reply
    assert caller.is_alive() and not outcome
    began = time.monotonic()
    client.close()
    caller.join(TIMEOUT_S + 5)
    assert time.monotonic() - began < 5, "the call waited out its timeout after close()"
    assert len(outcome) == 1 and isinstance(outcome[0], OwnerLostError), outcome
    assert silent_owner.client_descriptors() <= before  # the in-flight one closed after all


def test_a_call_after_close_is_refused_as_not_done(silent_owner: SilentOwner) -> None:
    before = silent_owner.client_descriptors()
    client = OwnerClient.connect(silent_owner.config, timeout_s=TIMEOUT_S)
    client.close()
    with pytest.raises(OwnerUnreachableError, match="was not done"):
        client.status()
    assert silent_owner.client_descriptors() <= before


@pytest.mark.parametrize("row", [[0, 1, 2, None, {}], [0, 1, 2, None, {}, b"x", b"more"],
                                 [], 7, b"abcdef"])
def test_an_event_of_the_wrong_shape_in_a_reply_is_a_protocol_error(row: object) -> None:
    good = [0, 1, 2, None, {}, b"x"]
    assert protocol.TAKE_EVENTS.result_from_wire([good]) == [Event(0, 1, 2, None, {}, b"x")]
    with pytest.raises(OwnerProtocolError, match=r"owner protocol: an event of .* expected a "
                       r"list of 6 fields \(partition, offset, timestamp, key, headers, body\)"):
        protocol.TAKE_EVENTS.result_from_wire([good, row])
    with pytest.raises(OwnerProtocolError):
        protocol.READ.result_from_wire([row])


@pytest.fixture()
def echo_owner(tmp_path: Path) -> Iterator[tuple[ChannelConfig, list[list[object]]]]:
    """A channel home whose owner socket answers HELLO and every other request with
    [op, args] (recording each request it read); after answering `bye` it closes the
    connection, as a stopping owner closes its idle ones."""
    config = make_config(tmp_path)
    listener = fake_owner_socket(config)
    requests: list[list[object]] = []
    receive, send = protocol.receive, protocol.send  # a test may patch the client's

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    request = receive(conn)
                    if request[1] == protocol.HELLO:
                        send(conn, [0, {"pid": os.getpid()}])
                        continue
                    requests.append(request)
                    send(conn, [0, request[1:]])
                    if request[1] == "bye":
                        return
            except (OSError, EOFError):
                pass

    serve_each(listener, serve, [])
    try:
        yield config, requests
    finally:
        listener.close()


def test_a_reply_later_than_the_timeout_ends_the_call_as_owner_lost(
        silent_owner: SilentOwner) -> None:
    client = OwnerClient.connect(silent_owner.config, timeout_s=0.3)
    began = time.monotonic()
    with pytest.raises(OwnerLostError, match=r"no reply within 0.3 s\); its outcome is "
                                             r"unknown"):
        client.status()
    assert 0.25 < time.monotonic() - began < 5
    with pytest.raises(OwnerUnreachableError, match="not sent"):  # never on that owner again
        client.status()


def test_a_call_to_an_owner_that_closed_the_connection_is_not_sent(
        echo_owner: tuple[ChannelConfig, list[list[object]]]) -> None:
    config, requests = echo_owner
    client = OwnerClient.connect(config, timeout_s=TIMEOUT_S)
    assert client.call("bye") == ["bye", []]
    time.sleep(0.2)  # the owner has closed the connection
    with pytest.raises(OwnerUnreachableError, match="after was not done"):
        client.call("after")
    assert client.lost
    assert [request[1] for request in requests] == ["bye"]


def test_a_call_never_reads_the_reply_of_one_that_ended_before_its_reply(
        echo_owner: tuple[ChannelConfig, list[list[object]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    config, _ = echo_owner
    client = OwnerClient.connect(config, timeout_s=TIMEOUT_S)
    receive = protocol.receive

    class Interrupted(Exception):
        """An exception raised into the thread mid-call (Celery's soft time limit)."""

    def interrupted(sock: socket.socket) -> object:
        time.sleep(0.1)  # the reply arrives, unread
        raise Interrupted

    monkeypatch.setattr(protocol, "receive", interrupted)
    with pytest.raises(Interrupted):
        client.call("first", 1)
    monkeypatch.setattr(protocol, "receive", receive)
    assert client.call("second", 2) == ["second", [2]]
    assert client.call("third") == ["third", []]


def test_a_timeout_beyond_poll_s_range_still_makes_calls(
        echo_owner: tuple[ChannelConfig, list[list[object]]]) -> None:
    config, _ = echo_owner
    client = OwnerClient.connect(config, timeout_s=40 * 86_400.0)  # a keep_alive_ms of weeks
    assert client.call("ping") == ["ping", []]

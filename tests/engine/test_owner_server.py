"""OwnerServer (owner/server.py): one loop answers the puts of every connection, the puts
that arrive together share an fsync, and whatever may wait or read long goes to the
connection's own thread, so the loop never stops answering the others."""
from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack
import pytest
from channel_helpers import make_config

from channel_engine import Channel, PendingEvent
from channel_engine.errors import JournalOfflineError, UnknownOperationError
from channel_engine.filenames import SOCKET_NAME
from channel_engine.kafka_sink.offsets_record import key_partition
from channel_engine.owner import protocol
from channel_engine.owner import server as server_module
from channel_engine.owner.client import OwnerClient
from channel_engine.owner.server import OwnerServer
from channel_engine.queue import put_batch
from channel_engine.queue.channel_config import ChannelConfig

TIMEOUT = 10.0


def put(channel: Channel, body: bytes) -> None:
    with channel.put() as tx:
        tx.put(body)


def take_all(channel: Channel, most: int = 1_000) -> list[bytes]:
    with channel.take() as tx:
        return [event.body for event in tx.take(most)]


def raw_connection(config: ChannelConfig) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(config.home / SOCKET_NAME))
    sock.settimeout(TIMEOUT)
    return sock


@pytest.fixture()
def owned(tmp_path: Path) -> Iterator[tuple[ChannelConfig, Channel]]:
    config = make_config(tmp_path, partitions=1)
    with Channel.open(config) as owner:
        yield config, owner


def test_concurrent_puts_of_many_connections_share_fsyncs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(tmp_path, partitions=1)
    fsyncs: list[int] = []
    real = os.fdatasync

    def slow_fdatasync(fd: int) -> None:  # a disk that takes a moment: puts pile up
        fsyncs.append(fd)
        time.sleep(0.002)
        real(fd)

    with Channel.open(config) as owner, Channel.open(config) as client:
        assert client.role == "client"
        monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
        threads, each = 8, 25
        with ThreadPoolExecutor(threads) as pool:  # a connection per thread
            list(pool.map(lambda t: [put(client, b"%d-%d" % (t, i)) for i in range(each)],
                          range(threads)))
        monkeypatch.undo()
        assert sorted(take_all(owner)) == sorted(b"%d-%d" % (t, i) for t in range(threads)
                                                 for i in range(each))
    assert 0 < len(fsyncs) < threads * each // 2  # one fsync served many puts


def test_a_put_waiting_for_room_leaves_the_loop_answering_the_takes_that_free_it(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1, capacity=2, keep_alive_ms=30_000)
    with Channel.open(config) as owner, Channel.open(config) as producer, \
            Channel.open(config) as consumer:
        put(owner, b"a")
        put(owner, b"b")  # full
        waiting = ThreadPoolExecutor(1).submit(put, producer, b"c")
        time.sleep(0.2)
        assert not waiting.done()  # waits for room (Flume's keep-alive)
        began = time.monotonic()
        assert take_all(consumer, 2) == [b"a", b"b"]  # answered although a put waits
        waiting.result(TIMEOUT)
        assert time.monotonic() - began < 5  # long before keep_alive_ms
        assert take_all(owner, 2) == [b"c"]


def test_a_frame_larger_than_one_read_does_not_hold_up_other_connections(
        owned: tuple[ChannelConfig, Channel]) -> None:
    config, owner = owned
    body = msgpack.packb([protocol.VERSION, "list_offsets", [], b"x" * (1 << 17)])
    sock = raw_connection(config)
    try:
        sock.sendall(protocol.LENGTH.pack(len(body)) + body[:1000])  # and stalls mid-frame
        with Channel.open(config) as client:
            meanwhile = ThreadPoolExecutor(1).submit(put, client, b"meanwhile")
            meanwhile.result(TIMEOUT)  # answered by the loop while that frame waits
            sock.sendall(body[1000:])
            reply = protocol.receive(sock)  # four fields: the owner says what is wrong
            assert reply[:2] == [1, "ValueError"] and "[version, op, args]" in reply[2]
    finally:
        sock.close()
    assert take_all(owner) == [b"meanwhile"]


def test_it_answers_hello_and_every_other_op_with_its_errors(
        owned: tuple[ChannelConfig, Channel]) -> None:
    config, owner = owned
    client = OwnerClient.connect(config, TIMEOUT)
    try:
        assert client.call(protocol.HELLO)["pid"] == os.getpid()
        with pytest.raises(UnknownOperationError):
            client.call("no_such_op")
        with pytest.raises(ValueError, match="version 99 is not supported"):
            sock = client._connection()
            protocol.send(sock, [99, "list_offsets", []])
            code, name, message, attributes = protocol.receive(sock)
            raise protocol.error_from_wire(name, message, attributes)
        assert client.list_offsets() == [(0, 0)]  # the connection still answers
    finally:
        client.close()


def test_a_request_that_is_not_a_list_is_refused_and_the_connection_kept(
        owned: tuple[ChannelConfig, Channel]) -> None:
    config, _owner = owned
    sock = raw_connection(config)
    protocol.send(sock, {"op": "hello"})
    reply = protocol.receive(sock)
    assert reply[:2] == [1, "ValueError"] and "[version, op, args]" in reply[2]
    protocol.send(sock, [protocol.VERSION, protocol.HELLO, []])
    assert protocol.receive(sock)[0] == 0
    sock.close()


def test_stop_lets_a_request_in_progress_reply_and_rolls_back_idle_takes(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1, capacity=1, keep_alive_ms=2_000)
    owner = Channel.open(config)
    put(owner, b"a")  # full
    taker = Channel.open(config)
    take = taker.take()
    assert take.take(1)[0].body == b"a"  # an open take on an idle connection
    producer = Channel.open(config)
    waiting = ThreadPoolExecutor(1).submit(put, producer, b"b")  # waits for room
    time.sleep(0.2)
    stopped = threading.Event()

    def stop() -> None:
        assert owner._server is not None
        owner._server.stop(grace_s=TIMEOUT)
        stopped.set()

    stopper = threading.Thread(target=stop)
    stopper.start()
    with pytest.raises(Exception, match="full"):  # its reply came: not a lost connection
        waiting.result(TIMEOUT)
    stopper.join(TIMEOUT)
    assert stopped.is_set()
    assert not (config.home / SOCKET_NAME).exists()
    assert owner.owner is not None and owner.owner.status()["events_in_flight"] == 0
    owner._server = None  # stopped above
    owner.close()
    for channel in (taker, producer):
        channel._closed = True  # their owner is gone; nothing of theirs to close


def connection_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith("-conn")]


def test_puts_and_takes_are_answered_by_the_loop_and_status_by_a_connection_thread(
        owned: tuple[ChannelConfig, Channel]) -> None:
    config, _owner = owned
    with Channel.open(config) as client:
        assert client.role == "client"
        put(client, b"a")
        assert take_all(client) == [b"a"]
        assert client.list_offsets() == [(0, 1)]
        assert connection_threads() == []  # no thread hand-off for any of those
        assert client.status()["role"] == "client"
        assert len(connection_threads()) == 1  # status: the connection's own thread
        put(client, b"b")  # then back to the loop
        assert take_all(client) == [b"b"]
    deadline = time.monotonic() + TIMEOUT
    while connection_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert connection_threads() == []  # it ended with its connection


def test_a_client_that_does_not_read_a_large_reply_never_stops_the_loop(
        owned: tuple[ChannelConfig, Channel]) -> None:
    config, owner = owned
    for start in range(0, 2_000, 500):
        with owner.put() as tx:
            for i in range(start, start + 500):
                tx.put(b"%04d" % i + b"x" * 1_000)  # 2 MB in all: more than a socket buffer
    sock = raw_connection(config)
    try:
        protocol.send(sock, [protocol.VERSION, "begin_take", [None, "default"]])
        code, take_id = protocol.receive(sock)
        assert code == 0
        protocol.send(sock, [protocol.VERSION, "take_events", [take_id, 2_000]])
        time.sleep(0.2)  # and reads nothing yet
        with Channel.open(config) as client:
            done = ThreadPoolExecutor(1).submit(
                lambda: (put(client, b"meanwhile"), client.list_offsets()))
            assert done.result(TIMEOUT)[1] == [(0, 2_001)]  # the loop answered
        code, rows = protocol.receive(sock)  # the whole reply, in order
        assert code == 0 and [row[5][:4] for row in rows] == [b"%04d" % i for i in range(2_000)]
        protocol.send(sock, [protocol.VERSION, "commit_take", [take_id]])
        assert protocol.receive(sock) == [0, None]  # the connection went back to the loop
    finally:
        sock.close()
    assert take_all(owner) == [b"meanwhile"]


def test_a_round_that_fails_is_logged_and_the_loop_goes_on(
        owned: tuple[ChannelConfig, Channel], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    config, owner = owned
    server = owner._server
    assert server is not None
    real = server._accept
    failures: list[int] = []

    def failing_once() -> None:
        if not failures:
            failures.append(1)
            raise RuntimeError("a bug in accept")
        real()

    monkeypatch.setattr(server, "_accept", failing_once)
    with caplog.at_level("ERROR", "channel_engine.owner.server"), \
            Channel.open(config) as client:
        assert client.role == "client"
        put(client, b"after")
    assert failures == [1] and "the owner's loop failed a round" in caplog.text
    assert "a bug in accept" in caplog.text
    assert take_all(owner) == [b"after"]


def hold_next_round(monkeypatch: pytest.MonkeyPatch, server: OwnerServer,
                    wait_s: float = 0.3, connections: int = 0) -> None:
    """Make the loop's next select wait `wait_s` first, or until `connections` client
    connections have a request ready (up to TIMEOUT), so what clients send meanwhile is read
    in one round (the listening socket's event last). Returns once the loop is held."""
    real = server._selector.select
    armed, held = [True], threading.Event()

    def ready_clients(events: list[Any]) -> int:
        return sum(isinstance(key.data, server_module._Connection) for key, _ in events)

    def select(timeout: float | None = None) -> list[Any]:
        if not armed:
            return real(timeout)
        armed.clear()
        held.set()
        if not connections:
            time.sleep(wait_s)
        deadline = time.monotonic() + TIMEOUT
        while connections and ready_clients(real(0)) < connections and \
                time.monotonic() < deadline:
            time.sleep(0.005)  # not a hot spin: the clients' threads need the GIL to send
        return sorted(real(timeout), key=lambda event: event[0].fileobj is server._listener)

    monkeypatch.setattr(server._selector, "select", select)
    server._wake()
    assert held.wait(TIMEOUT)  # the loop is in the held select now


def test_a_round_that_fails_after_a_put_began_still_answers_that_put(
        owned: tuple[ChannelConfig, Channel], monkeypatch: pytest.MonkeyPatch) -> None:
    config, owner = owned
    server = owner._server
    assert server is not None
    with Channel.open(config) as client:
        pool = ThreadPoolExecutor(1)  # one connection, idle in the loop
        pool.submit(put, client, b"warm").result(TIMEOUT)
        real = server._accept
        failures: list[int] = []

        def failing_once() -> None:  # e.g. epoll_ctl out of watches
            if not failures:
                failures.append(1)
                raise OSError(28, "no space left for another watch")
            real()

        monkeypatch.setattr(server, "_accept", failing_once)
        hold_next_round(monkeypatch, server)
        pending = pool.submit(put, client, b"begun")
        time.sleep(0.05)
        sock = raw_connection(config)  # a new connection in the same round, after the put
        try:
            pending.result(TIMEOUT)  # finished, not stranded
        finally:
            sock.close()
        assert failures == [1]
        assert take_all(owner) == [b"warm", b"begun"]
        assert owner.owner is not None and owner.owner.state.unresolved[0] == {}


def test_a_large_malformed_frame_closes_its_connection_and_rolls_back_its_take(
        owned: tuple[ChannelConfig, Channel]) -> None:
    config, owner = owned
    put(owner, b"a")
    sock = raw_connection(config)
    try:
        protocol.send(sock, [protocol.VERSION, "begin_take", [None, "default"]])
        code, take_id = protocol.receive(sock)
        protocol.send(sock, [protocol.VERSION, "take_events", [take_id, 10]])
        assert [row[5] for row in protocol.receive(sock)[1]] == [b"a"]
        body = b"\x93" + b"\xc1" * (1 << 17)  # an array, then a byte msgpack never uses
        sock.sendall(protocol.LENGTH.pack(len(body)) + body[:1_000])
        time.sleep(0.2)  # the rest comes later: the connection's thread reads it
        sock.sendall(body[1_000:])
        assert sock.recv(1) == b""  # the owner closed the connection
    finally:
        sock.close()
    assert owner.owner is not None
    deadline = time.monotonic() + TIMEOUT
    while ((connection_threads() or owner.owner.status()["events_in_flight"])
           and time.monotonic() < deadline):
        time.sleep(0.01)
    assert take_all(owner) == [b"a"]  # its take rolled back
    assert connection_threads() == []
    assert owner._server is not None and owner._server._connections == set()


def test_stop_does_not_wait_for_a_client_stalled_mid_frame(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1)
    owner = Channel.open(config)
    assert owner._server is not None
    sock = raw_connection(config)
    try:
        sock.sendall(b"\x00\x00")  # half a length prefix, then nothing: a stopped process
        time.sleep(0.2)
        assert len(connection_threads()) == 1  # waiting for the rest of the frame
        began = time.monotonic()
        owner._server.stop(grace_s=TIMEOUT)
        assert time.monotonic() - began < 2  # not its whole grace
        assert sock.recv(1) == b""  # closed
    finally:
        sock.close()
        owner._server = None  # stopped above
        owner.close()
    deadline = time.monotonic() + TIMEOUT
    while connection_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert connection_threads() == []


def keys_of_partitions(partitions: int) -> list[bytes]:
    """A key for each partition (the producer's murmur2 partitioner)."""
    found: dict[int, bytes] = {}
    for i in range(1_000):
        found.setdefault(key_partition(b"key-%d" % i, partitions), b"key-%d" % i)
    return [found[p] for p in range(partitions)]


def test_puts_on_several_partitions_in_one_round_are_fsynced_side_by_side(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(tmp_path, partitions=3)
    keys = keys_of_partitions(3)
    with Channel.open(config) as owner, Channel.open(config) as client:
        server = owner._server
        assert server is not None
        pools = [ThreadPoolExecutor(1) for _ in keys]  # a connection each

        def keyed_put(key: bytes) -> None:
            with client.put() as tx:
                tx.put(key, key=key)

        for pool, key in zip(pools, keys, strict=True):
            pool.submit(keyed_put, key).result(TIMEOUT)
        in_flight, most = [0], [0]
        lock = threading.Lock()
        real = os.fdatasync

        def slow_fdatasync(fd: int) -> None:  # a disk: each fsync takes a while
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            time.sleep(0.2)
            real(fd)
            with lock:
                in_flight[0] -= 1

        monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
        hold_next_round(monkeypatch, server)
        began = time.monotonic()
        puts = [pool.submit(keyed_put, key) for pool, key in zip(pools, keys, strict=True)]
        for done in puts:
            done.result(TIMEOUT)
        took = time.monotonic() - began
        monkeypatch.setattr(os, "fdatasync", real)
        assert most[0] == 3  # one round, its three logs fsynced at once
        assert took < 0.3 + 3 * 0.2  # the slowest fsync, not their sum, after the held select
        assert sorted(take_all(owner)) == sorted(keys * 2)


def test_a_connection_closed_while_its_put_waits_for_room_leaves_nothing_behind(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1, capacity=1, transaction_capacity=1,
                         keep_alive_ms=500)
    with Channel.open(config) as owner:
        put(owner, b"a")  # full
        encoded = put_batch.encode([PendingEvent(b"b")], put_batch.Partitioner(), 1, "none")
        sock = raw_connection(config)
        protocol.send(sock, [protocol.VERSION, "commit_batches",
                             protocol.COMMIT_BATCHES.args_to_wire(tuple(encoded))])
        time.sleep(0.2)
        assert len(connection_threads()) == 1  # the put waits for room there
        sock.close()  # its process is gone
        server = owner._server
        assert server is not None
        deadline = time.monotonic() + TIMEOUT
        while ((connection_threads() or server._connections)
               and time.monotonic() < deadline):
            time.sleep(0.01)
        assert connection_threads() == [] and server._connections == set()
        assert owner.owner is not None and owner.owner.state.unresolved[0] == {}
        assert take_all(owner, 1) == [b"a"]  # the refused put wrote nothing
        put(owner, b"c")  # and held no room
        assert take_all(owner, 1) == [b"c"]


def test_a_round_accepts_every_connection_waiting(
        owned: tuple[ChannelConfig, Channel], monkeypatch: pytest.MonkeyPatch) -> None:
    config, owner = owned
    server = owner._server
    assert server is not None
    hold_next_round(monkeypatch, server)  # the loop waits in that round's select now
    real = server._selector.select
    seen: list[int] = []  # connections known at each later select

    def select(timeout: float | None = None) -> list[Any]:
        seen.append(len(server._connections))
        return real(timeout)

    monkeypatch.setattr(server._selector, "select", select)
    socks = [raw_connection(config) for _ in range(5)]  # while the round is held
    try:
        deadline = time.monotonic() + TIMEOUT
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen[0] == 5  # one round took them all
        for sock in socks:  # and each is answered
            protocol.send(sock, [protocol.VERSION, protocol.HELLO, []])
            assert protocol.receive(sock)[0] == 0
    finally:
        for sock in socks:
            sock.close()


def test_a_server_that_fails_to_start_leaves_no_descriptor_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(tmp_path, partitions=1)
    owner = Channel.open(config)
    assert owner._server is not None and owner.owner is not None
    owner._server.stop()
    owner._server = None

    def no_selector() -> None:
        raise OSError(24, "too many open files")

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(selectors, "DefaultSelector", no_selector)
    with pytest.raises(OSError, match="too many open files"):
        OwnerServer(owner.owner)
    monkeypatch.undo()
    assert len(os.listdir("/proc/self/fd")) == before  # the listener and the home's closed
    owner.close()


def test_a_round_whose_fsyncs_fail_acknowledges_none_of_its_puts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(tmp_path, partitions=2)
    keys = keys_of_partitions(2)
    with Channel.open(config) as owner, Channel.open(config) as client:
        server = owner._server
        assert server is not None and owner.owner is not None
        pools = [ThreadPoolExecutor(1) for _ in range(3)]  # a connection each

        def keyed_put(key: bytes) -> str:
            try:
                with client.put() as tx:
                    tx.put(key, key=key)
            except Exception as exc:  # the owner's error, re-raised in the client
                return type(exc).__name__
            return "ok"

        round_keys = [keys[0], keys[1], keys[0]]  # both logs, one of them twice
        for pool, key in zip(pools, round_keys, strict=True):
            assert pool.submit(keyed_put, key).result(TIMEOUT) == "ok"

        def failing_fdatasync(fd: int) -> None:
            raise OSError(5, "input/output error")

        monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
        hold_next_round(monkeypatch, server)
        replies = [pool.submit(keyed_put, key) for pool, key in zip(pools, round_keys,
                                                                     strict=True)]
        assert [reply.result(TIMEOUT) for reply in replies] == ["LogOfflineError"] * 3
        monkeypatch.undo()  # the disk is back for closing
        state = owner.owner.state
        assert state.unresolved == [{}, {}]  # each aborted, none left pending
        assert owner.owner.counters["put_errors"] == 3
        assert owner.owner.counters["aborted_events"] == 3


def commit_in_one_round(config: ChannelConfig, owner: Channel, monkeypatch: pytest.MonkeyPatch,
                        fdatasync: Any, consumers: int = 4) -> list[tuple[str, float]]:
    """`consumers` takes (a connection each) committed in one round of the owner's loop,
    os.fdatasync replaced by `fdatasync` meanwhile: each one's outcome ("ok" or the error's
    class) and when it came back."""
    taken, armed = threading.Barrier(consumers + 1), threading.Event()
    answered: list[tuple[str, float]] = []

    def consume() -> None:  # a thread each: a connection each
        tx = client.take()
        tx.take(10)
        taken.wait(TIMEOUT)
        armed.wait(TIMEOUT)
        try:
            tx.commit()
            outcome = "ok"
        except Exception as exc:  # the owner's error, re-raised in the client
            outcome = type(exc).__name__
        answered.append((outcome, time.monotonic()))

    with Channel.open(config) as client:
        threads = [threading.Thread(target=consume) for _ in range(consumers)]
        for thread in threads:
            thread.start()
        taken.wait(TIMEOUT)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        hold_next_round(monkeypatch, owner._server, connections=consumers)  # one round
        armed.set()
        for thread in threads:
            thread.join(TIMEOUT)
        monkeypatch.undo()
    return answered


def test_take_commits_of_one_round_share_a_journal_fsync_done_before_their_replies(
        owned: tuple[ChannelConfig, Channel], monkeypatch: pytest.MonkeyPatch) -> None:
    config, owner = owned
    for i in range(40):
        put(owner, b"%d" % i)
    journal_fsyncs: list[float] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        real(fd)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".journal"):
            journal_fsyncs.append(time.monotonic())

    answered = commit_in_one_round(config, owner, monkeypatch, counted)
    assert [outcome for outcome, _ in answered] == ["ok"] * 4
    assert len(journal_fsyncs) == 1  # one fsync for the round's commits
    assert all(at >= journal_fsyncs[0] for _, at in answered)  # none acknowledged before it
    owner.close()
    with Channel.open(config) as reopened:  # the commits were durable: nothing comes back
        assert take_all(reopened) == []


def test_a_round_whose_journal_fsync_fails_acknowledges_none_of_its_commits(
        owned: tuple[ChannelConfig, Channel], monkeypatch: pytest.MonkeyPatch) -> None:
    config, owner = owned
    for i in range(50):
        put(owner, b"%d" % i)
    real = os.fdatasync

    def failing(fd: int) -> None:  # the journal's first fsync fails, the later ones not:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".journal") and not failed:
            failed.append(fd)  # pages it failed to write may be gone even so
            raise OSError(5, "input/output error")
        real(fd)

    failed: list[int] = []
    answered = commit_in_one_round(config, owner, monkeypatch, failing)
    assert [outcome for outcome, _ in answered] == ["JournalOfflineError"] * 4
    with Channel.open(config) as client, pytest.raises(JournalOfflineError), \
            client.take() as tx:  # and none after it, until a checkpoint
        assert len(tx.take(1)) == 1
    owner.checkpoint()  # holds the commits; a new journal
    with Channel.open(config) as client, client.take() as tx:
        assert len(tx.take(1)) == 1

"""The owner places a movable put (keyless, one partition) where concurrent puts wait for
their fsync (queue/put_placement.py), keeps keyed puts where their key goes, and still
answers a version 3 client, which sends no `movable`."""
from __future__ import annotations

import errno
import threading
from pathlib import Path

from channel_helpers import make_config

from channel_engine import Channel, PendingEvent
from channel_engine.errors import LogOfflineError
from channel_engine.owner import protocol
from channel_engine.owner.client import OwnerClient
from channel_engine.queue.put_batch import Partitioner, encode
from channel_engine.queue.put_placement import STICKY_BYTES, PutPlacement


def test_it_keeps_the_producers_pick_when_puts_come_one_at_a_time() -> None:
    placement = PutPlacement(3)
    for wanted in (0, 1, 2, 0):
        assert placement.place(wanted, 100) == wanted
        placement.finished(wanted)


def test_it_sends_a_put_to_the_partition_where_another_is_in_flight() -> None:
    placement = PutPlacement(3)
    assert placement.place(0, 100) == 0
    assert placement.place(1, 100) == 0  # joins the put waiting for partition 0's fsync
    assert placement.place(2, 100) == 0
    for _ in range(3):
        placement.finished(0)
    assert placement.place(1, 100) == 1  # nothing in flight: the producer's pick


def test_it_moves_on_after_sticky_bytes_even_under_constant_concurrency() -> None:
    placement = PutPlacement(3)
    assert placement.place(0, STICKY_BYTES - 10) == 0
    assert placement.place(1, 10) == 0  # just fits
    assert placement.place(2, 10) == 2  # partition 0 took its share: the next pick sticks
    assert placement.place(1, 10) == 2


def test_a_put_larger_than_what_is_left_stays_where_it_was_put_and_keeps_the_sticky() -> None:
    placement = PutPlacement(3)
    assert placement.place(0, 100) == 0
    assert placement.place(1, STICKY_BYTES - 99) == 1  # would delay the small puts of 0
    assert placement.place(2, 100) == 0  # partition 0 is still the sticky one
    assert placement.place(1, STICKY_BYTES) == 1


def test_a_failed_put_drops_the_stickiness_of_its_partition() -> None:
    placement = PutPlacement(3)
    assert placement.place(0, 100) == 0
    assert placement.place(1, 100) == 0
    placement.finished(0, failed=True)  # the other put on 0 is still in flight
    assert placement.place(2, 100) == 2
    assert placement.place(1, 100) == 2
    placement.finished(0)  # a success on a partition no longer sticky changes nothing
    assert placement.place(0, 100) == 2


def test_it_never_makes_an_unusable_partition_sticky() -> None:
    placement = PutPlacement(3, usable=lambda partition: partition != 0)
    assert placement.place(0, 100) == 0  # its producer's pick: where it would have gone
    assert placement.place(1, 100) == 1  # not drawn to partition 0
    assert placement.place(2, 100) == 1
    assert placement.place(0, 100) == 1


def test_healthy_puts_succeed_while_one_partition_is_offline(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=3, durability="fsync")
    with Channel.open(config) as owner_channel, Channel.open(config) as client_channel:
        assert owner_channel.owner is not None
        owner_channel.owner.state.logs[0].state.go_offline(OSError(errno.EIO, "EIO"),
                                                              "flushing")
        placement = owner_channel.owner.puts._placement
        placement.place(0, 10)  # a put in flight on partition 0, as it fails
        committed: list[int] = []
        failed: list[BaseException] = []

        def produce(channel: Channel) -> None:
            for i in range(30):
                try:
                    with channel.put() as tx:
                        tx.put(f"event {i}".encode())
                    committed.extend(p for p, _, _ in tx.committed)
                except LogOfflineError as exc:
                    failed.append(exc)

        threads = [threading.Thread(target=produce, args=(channel,))
                   for channel in [owner_channel, client_channel] * 2]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        placement.finished(0, failed=True)
        # a third of each channel's 60 puts are its round-robin's picks of partition 0: only
        # those may fail (some join a put in flight on a healthy partition instead)
        assert len(committed) + len(failed) == 120
        assert len(committed) >= 80 and set(committed) <= {1, 2}
        assert placement._in_flight == [0, 0, 0]  # finished() ran for the failed puts too


def test_no_put_moves_to_the_data_dir_of_the_last_disk_full_error(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=3)
    with Channel.open(config) as channel:
        assert channel.owner is not None
        puts = channel.owner.puts
        assert [puts._may_place_in(p) for p in range(3)] == [True, True, True]
        puts._disk_full = (config.partition_dir(2), 100, "no space")  # data-a: 0 and 2
        assert [puts._may_place_in(p) for p in range(3)] == [False, True, False]


def test_the_movable_flag_is_set_only_for_keyless_puts_of_a_channel_with_partitions() -> None:
    assert encode([PendingEvent(b"x")] * 2, Partitioner(), 3, "none").movable
    assert not encode([PendingEvent(b"x")], Partitioner(), 1, "none").movable
    assert not encode([PendingEvent(b"x", key=b"k")], Partitioner(), 3, "none").movable
    assert not encode([PendingEvent(b"x"), PendingEvent(b"y", key=b"k")], Partitioner(), 3,
                      "none").movable


def test_a_clients_keyless_put_joins_the_owners_put_in_flight_and_a_keyed_one_never_moves(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=3)
    with Channel.open(config) as owner_channel, Channel.open(config) as client_channel:
        assert client_channel.role == "client" and owner_channel.owner is not None
        placement = owner_channel.owner.puts._placement
        in_flight = placement.place(2, 10)  # a put of another worker, waiting for its fsync
        try:
            partitions = set()
            for i in range(3):  # the producer's round-robin would spread these over 0, 1, 2
                with client_channel.put() as tx:
                    tx.put(f"keyless-{i}".encode())
                partitions |= {p for p, _, _ in tx.committed}
            assert partitions == {in_flight}
            keyed = [PendingEvent(f"k{i}".encode(), key=f"key-{i}".encode()) for i in range(9)]
            with client_channel.put() as tx:
                tx.put_all(keyed)
            assert [p for p, _, _ in tx.committed] == \
                [p for p, _ in Partitioner().group(keyed, 3)]
        finally:
            placement.finished(in_flight)
        with client_channel.put() as tx:
            tx.put(b"alone")
        assert tx.committed[0][0] == 1  # nothing in flight: the producer's 5th pick
        with owner_channel.take() as take:
            assert len(take.take(100)) == 13


def test_concurrent_keyless_puts_all_land_and_each_is_answered_with_its_place(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=3, durability="fsync")
    with Channel.open(config) as owner_channel, Channel.open(config) as client_channel:
        answers: list[tuple[int, int, int]] = []

        def produce(channel: Channel, who: int) -> None:
            for i in range(40):
                with channel.put() as tx:
                    tx.put(f"{who}-{i}".encode())
                answers.extend(tx.committed)

        threads = [threading.Thread(target=produce, args=(channel, who))
                   for who, channel in enumerate([owner_channel, client_channel] * 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        by_place = {(p, first): (first, last) for p, first, last in answers}
        assert len(by_place) == 160 and all(first == last for first, last in by_place.values())
        with owner_channel.take() as take:
            events = take.take(1000)
        assert sorted((e.partition, e.offset) for e in events) == sorted(by_place)


def test_a_version_3_client_without_movable_is_still_answered(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as owner_channel:
        put = encode([PendingEvent(b"old client")], Partitioner(), 2, config.compression)
        client = OwnerClient.connect(config, 5.0)
        sock = client._connection()
        request = [3, "commit_batches",
                   [None, [[p, bytes(b)] for p, b in put.batches], put.partitions]]
        protocol.send(sock, request)
        status, committed = protocol.receive(sock)
        client.close()
        assert status == 0 and committed == [[put.batches[0][0], 0, 0]]
        assert owner_channel.read(put.batches[0][0], 0, 10)[0].body == b"old client"


def test_in_policy_durability_a_keyless_put_stays_where_its_producer_put_it(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=3, durability="policy",
                         flush_ms=1000)
    with Channel.open(config) as owner_channel, Channel.open(config) as client_channel:
        assert owner_channel.owner is not None
        placement = owner_channel.owner.puts._placement
        in_flight = placement.place(2, 10)  # no fsync to share in policy durability
        try:
            partitions = []
            for i in range(3):
                with client_channel.put() as tx:
                    tx.put(f"keyless-{i}".encode())
                partitions += [p for p, _, _ in tx.committed]
        finally:
            placement.finished(in_flight)
        assert partitions == [0, 1, 2]


def test_a_put_flagged_movable_whose_records_have_keys_is_never_moved(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=3)
    with Channel.open(config) as owner_channel:
        assert owner_channel.owner is not None
        keyed = [PendingEvent(b"keyed", key=b"key-1")]
        (wanted, batch), = encode(keyed, Partitioner(), 3, "none").batches
        placement = owner_channel.owner.puts._placement
        in_flight = placement.place((wanted + 1) % 3, 10)
        try:
            committed = owner_channel.owner.commit_batches(None, [(wanted, batch)], 3,
                                                           movable=True)  # a lying client
            plain = encode([PendingEvent(b"keyless")], Partitioner(), 3, "none")
            moved = owner_channel.owner.commit_batches(None, plain.batches, 3, movable=True)
        finally:
            placement.finished(in_flight)
        assert committed[0][0] == wanted and moved[0][0] == in_flight
        assert placement._in_flight == [0, 0, 0]

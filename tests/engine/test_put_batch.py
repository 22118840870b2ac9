"""Puts travel to the owner encoded (queue/put_batch.py): the producer's checks name the event,
and the owner refuses any batch it should not append, writing nothing."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from channel_helpers import make_config

from channel_engine import Channel, InvalidEventError, PartitionCountError, PendingEvent
from channel_engine.log import record_batch
from channel_engine.queue.put_batch import Partitioner, encode

pytestmark = pytest.mark.usefixtures("each_codec")  # conftest.py: both codecs


def test_put_all_checks_every_event_first_and_adds_none_if_one_is_bad(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path)) as channel:
        tx = channel.put()
        tx.put(b"first")
        good = [PendingEvent(b"plain"), PendingEvent(b"keyed", key=b"k"),
                PendingEvent(b"full", b"k", {"h": b"v"}, 5)]
        bad_ones = [(PendingEvent("text"), "body"), (PendingEvent(b"x", key="k"), "key"),
                    (PendingEvent(b"x", headers={"h": 5}), "headers.h"),
                    (PendingEvent(b"x", timestamp=-1), "timestamp"),
                    (PendingEvent(b"x", timestamp=True), "timestamp")]
        for bad, field in bad_ones:
            with pytest.raises(InvalidEventError) as info:
                tx.put_all([*good, bad, *good])
            assert (info.value.index, info.value.field) == (1 + len(good), field)
        assert len(tx) == 1
        tx.put_all(good)
        tx.commit()
        with channel.take() as take:
            assert [e.body for e in take.take(10)] == [b"first", b"plain", b"keyed", b"full"]


def test_an_encoding_error_names_the_events_index_in_the_whole_put() -> None:
    events = [PendingEvent(b"a", key=b"one"), PendingEvent(b"b", key=b"two"),
              PendingEvent(b"c", key=b"three", headers={"\udcff": b"v"})]  # not UTF-8
    with pytest.raises(InvalidEventError) as info:
        encode(events, Partitioner(), 4, "none")
    assert info.value.index == 2 and info.value.field.startswith("headers")


def test_keyless_puts_rotate_and_keyed_ones_follow_murmur2() -> None:
    partitioner = Partitioner()
    picks = [partitioner.group([PendingEvent(b"x")] * 3, 3)[0][0] for _ in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]
    groups = partitioner.group([PendingEvent(b"x", key=b"a"), PendingEvent(b"y")], 3)
    assert sum(len(indexes) for _, indexes in groups) == 2


def damaged(how: str) -> tuple[int | None, list[tuple[int, bytes | bytearray]]]:
    put = encode([PendingEvent(b"body")], Partitioner(), 2, "none")
    batch = bytearray(put.batches[0][1])
    partition = put.batches[0][0]
    if how == "crc":
        batch[-1] ^= 0xFF
    elif how == "trailing":
        batch += b"\0"
    elif how == "cut":
        batch = batch[:-1]
    elif how == "encrypted":
        attributes = record_batch.read_header(batch).attributes | record_batch.ENCRYPTED_MASK
        struct.pack_into(">h", batch, record_batch.ATTRIBUTES_AT, attributes)
        struct.pack_into(">I", batch, 17, record_batch.compute_crc(batch))
    elif how == "base offset":
        record_batch.set_base_offset(batch, 7)
    elif how == "stamped committed":
        struct.pack_into(">i", batch, record_batch.LEADER_EPOCH_AT, record_batch.COMMITTED_EPOCH)
    elif how == "partition":
        partition = 9
    elif how == "transaction":
        return 12345, [(partition, batch)]
    elif how == "twice":
        return 12345, [(partition, batch), (partition, batch)]
    elif how == "none":
        return None, []
    return None, [(partition, batch)]


@pytest.mark.parametrize("how", ["crc", "trailing", "cut", "encrypted", "base offset",
                                 "stamped committed",
                                 "partition", "transaction", "twice", "none"])
def test_the_owner_refuses_a_batch_it_should_not_append(tmp_path: Path, how: str) -> None:
    with Channel.open(make_config(tmp_path, partitions=2)) as channel:
        owner = channel.owner
        assert owner is not None
        transaction_id, batches = damaged(how)
        with pytest.raises(ValueError):
            owner.commit_batches(transaction_id, batches, 2)
        assert channel.status()["events_untaken"] == 0
        assert [p["log_end_offset"] for p in channel.status()["partitions"]] == [0, 0]


def test_a_producer_that_knows_fewer_partitions_follows_the_owners_count(
        tmp_path: Path) -> None:
    """The channel grew to 4 partitions; a process that opened it with 2 still puts, and
    its keys land where the owner's count sends them."""
    config = make_config(tmp_path, partitions=4)
    with Channel.open(config) as owner, Channel.open(config.replace(partitions=2)) as stale:
        assert stale.role == "client"
        events = [PendingEvent(f"{i}".encode(), key=f"key-{i}".encode()) for i in range(40)]
        with stale.put() as tx:
            tx.put_all(events)
        expected = Partitioner().group(events, 4)
        assert [p for p, _, _ in tx.committed] == [p for p, _ in expected]
        with owner.take() as take:
            assert len(take.take(100)) == 40
    with pytest.raises(PartitionCountError), Channel.open(config) as owner:
        put = encode([PendingEvent(b"x")], Partitioner(), 2, "none")
        assert owner.owner is not None
        owner.owner.commit_batches(put.transaction_id, put.batches, put.partitions)

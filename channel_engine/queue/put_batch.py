"""A put transaction as it travels to the owner: events grouped by partition and
encoded as record batches by the process that put them, as a Kafka producer does.

Encoding where the events are put spreads the per-event work over every process
that produces (each gunicorn worker, say) instead of piling it onto the owner,
and the owner socket carries one byte string per partition instead of a list of
events. The owner then only checks each batch, encrypts it if the channel is
encrypted, and appends it (ChannelOwner.commit_batches).

Partitioning (Kafka's default partitioner): an event with a key goes to
murmur2(key) % partitions; every keyless event of one transaction goes to one
partition, chosen round-robin per transaction by the producing process (Kafka's
sticky partitioner is per producer too). Such a put is `movable`: the owner may
append it to another partition, one where concurrent puts are waiting for their
fsync, so that one fsync carries them all (queue/put_placement.py); a put with
a key never moves.

A put that touches several partitions gets a random 63-bit transaction id and its
batches are transactional (record_batch: attribute bit 4, the id in producerId);
the owner journals its commit. What the owner accepts from a client, per batch:

    check                                  why
    -------------------------------------  ----------------------------------------
    header sound (magic 2, counts agree)   record_batch.check_header
    batch length == bytes sent             nothing trails or is missing
    base offset 0, CRC-32C matches         not damaged on the way
    transactional bit and producerId       match the transaction id sent with it
    not encrypted, not a control batch     the owner seals; Weir writes no markers
    CreateTime, a known codec              what Weir's readers expect
    partitionLeaderEpoch -1                outside the CRC; 0 means "commit stamped"
    grouped for the owner's partitions     else PartitionCountError: encode again
    partition in range, once per put       one batch per partition touched

The records inside are trusted once the CRC matches: clients are processes of
the same user (the owner checks SO_PEERCRED) running this code.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import NamedTuple

from aiokafka.partitioner import murmur2

from channel_engine.errors import InvalidBatch, InvalidEventError
from channel_engine.event import PendingEvent
from channel_engine.log import record_batch

CONTROL_MASK = 0x20  # Kafka's isControl bit: a transaction marker, never in a put


Batches = Sequence[tuple[int, bytes | bytearray]]  # (partition, encoded batch), sorted


class EncodedPut(NamedTuple):
    """A put transaction ready for the owner: (partition, batch) sorted by partition."""

    transaction_id: int | None
    batches: list[tuple[int, bytearray]]
    partitions: int  # the partition count the events were grouped for
    movable: bool  # keyless, one partition: the owner may choose another (module doc)


class Partitioner:
    """Kafka's default partitioner for one producing process (thread-safe)."""

    def __init__(self) -> None:
        self._next = 0
        self._lock = threading.Lock()

    def group(self, events: Sequence[PendingEvent],
              partitions: int) -> list[tuple[int, range | list[int]]]:
        """Which events go where: (partition, indexes into events), sorted by partition;
        murmur2(key), or one round-robin pick for all keyless events."""
        if partitions == 1:
            return [(0, range(len(events)))]
        with self._lock:
            sticky = self._next % partitions
            self._next = sticky + 1
        keys = [event[1] for event in events]
        if keys.count(None) == len(keys):  # no keys (the common case): all go to one
            return [(sticky, range(len(events)))]
        groups: dict[int, list[int]] = {}
        for index, event in enumerate(events):
            key = event.key
            partition = sticky if key is None else (murmur2(bytes(key)) & 0x7FFFFFFF) % partitions
            groups.setdefault(partition, []).append(index)
        return sorted(groups.items())


def encode(events: Sequence[PendingEvent], partitioner: Partitioner, partitions: int,
           compression: str) -> EncodedPut:
    """Group and encode a put's events; InvalidEventError (naming the event's index in the
    transaction) before anything leaves this process."""
    groups = partitioner.group(events, partitions)
    transaction_id = None if len(groups) == 1 else new_transaction_id()
    codec = record_batch.COMPRESSION_CODECS[compression]
    batches = []
    for partition, indexes in groups:
        members = events if len(indexes) == len(events) else [events[i] for i in indexes]
        try:
            batches.append((partition, record_batch.build(members, codec, transaction_id)))
        except InvalidEventError as exc:  # it names the index in the batch: say the put's
            raise InvalidEventError(indexes[exc.index], exc.field, exc.reason) from exc
    movable = partitions > 1 and all(event.key is None for event in events)
    return EncodedPut(transaction_id, batches, partitions, movable)


def new_transaction_id() -> int:
    """A fresh put transaction id."""
    # Random, not a counter: ids must not repeat across processes and restarts, and a
    # restart after a crash knows nothing of the ids the dead process used.
    return int.from_bytes(os.urandom(8), "big") >> 1


def check(batch: bytes | bytearray, partition: int, partitions: int,
          transaction_id: int | None) -> record_batch.BatchHeader:
    """The header of a batch a producer sent, if the owner may append it; else ValueError
    saying what is wrong with it."""
    where = f"put batch for partition {partition}"
    if type(partition) is not int or not 0 <= partition < partitions:
        raise ValueError(f"{where}: no such partition (the channel has {partitions})")
    try:
        header = record_batch.check_header(batch, 0, 0)
        if header.size != len(batch):
            raise InvalidBatch(
                "corrupt", f"{len(batch)} bytes sent, the header says {header.size}")
        record_batch.check_crc(batch, 0, header)
    except InvalidBatch as exc:
        raise ValueError(f"{where}: {exc.reason}") from None
    if header.attributes & (record_batch.ENCRYPTED_MASK | CONTROL_MASK |
                            record_batch.TIMESTAMP_TYPE_MASK):
        raise ValueError(f"{where}: encrypted, control or LogAppendTime batches are not "
                         "accepted")
    if (header.attributes & record_batch.CODEC_MASK) not in record_batch.CODEC_NAMES:
        raise ValueError(f"{where}: unknown compression codec")
    if header.leader_epoch != -1:  # outside the CRC; 0 would mean "commit stamped"
        raise ValueError(f"{where}: partitionLeaderEpoch {header.leader_epoch}, expected -1")
    if header.transaction_id != transaction_id:
        raise ValueError(f"{where}: transaction id {header.transaction_id} in the batch, "
                         f"{transaction_id} with the put")
    return header

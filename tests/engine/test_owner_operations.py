"""The owner's operations are written once: OwnerOperations (queue/operations.py) names
them; ChannelOwner, OwnerClient and the server's table (protocol.OPERATIONS) must each
offer exactly those, with the same parameters, and the client must answer each as the
owner does."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from channel_helpers import make_config

from channel_engine import Channel, Event, UnknownOperationError
from channel_engine.event import make_event
from channel_engine.owner import protocol, server
from channel_engine.owner.client import OwnerClient
from channel_engine.queue.channel_owner import ChannelOwner
from channel_engine.queue.checkpointer import CheckpointResult
from channel_engine.queue.operations import OwnerOperations
from channel_engine.queue.put_batch import Partitioner, encode


def operations() -> dict[str, inspect.Signature]:
    """Every operation of the protocol and its signature."""
    return {name: inspect.signature(member)
            for name, member in vars(OwnerOperations).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def parameters(signature: inspect.Signature) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in signature.parameters.values()]


def test_the_protocol_names_every_operation_the_server_answers() -> None:
    assert set(operations()) == set(protocol.OPERATIONS)
    assert all(name == op.name for name, op in protocol.OPERATIONS.items())


def test_the_client_offers_every_operation_with_the_same_parameters() -> None:
    for name, signature in operations().items():
        method = getattr(OwnerClient, name, None)
        assert method is not None, f"OwnerClient has no {name}"
        assert parameters(inspect.signature(method)) == parameters(signature), name


def test_the_owner_offers_every_operation_with_the_same_parameters() -> None:
    for name, signature in operations().items():
        method = getattr(ChannelOwner, name, None)
        assert method is not None, f"ChannelOwner has no {name}"
        assert parameters(inspect.signature(method)) == parameters(signature), name


def test_it_covers_the_operations_that_move_the_queue() -> None:
    assert {"commit_batches", "begin_take", "take_events", "reserve_ranges", "commit_take",
            "rollback_take", "flush", "flush_if_due", "checkpoint", "checkpoint_if_due",
            "apply_retention", "status", "read", "offsets_for_time", "list_offsets",
            "acknowledge_losses"} <= set(operations())


def test_only_take_operations_change_a_connections_takes() -> None:
    assert {name for name, op in protocol.OPERATIONS.items() if op.takes} == {
        "begin_take", "commit_take", "rollback_take"}


# -- one conformance run: the client answers as the owner does ----------------------------
def test_the_client_answers_every_operation_as_the_owner_does(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as channel:
        owner = channel.owner
        assert owner is not None
        client = OwnerClient.connect(config, 5.0)
        try:
            put = encode([make_event(i, f"e{i}".encode(), str(i).encode(), None, 1_000 + i)
                          for i in range(6)], Partitioner(), 2, config.compression)
            committed = client.commit_batches(put.transaction_id, put.batches, put.partitions)
            assert sum(last - first + 1 for _, first, last in committed) == 6
            assert all(isinstance(p, int) for row in committed for p in row)
            assert client.read(0, 0, 10) == owner.read(0, 0, 10)
            assert client.read(1, 0, 10) == owner.read(1, 0, 10)
            assert client.offsets_for_time(0, 0) == owner.offsets_for_time(0, 0) == 0
            partitions = owner.status()["partitions"]
            assert client.list_offsets() == owner.list_offsets() == [
                (p["log_start_offset"], p["last_stable_offset"]) for p in partitions]
            assert sum(end - start for start, end in owner.list_offsets()) == 6
            assert client.offsets_for_time(0, 10**12) is owner.offsets_for_time(0, 10**12)
            take = client.begin_take()
            taken = client.take_events(take, 2)
            assert len(taken) == 2 and all(isinstance(e, Event) for e in taken)
            client.commit_take(take)
            leased = client.begin_take(60_000)
            ranges = client.reserve_ranges(leased, 10)
            assert sum(end - start for _, start, end in ranges) == 4
            client.rollback_take(leased)
            client.count_rollback()
            client.count_failed_put(3)
            client.flush()
            assert client.flush_if_due() is False
            result = client.checkpoint()
            assert isinstance(result, CheckpointResult)
            assert result.sequence == owner.status()["checkpoint"]["sequence"]
            assert client.checkpoint_if_due() is None  # the interval has not passed
            assert client.apply_retention().keys() == owner.apply_retention().keys()
            assert client.acknowledge_losses() == 0
            status = client.status(True)
            assert status["events_untaken"] == 4 and "segment_table" in status["partitions"][0]
            assert status["counters"] == owner.status()["counters"]
            assert status["counters"]["put_errors"] == 1  # the failed put counted
        finally:
            client.close()


# -- a rolling upgrade: an owner older than an operation ------------------------------------
def test_an_unknown_operation_is_a_typed_error(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config):
        client = OwnerClient.connect(config, 5.0)
        try:
            with pytest.raises(UnknownOperationError) as caught:
                client.call("no_such_op")
            assert caught.value.op == "no_such_op"
        finally:
            client.close()


def test_list_offsets_asks_status_of_an_owner_older_than_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An owner of the version before list_offsets answers ValueError("unknown owner op
    ..."); a newer process's list_offsets falls back to status() instead of failing."""
    real = server._dispatch

    def old_owner(owner: ChannelOwner, request: list[Any], takes: set[int]) -> Any:
        if request[1] == "list_offsets":
            raise ValueError(f"unknown owner op {request[1]!r}")  # as that version did
        return real(owner, request, takes)

    monkeypatch.setattr(server, "_dispatch", old_owner)
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as owning:
        with owning.put() as tx:
            for i in range(5):
                tx.put(b"e%d" % i, key=b"%d" % i)
        with Channel.open(config) as other:
            assert other.role == "client"
            assert other.list_offsets() == owning.list_offsets()
            assert sum(end - start for start, end in other.list_offsets()) == 5

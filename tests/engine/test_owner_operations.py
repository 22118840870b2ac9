"""The owner's operations are written once: OwnerOperations (queue/operations.py) names
them; ChannelOwner, OwnerClient and the server's table (protocol.OPERATIONS) must each
offer exactly those, with the same parameters."""
from __future__ import annotations

import inspect

from channel_engine.owner import protocol
from channel_engine.owner.client import OwnerClient
from channel_engine.queue.channel_owner import ChannelOwner
from channel_engine.queue.operations import OwnerOperations


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
            "apply_retention", "status", "read", "offsets_for_time",
            "acknowledge_losses"} <= set(operations())


def test_only_take_operations_change_a_connections_takes() -> None:
    assert {name for name, op in protocol.OPERATIONS.items() if op.takes} == {
        "begin_take", "commit_take", "rollback_take"}

"""Subscription management: add, reset and remove a channel's subscriptions, for the API
(appliance/api/subscriptions.py) and the UI alike.

    position(value, partitions)   a request's "start" / "to" as the engine's position
    add(row, name, start)         POST   .../subscriptions
    reset(row, name, to)          POST   .../subscriptions/{sub}/reset
    remove(row, name)             DELETE .../subscriptions/{sub}

A refusal of the request itself is ValueError (a bad name or position: the API's 400
naming the field); one of the channel's state is the engine's error (unknown, exists,
busy) or Refused (409: `default`, or the subscription a scheduled export drains).

The subscription a scheduled export drains (appliance.manage_channels keeps it) cannot be
removed: a removal and a change of the channel serialise on channel_dirs.lock(), so a
remove never takes the subscription a change just gave the export.
"""
from __future__ import annotations

from typing import Any

from django.db import transaction

from appliance import channel_dirs, channels
from appliance.manage_channels import Refused
from appliance.models import Channel
from channel_engine import (
    DEFAULT_SUBSCRIPTION,
    SUBSCRIPTION_NAME_PATTERN,
    UnknownSubscriptionError,
    check_subscription_name,
)

NAME_PATTERN = f"^{SUBSCRIPTION_NAME_PATTERN}$"
MAX_I64 = 2**63 - 1


def position(value: Any, partitions: int) -> Any:
    """The engine's position for "earliest", "latest", {"timestamp_ms": t} or
    {"offsets": {"<partition>": offset}}; ValueError saying what is wrong."""
    if value in ("earliest", "latest"):
        return value
    if isinstance(value, dict) and set(value) == {"timestamp_ms"}:
        stamp = value["timestamp_ms"]
        if type(stamp) is int and 0 <= stamp <= MAX_I64:
            return value
        raise ValueError("timestamp_ms must be an integer >= 0 (ms since the epoch)")
    if isinstance(value, dict) and set(value) == {"offsets"}:
        return _offsets(value["offsets"], partitions)
    raise ValueError('expected "earliest", "latest", {"timestamp_ms": t} or '
                     '{"offsets": {"<partition>": offset}}')


def _offsets(offsets: Any, partitions: int) -> dict[int, int]:
    """{"<partition>": offset} as {partition: offset}, each partition the channel's once."""
    if not isinstance(offsets, dict) or not offsets:
        raise ValueError("offsets must be an object of partition -> offset")
    heads = {}
    for key, offset in offsets.items():
        if not (key.isascii() and key.isdigit() and int(key) < partitions):
            raise ValueError(f"offsets: the channel has partitions 0 to {partitions - 1}, "
                             f"not {key!r}")
        if int(key) in heads:
            raise ValueError(f"offsets: partition {int(key)} is named twice")
        if type(offset) is not int or not 0 <= offset <= MAX_I64:
            raise ValueError(f"offsets: partition {key}'s offset must be an integer >= 0")
        heads[int(key)] = offset
    return heads


def add(row: Channel, name: str, start: Any) -> None:
    """Add a subscription at `start` (a position); durable on return."""
    channels.open_channel(row).add_subscription(check_subscription_name(name), start)


def reset(row: Channel, name: str, to: Any) -> None:
    """Move a subscription with no take open to `to` (a position); durable on return."""
    channels.open_channel(row).reset_subscription(name, to)


def remove(row: Channel, name: str) -> None:
    """Remove a subscription with no take open: never `default`, nor the one a scheduled
    export drains (Refused, 409)."""
    if name == DEFAULT_SUBSCRIPTION:
        raise Refused({"subscription": ["'default' cannot be removed: takes that name no "
                                        "subscription use it"]}, status=409)
    channel = channels.open_channel(row)
    known = channel.subscriptions()
    if name not in known:
        raise UnknownSubscriptionError(row.name, name, known)
    with transaction.atomic():
        channel_dirs.lock()  # no change of the channel meanwhile (module doc)
        current = Channel.objects.get(pk=row.pk)
        if name == current.export_subscription and current.export_interval_ms is not None:
            raise Refused({"subscription": [
                f"the channel's scheduled export drains {name!r}: set export_subscription "
                "to another first (or unschedule the export)"]}, status=409)
        if (name == current.kafka_subscription and current.kafka_topic
                and current.kafka_interval_ms is not None):
            raise Refused({"subscription": [
                f"the channel's scheduled Kafka sink drains {name!r}: set kafka_subscription "
                "to another first (or unschedule the sink)"]}, status=409)
        channel.remove_subscription(name)

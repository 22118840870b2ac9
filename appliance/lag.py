"""How far behind a channel's subscriptions are: events untaken and the age of the oldest,
per subscription, from the engine's status (the API, /metrics, the UI).

The oldest untaken event of a subscription is the first event at or after its
taken_through on some partition (its head; an event in flight is still untaken): one read
of one event per partition with events untaken. A head the log no longer serves (retention
dropped it meanwhile) or cannot read (damage: the channel's status says so) is passed over.
"""
from __future__ import annotations

import time
from typing import Any

from appliance import channels
from appliance.models import Channel
from channel_engine import ChannelEngineError


def oldest_untaken_ms(row: Channel, partitions: list[dict[str, Any]]) -> int | None:
    """The timestamp of the oldest untaken event of a queue's partitions (each with
    partition, taken_through and events_untaken, as the engine's status gives them)."""
    channel = channels.open_channel(row)
    oldest = None
    for part in partitions:
        if part["events_untaken"] <= 0:
            continue
        try:
            head = channel.read(part["partition"], part["taken_through"], 1)
        except (ChannelEngineError, OSError):
            continue
        if head and (oldest is None or head[0].timestamp < oldest):
            oldest = head[0].timestamp
    return oldest


def subscription_lag(row: Channel, status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per subscription: its figures from `status`, with oldest_untaken_timestamp_ms and
    oldest_untaken_age_ms (None when it has nothing untaken), `export` and `kafka` (whether
    the export, the Kafka sink drains it)."""
    now_ms = int(time.time() * 1000)
    lag = {}
    for name, sub in status["subscriptions"].items():
        oldest = oldest_untaken_ms(row, sub["partitions"])
        lag[name] = {"name": name, **{k: v for k, v in sub.items() if k != "id"},
                     "oldest_untaken_timestamp_ms": oldest,
                     "oldest_untaken_age_ms": None if oldest is None else max(0, now_ms - oldest),
                     "export": name == row.export_subscription,
                     "kafka": bool(row.kafka_topic) and name == row.kafka_subscription}
    return lag

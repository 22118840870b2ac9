"""Put events into a channel: the one produce path, for the API (POST
/api/v1/channels/{name}/events) and the UI's "produce a test event".

One call is one put transaction: every event is committed or none is. Refusals are
problems (appliance/api/problems.py): more events than the channel's transaction_capacity
(413 too-many-events), puts paused by an operator (503 puts-paused); the engine's own
errors (channel full, disk guard, ...) are raised as they are, and api/handler.py's
to_problem tells each caller what they mean.
"""
from __future__ import annotations

from appliance import channels
from appliance.api.problems import Problem, retry_later
from appliance.models import Channel
from channel_engine import PendingEvent

PUT_ERROR = "weir.put_error"  # environ key: the fast path's put failed with this (to answer)


def put_events(row: Channel, events: list[PendingEvent]) -> list[tuple[int, int, int]]:
    """Commit `events` in one transaction; (partition, first offset, last offset) of each."""
    if len(events) > row.transaction_capacity:
        raise Problem(413, "too-many-events",
                      f"{len(events)} events exceed this channel's "
                      f"transaction_capacity={row.transaction_capacity}",
                      field="transaction_capacity")
    if row.puts_paused:
        raise retry_later(503, "puts-paused",
                          f"puts to channel {row.name!r} are paused by an operator")
    with channels.open_channel(row).put() as tx:
        tx.put_all(events)
    return list(tx.committed)

"""GET /api/v1/channels/{name}/partitions/{p}/events — events of one partition by offset
or by time, without taking them (reading never moves the queue); and the event's JSON
shape, which takes share.

    ?offset=O&limit=N        from offset O
    ?timestamp=MS&limit=N    from the first event at or after MS
    -> 200 {"events": [event, ...], "next_offset"}   416 [offset-out-of-range]: the problem
                                                     names the log's start and end offsets

Committed events only, as a Kafka consumer with isolation.level=read_committed sees them:
offsets may skip, where a put that touched several partitions failed part way (its batches
stay in the log, aborted) or where damage was counted lost; next_offset follows the last
event returned.
"""
from __future__ import annotations

import base64
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels
from appliance.api.base import ApiView
from appliance.api.schema import errors
from appliance.models import Channel
from channel_engine import Event
from channel_engine.event import utf8_text

MAX_EVENTS_PER_PAGE = 1000
INT64_MAX = 2**63 - 1  # offsets, timestamps and ids are int64 (Kafka's, and the database's)


class EventOut(serializers.Serializer):
    """An event as the API shows it (for the OpenAPI schema)."""

    partition = serializers.IntegerField()
    offset = serializers.IntegerField()
    timestamp = serializers.IntegerField()
    key = serializers.CharField(allow_null=True)
    headers = serializers.DictField(child=serializers.CharField(allow_null=True))
    body = serializers.CharField(allow_null=True)
    body_base64 = serializers.CharField()


def event_json(event: Event) -> dict[str, Any]:
    """An event as the API shows it."""
    return {"partition": event.partition, "offset": event.offset,
            "timestamp": event.timestamp, "key": utf8_text(event.key),
            "headers": {k: utf8_text(v) for k, v in event.headers.items()},
            "body": utf8_text(event.body), "body_base64": base64.b64encode(event.body).decode()}


def check_partition(row: Channel, partition: int) -> None:
    """A 400 problem unless the channel has this partition."""
    if partition >= row.partitions:
        raise ValidationError({"partition": [f"channel {row.name!r} has partitions 0.."
                                             f"{row.partitions - 1}"]})


class _EventsPage(serializers.Serializer):  # for the OpenAPI schema
    events = EventOut(many=True)
    next_offset = serializers.IntegerField(allow_null=True)


class EventQuery(serializers.Serializer):
    """Where to start reading: an offset, or the first event at or after a time."""

    offset = serializers.IntegerField(min_value=0, max_value=INT64_MAX, required=False)
    timestamp = serializers.IntegerField(min_value=0, max_value=INT64_MAX, required=False)
    limit = serializers.IntegerField(min_value=1, max_value=MAX_EVENTS_PER_PAGE, default=100)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("offset" in attrs) == ("timestamp" in attrs):
            raise serializers.ValidationError("give offset or timestamp, not both or neither")
        return attrs


class EventsView(ApiView):
    """Events of one partition, by offset or by time (paginated by next_offset)."""

    role = "admin"
    fresh_row = True

    @extend_schema(parameters=[
        OpenApiParameter("partition", {"type": "integer", "minimum": 0},
                         OpenApiParameter.PATH),
        OpenApiParameter("offset", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                         description="first offset to read (give offset or timestamp)"),
        OpenApiParameter("timestamp", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                         description="read from the first event at or after this time (ms)"),
        OpenApiParameter("limit", {"type": "integer", "minimum": 1,
                                   "maximum": MAX_EVENTS_PER_PAGE, "default": 100})],
        responses={200: _EventsPage,
                   **errors(400, 404, 416, 503)})
    def get(self, request: Request, name: str, partition: int) -> Response:
        """Read events without taking them."""
        row = self.row
        query = EventQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        check_partition(row, partition)
        channel = channels.open_channel(row)
        offset = query.validated_data.get("offset")
        if offset is None:
            offset = channel.offsets_for_time(partition, query.validated_data["timestamp"])
            if offset is None:
                return Response({"events": [], "next_offset": None})
        # an offset outside the log: 416 offset-out-of-range (api/handler.py)
        events = channel.read(partition, offset, query.validated_data["limit"])
        next_offset = events[-1].offset + 1 if events else offset
        return Response({"events": [event_json(e) for e in events], "next_offset": next_offset})

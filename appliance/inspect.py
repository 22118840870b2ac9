"""Read-only views of channels: list, detail (partitions, segments, checkpoint, counters,
health) and events by offset or by time. Reading never moves the queue.

    GET /api/v1/channels
    GET /api/v1/channels/{name}
    GET /api/v1/channels/{name}/partitions/{p}/events?offset=O&limit=N
    GET /api/v1/channels/{name}/partitions/{p}/events?timestamp=MS&limit=N
"""
from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from appliance import channels
from appliance.consume import _Event, event_json
from appliance.models import Channel
from appliance.permissions import HasRole, allowed
from appliance.produce import errors
from channel_engine import OffsetOutOfRangeError

MAX_EVENTS_PER_PAGE = 1000


def summary(row: Channel) -> dict[str, Any]:
    """What the channel list shows of one channel."""
    status = channels.open_channel(row).status()
    return {"name": row.name, "partitions": row.partitions, "puts_paused": row.puts_paused,
            **{k: status[k] for k in ("capacity", "events_queued", "events_untaken",
                                      "events_in_flight", "fill_percent", "unflushed_events",
                                      "bytes_on_disk", "health", "health_reason")}}


def detail(row: Channel) -> dict[str, Any]:
    """Everything about one channel: its settings, status and segment tables."""
    channel = channels.open_channel(row)
    status = channel.status()
    owner = channel.owner
    if owner is not None:
        for part, log in zip(status["partitions"], owner.logs, strict=True):
            part["segment_table"] = [vars(info) for info in log.segment_infos()]
    return {"settings": channels.to_config(row).to_dict(), "puts_paused": row.puts_paused,
            "status": status}


DETAIL = {"type": "object", "required": ["settings", "puts_paused", "status"],
          "additionalProperties": False,
          "properties": {"settings": {"type": "object"}, "puts_paused": {"type": "boolean"},
                         "status": {"type": "object"}}}
_OUT_OF_RANGE = {"type": "object", "required": ["offset", "log_start_offset", "log_end_offset"],
                 "properties": {"offset": {"type": "array", "items": {"type": "string"}},
                                "log_start_offset": {"type": "integer"},
                                "log_end_offset": {"type": "integer"}}}


class _EventsPage(serializers.Serializer):  # for the OpenAPI schema
    events = _Event(many=True)
    next_offset = serializers.IntegerField(allow_null=True)


class ChannelListView(APIView):
    """Every channel the caller may inspect, with its figures."""

    permission_classes = [HasRole]
    role = "admin"

    @extend_schema(operation_id="channels_list", responses={
        200: {"type": "object", "required": ["channels"],
              "properties": {"channels": {"type": "array", "items": {"type": "object"}}}},
        **errors()})
    def get(self, request: Request) -> Response:
        """List channels."""
        rows = [row for row in Channel.objects.all() if allowed(request, self.role, row)]
        return Response({"channels": [summary(row) for row in rows]})


class ChannelDetailView(APIView):
    """One channel: settings, partitions, segments, checkpoint, counters, health."""

    permission_classes = [HasRole]
    role = "admin"

    @extend_schema(operation_id="channel_detail", responses={200: DETAIL, **errors(404)})
    def get(self, request: Request, name: str) -> Response:
        """Describe a channel."""
        row = get_object_or_404(Channel, name=name)
        self.check_object_permissions(request, row)
        return Response(detail(row))


class EventQuery(serializers.Serializer):
    """Where to start reading: an offset, or the first event at or after a time."""

    offset = serializers.IntegerField(min_value=0, required=False)
    timestamp = serializers.IntegerField(min_value=0, required=False)
    limit = serializers.IntegerField(min_value=1, max_value=MAX_EVENTS_PER_PAGE, default=100)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("offset" in attrs) == ("timestamp" in attrs):
            raise serializers.ValidationError("give offset or timestamp, not both or neither")
        return attrs


class EventsView(APIView):
    """Events of one partition, by offset or by time (paginated by next_offset)."""

    permission_classes = [HasRole]
    role = "admin"

    @extend_schema(parameters=[
        OpenApiParameter("partition", {"type": "integer", "minimum": 0},
                         OpenApiParameter.PATH),
        OpenApiParameter("offset", {"type": "integer", "minimum": 0},
                         description="first offset to read (give offset or timestamp)"),
        OpenApiParameter("timestamp", {"type": "integer", "minimum": 0},
                         description="read from the first event at or after this time (ms)"),
        OpenApiParameter("limit", {"type": "integer", "minimum": 1,
                                   "maximum": MAX_EVENTS_PER_PAGE, "default": 100})],
        responses={200: _EventsPage, **errors(400, 404, 416, html404=True, e416=_OUT_OF_RANGE)})
    def get(self, request: Request, name: str, partition: int) -> Response:
        """Read events without taking them."""
        row = get_object_or_404(Channel, name=name)
        self.check_object_permissions(request, row)
        query = EventQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        if partition >= row.partitions:
            return Response({"partition": [f"channel {name!r} has partitions 0.."
                                           f"{row.partitions - 1}"]}, status=400)
        channel = channels.open_channel(row)
        offset = query.validated_data.get("offset")
        if offset is None:
            offset = channel.offsets_for_time(partition, query.validated_data["timestamp"])
            if offset is None:
                return Response({"events": [], "next_offset": None})
        try:
            events = channel.read(partition, offset, query.validated_data["limit"])
        except OffsetOutOfRangeError as exc:
            return Response({"offset": [str(exc)], "log_start_offset": exc.log_start_offset,
                             "log_end_offset": exc.log_end_offset}, status=416)
        next_offset = events[-1].offset + 1 if events else offset
        return Response({"events": [event_json(e) for e in events], "next_offset": next_offset})

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
from appliance.models import ApiToken, Channel, ExportRun, TaskRun
from appliance.permissions import HasRole, allowed
from appliance.produce import errors
from channel_engine import OffsetOutOfRangeError

MAX_EVENTS_PER_PAGE = 1000
INT64_MAX = 2**63 - 1  # offsets, timestamps and ids are int64 (Kafka's, and the database's)


SUMMARY_FIGURES = ("capacity", "events_queued", "events_untaken", "events_in_flight",
                   "fill_percent", "unflushed_events", "bytes_on_disk")


def summary(row: Channel) -> dict[str, Any]:
    """What the channel list shows of one channel; one that cannot be opened is unhealthy,
    with the reason and no figures (null)."""
    status, reason = channels.status_of(row)
    if status is None:
        status = {**dict.fromkeys(SUMMARY_FIGURES), "health": "unhealthy",
                  "health_reason": f"cannot be opened: {reason}"}
    return {"name": row.name, "partitions": row.partitions, "puts_paused": row.puts_paused,
            **{k: status[k] for k in (*SUMMARY_FIGURES, "health", "health_reason")}}


def detail(row: Channel) -> dict[str, Any]:
    """Everything about one channel: its settings, status and segment tables."""
    status = channels.open_channel(row).status(segments=True)
    settings = channels.to_config(row).to_dict()
    settings["encryption_key_file"] = row.encryption_key_file  # its name, as set
    settings.update({name: getattr(row, name)
                     for name in (*channels.SCHEDULE_SETTINGS, *channels.EXPORT_SETTINGS)})
    runs = TaskRun.objects.filter(channel=row.name)[:RECENT_RUNS]
    exports = ExportRun.objects.filter(channel=row.name)[:RECENT_RUNS]
    return {"settings": settings, "puts_paused": row.puts_paused, "status": status,
            "recent_runs": [run_json(run) for run in runs],
            "recent_exports": [export_json(run) for run in exports]}


RECENT_RUNS = 20


def export_json(run: ExportRun) -> dict[str, Any]:
    """An export run as the API shows it (progress while it runs)."""
    return {"id": run.pk, "run_id": run.run_id, "started_at": run.started_at.isoformat(),
            "duration_s": run.duration_s, "outcome": run.outcome, "progress": run.progress,
            "output": run.output, "rows": run.rows, "bytes": run.bytes,
            "partitions": run.partitions, "error": run.error}


def run_json(run: TaskRun) -> dict[str, Any]:
    """A task run as the API shows it."""
    return {"id": run.pk, "task": run.task, "channel": run.channel,
            "started_at": run.started_at.isoformat(), "duration_ms": run.duration_ms,
            "outcome": run.outcome, "attempt": run.attempt, "detail": run.detail,
            "error": run.error, "worker": run.worker}


RUN = {"type": "object", "additionalProperties": False,
       "required": ["id", "task", "channel", "started_at", "duration_ms", "outcome",
                    "attempt", "detail", "error", "worker"],
       "properties": {"id": {"type": "integer"}, "task": {"type": "string"},
                      "channel": {"type": "string"},
                      "started_at": {"type": "string", "format": "date-time"},
                      "duration_ms": {"type": "number"},
                      "outcome": {"type": "string", "enum": [
                          TaskRun.OK, TaskRun.NOTHING_DUE, TaskRun.BUSY, TaskRun.RETRYING,
                          TaskRun.FAILED]},
                      "attempt": {"type": "integer"}, "detail": {"type": "object"},
                      "error": {"type": "string"}, "worker": {"type": "string"}}}
EXPORT = {"type": "object", "additionalProperties": False,
          "required": ["id", "run_id", "started_at", "duration_s", "outcome", "progress",
                       "output", "rows", "bytes", "partitions", "error"],
          "properties": {"id": {"type": "integer"}, "run_id": {"type": "string"},
                         "started_at": {"type": "string", "format": "date-time"},
                         "duration_s": {"type": "number", "nullable": True},
                         "outcome": {"type": "string", "enum": ["running", "ok", "failed"]},
                         "progress": {"type": "string"}, "output": {"type": "string"},
                         "rows": {"type": "integer"}, "bytes": {"type": "integer"},
                         "partitions": {"type": "array", "items": {"type": "object"},
                                        "description": "per partition: ranges, skipped, "
                                                       "files, rows, bytes"},
                         "error": {"type": "string"}}}
DETAIL = {"type": "object",
          "required": ["settings", "puts_paused", "status", "recent_runs", "recent_exports"],
          "additionalProperties": False,
          "properties": {"settings": {"type": "object"}, "puts_paused": {"type": "boolean"},
                         "status": {"type": "object"},
                         "recent_runs": {"type": "array", "items": RUN,
                                         "description": "the last background task runs"},
                         "recent_exports": {"type": "array", "items": EXPORT,
                                            "description": "the last exports"}}}
_OUT_OF_RANGE = {"type": "object", "required": ["offset", "log_start_offset", "log_end_offset"],
                 "properties": {"offset": {"type": "array", "items": {"type": "string"}},
                                "log_start_offset": {"type": "integer"},
                                "log_end_offset": {"type": "integer"}}}


class _EventsPage(serializers.Serializer):  # for the OpenAPI schema
    events = _Event(many=True)
    next_offset = serializers.IntegerField(allow_null=True)


class ChannelListView(APIView):
    """Every channel the caller may inspect, with its figures (a channel that cannot be
    opened is listed as unhealthy, with its reason)."""

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

    @extend_schema(operation_id="channel_detail", responses={200: DETAIL, **errors(404, 503)})
    def get(self, request: Request, name: str) -> Response:
        """Describe a channel."""
        row = get_object_or_404(Channel, name=name)
        self.check_object_permissions(request, row)
        return Response(detail(row))


class EventQuery(serializers.Serializer):
    """Where to start reading: an offset, or the first event at or after a time."""

    offset = serializers.IntegerField(min_value=0, max_value=INT64_MAX, required=False)
    timestamp = serializers.IntegerField(min_value=0, max_value=INT64_MAX, required=False)
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
        OpenApiParameter("offset", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                         description="first offset to read (give offset or timestamp)"),
        OpenApiParameter("timestamp", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                         description="read from the first event at or after this time (ms)"),
        OpenApiParameter("limit", {"type": "integer", "minimum": 1,
                                   "maximum": MAX_EVENTS_PER_PAGE, "default": 100})],
        responses={200: _EventsPage,
                   **errors(400, 404, 416, 503, html404=True, e416=_OUT_OF_RANGE)})
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


# DRF refuses NUL in any CharField (400): the schema says so, so that clients (and
# schemathesis) know that such a filter is invalid rather than matching nothing.
NO_NUL = r"^[^\x00]*$"


class RunQuery(serializers.Serializer):
    """Which task runs to list, newest first."""

    channel = serializers.RegexField(NO_NUL, required=False, allow_blank=True, max_length=200,
                                     help_text="empty: every channel")
    task = serializers.RegexField(NO_NUL, required=False, allow_blank=True, max_length=100,
                                  help_text="empty: every task")
    outcome = serializers.ChoiceField(required=False, allow_blank=True,
                                      choices=RUN["properties"]["outcome"]["enum"])
    before = serializers.IntegerField(required=False, min_value=1, max_value=INT64_MAX,
                                      help_text="runs older than this id (the next page)")
    limit = serializers.IntegerField(min_value=1, max_value=500, default=50)


class RunsView(APIView):
    """Background task runs (flusher, checkpointer, retention, ...), newest first."""

    permission_classes = [HasRole]
    role = "admin"

    @extend_schema(operation_id="runs_list", parameters=[RunQuery], responses={
        200: {"type": "object", "required": ["runs", "next_before"],
              "properties": {"runs": {"type": "array", "items": RUN},
                             "next_before": {"type": "integer", "nullable": True}}},
        **errors(400)})
    def get(self, request: Request) -> Response:
        """List task runs (filter by channel, task, outcome; page with before)."""
        query = RunQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        wanted = {k: v for k, v in query.validated_data.items() if v != ""}
        limit, before = wanted.pop("limit"), wanted.pop("before", None)
        runs = TaskRun.objects.filter(**wanted).order_by("-id")
        if before is not None:
            runs = runs.filter(id__lt=before)
        token = request.auth
        if isinstance(token, ApiToken) and not token.all_channels:  # its channels' runs only
            runs = runs.filter(channel__in=[row.name for row in Channel.objects.all()
                                            if allowed(request, self.role, row)])
        page = list(runs[:limit])
        next_before = page[-1].pk if len(page) == limit else None
        return Response({"runs": [run_json(run) for run in page], "next_before": next_before})

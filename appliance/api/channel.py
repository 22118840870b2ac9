"""One channel (admin role; a token scoped to channels: those only):

    GET    /api/v1/channels/{name}           settings, partitions, segments, checkpoint,
                                             counters, health, recent runs and exports
    PATCH  /api/v1/channels/{name}           change settings, live (appliance.manage_channels)
    DELETE /api/v1/channels/{name}?force=1   delete the record and the files; refused (409
                                             channel-conflict) while events are untaken,
                                             unless forced
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels
from appliance.api.base import ApiView
from appliance.api.channel_settings import UPDATE_REQUEST, check_settings
from appliance.api.runs import RUN, run_json
from appliance.api.schema import errors
from appliance.manage_channels import change_channel, delete_channel
from appliance.models import Channel, ExportRun, KafkaRun, TaskRun

RECENT_RUNS = 20
FORCE_VALUES = ("",) + tuple(value for word in ("1", "0", "true", "false", "yes", "no")
                     for value in dict.fromkeys((word, word.capitalize(), word.upper())))


def detail(row: Channel) -> dict[str, Any]:
    """Everything about one channel: its settings, status and segment tables."""
    status = channels.open_channel(row).status(segments=True)
    settings = channels.to_config(row).to_dict()
    settings["encryption_key_file"] = row.encryption_key_file  # its name, as set
    settings.update({name: getattr(row, name)
                     for name in (*channels.SCHEDULE_SETTINGS, *channels.EXPORT_SETTINGS,
                                  *channels.KAFKA_SETTINGS)})
    runs = TaskRun.objects.filter(channel=row.name)[:RECENT_RUNS]
    exports = ExportRun.objects.filter(channel=row.name)[:RECENT_RUNS]
    kafka_runs = KafkaRun.objects.filter(channel=row.name)[:RECENT_RUNS]
    return {"settings": settings, "puts_paused": row.puts_paused, "status": status,
            "recent_runs": [run_json(run) for run in runs],
            "recent_exports": [export_json(run) for run in exports],
            "recent_kafka_runs": [kafka_run_json(run) for run in kafka_runs]}


def kafka_run_json(run: KafkaRun) -> dict[str, Any]:
    """A Kafka sink run as the API shows it (what it committed so far while it runs)."""
    return {"id": run.pk, "run_id": run.run_id, "topic": run.topic,
            "started_at": run.started_at.isoformat(), "duration_s": run.duration_s,
            "outcome": run.outcome, "events": run.events, "skipped": run.skipped,
            "lost": run.lost, "transactions": run.transactions, "ranges": run.ranges,
            "error": run.error}


def export_json(run: ExportRun) -> dict[str, Any]:
    """An export run as the API shows it (progress while it runs)."""
    return {"id": run.pk, "run_id": run.run_id, "started_at": run.started_at.isoformat(),
            "duration_s": run.duration_s, "outcome": run.outcome, "progress": run.progress,
            "output": run.output, "rows": run.rows, "bytes": run.bytes,
            "partitions": run.partitions, "error": run.error,
            "schema_version": run.schema_version, "path": run.path}


EXPORT = {"type": "object", "additionalProperties": False,
          "required": ["id", "run_id", "started_at", "duration_s", "outcome", "progress",
                       "output", "rows", "bytes", "partitions", "error", "schema_version",
                       "path"],
          "properties": {"id": {"type": "integer"}, "run_id": {"type": "string"},
                         "started_at": {"type": "string", "format": "date-time"},
                         "duration_s": {"type": "number", "nullable": True},
                         "outcome": {"type": "string", "enum": ["running", "ok", "failed"]},
                         "progress": {"type": "string"}, "output": {"type": "string"},
                         "rows": {"type": "integer"}, "bytes": {"type": "integer"},
                         "partitions": {"type": "array", "items": {"type": "object"},
                                        "description": "per partition: ranges, skipped, "
                                                       "files, rows, bytes"},
                         "error": {"type": "string"},
                         "schema_version": {"type": "integer", "description": "the layout "
                                            "of its files' columns (1 bytes, 2 readable)"},
                         "path": {"type": "string", "description": "the export path (time "
                                  "folders) it wrote under"}}}
KAFKA_RUN = {"type": "object", "additionalProperties": False,
             "required": ["id", "run_id", "topic", "started_at", "duration_s", "outcome",
                          "events", "skipped", "lost", "transactions", "ranges", "error"],
             "properties": {"id": {"type": "integer"}, "run_id": {"type": "string"},
                            "topic": {"type": "string"},
                            "started_at": {"type": "string", "format": "date-time"},
                            "duration_s": {"type": "number", "nullable": True},
                            "outcome": {"type": "string", "enum": ["running", "ok", "failed"]},
                            "events": {"type": "integer"}, "skipped": {"type": "integer"},
                            "lost": {"type": "integer"}, "transactions": {"type": "integer"},
                            "ranges": {"type": "object", "description": "channel partition "
                                       "-> the offset ranges [start, end) sent"},
                            "error": {"type": "string"}}}
DETAIL = {"type": "object",
          "required": ["settings", "puts_paused", "status", "recent_runs", "recent_exports",
                       "recent_kafka_runs"],
          "additionalProperties": False,
          "properties": {"settings": {"type": "object"}, "puts_paused": {"type": "boolean"},
                         "status": {"type": "object"},
                         "recent_runs": {"type": "array", "items": RUN,
                                         "description": "the last background task runs"},
                         "recent_exports": {"type": "array", "items": EXPORT,
                                            "description": "the last exports"},
                         "recent_kafka_runs": {"type": "array", "items": KAFKA_RUN,
                                               "description": "the last runs of the Kafka "
                                                              "sink that sent or failed"}}}


class ChannelView(ApiView):
    """Describe, change or delete one channel."""

    role = "admin"
    fresh_row = True  # changed in place, and its settings shown: never a cached row

    @extend_schema(operation_id="channel_detail", responses={200: DETAIL, **errors(404, 503)})
    def get(self, request: Request, name: str) -> Response:
        """Describe a channel."""
        return Response(detail(self.row))

    @extend_schema(operation_id="channel_update", request={"application/json": UPDATE_REQUEST},
                   responses={200: DETAIL, **errors(400, 404, 415, 503)})
    def patch(self, request: Request, name: str) -> Response:
        """Change settings (live), or say why a change cannot be made."""
        change_channel(self.row, check_settings(request.data))  # Refused: api/handler.py
        return Response(detail(self.row))

    @extend_schema(operation_id="channel_delete",
                   parameters=[OpenApiParameter("force", {"type": "string",
                                                          "enum": list(FORCE_VALUES)},
                                                description="drop untaken events too")],
                   responses={204: None, **errors(400, 404, 409, 503)})
    def delete(self, request: Request, name: str) -> Response:
        """Delete a channel and its files (refused while events are untaken, unless forced)."""
        given = request.query_params.getlist("force")
        if len(given) > 1 or (given and given[0] not in FORCE_VALUES):
            raise ValidationError({"force": [f"expected one of {', '.join(FORCE_VALUES)}"]})
        delete_channel(self.row, force=bool(given) and given[0].lower() in ("1", "true", "yes"))
        return Response(status=204)

"""GET /api/v1/runs — background task runs (flusher, checkpointer, retention, exports,
...), newest first, filtered by channel, task and outcome, paged by `before`; and a run's
JSON shape, which the channel detail shares. Admin role; a token scoped to channels sees
their runs only.
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from appliance.api.base import ApiView
from appliance.api.events import INT64_MAX
from appliance.api.schema import errors
from appliance.models import ApiToken, Channel, TaskRun
from appliance.permissions import allowed


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

# DRF refuses NUL in any CharField (400): the schema says so, so that clients (and
# schemathesis) know that such a filter is invalid rather than matching nothing. One or
# more characters: drf-spectacular renders an allow_blank field as oneOf [this pattern,
# maxLength 0], and "" must match only the second (the empty filter, which DRF lets
# through before any validator, is valid and matches every run).
NO_NUL = r"^[^\x00]+$"


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


class RunsView(ApiView):
    """Background task runs (flusher, checkpointer, retention, ...), newest first."""

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

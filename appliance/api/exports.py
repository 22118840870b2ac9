"""POST /api/v1/channels/{name}/exports — export now: queue an export of the channel for
the export worker (appliance.exports.queue_export); its progress shows in the channel's
recent_exports. 202 {"queued": true, "task_id"}; 200 {"queued": false, "reason"} when the
export's subscription holds nothing new (no Spark started for nothing); the broker
unreachable: 503 broker-unavailable, with Retry-After. Admin role.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from appliance.api.base import ApiView
from appliance.api.schema import errors
from appliance.exports import drained, queue_export
from appliance.models import Channel, ExportRun

# The answers of the "now" endpoints (this one, kafka.py's): queued, or nothing to do and
# nothing queued (appliance/exports.py, "Nothing new").
NOW_RESPONSES = {
    200: {"type": "object", "required": ["queued", "reason"],
          "properties": {"queued": {"type": "boolean", "enum": [False]},
                         "reason": {"type": "string"}}},
    202: {"type": "object", "required": ["queued", "task_id"],
          "properties": {"queued": {"type": "boolean", "enum": [True]},
                         "task_id": {"type": "string"}}}}


def queue_unless_drained(row: Channel, subscription: str, run_model: Any,
                         queue: Callable[[Channel], str]) -> Response:
    """200 "nothing new" when the drain of `subscription` has nothing to do, else `queue`
    the run: 202 with its task id (BrokerUnavailable: api/handler.py)."""
    reason = drained(row, subscription, run_model)
    if reason:
        return Response({"queued": False, "reason": f"nothing new: {reason}"})
    return Response({"queued": True, "task_id": queue(row)}, status=202)


class ExportNowView(ApiView):
    """Queue an export of one channel now."""

    role = "admin"
    fresh_row = True

    @extend_schema(operation_id="channel_export_now", request=None,
                   responses={**NOW_RESPONSES, **errors(404, 503)})
    def post(self, request: Request, name: str) -> Response:
        """Export now: queued for the export worker, unless there is nothing new."""
        return queue_unless_drained(self.row, self.row.export_subscription, ExportRun,
                                    queue_export)

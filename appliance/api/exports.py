"""POST /api/v1/channels/{name}/exports — export now: queue an export of the channel for
the export worker (appliance.exports.queue_export); its progress shows in the channel's
recent_exports. 202 {"queued": true, "task_id"}; 200 {"queued": false, "reason"} when the
export's subscription holds nothing new (no Spark started for nothing); the broker
unreachable: 503 broker-unavailable, with Retry-After. Admin role.
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from appliance.api.base import ApiView
from appliance.api.schema import errors
from appliance.exports import drained, queue_export
from appliance.models import ExportRun

# nothing to do: no run is queued (appliance/exports.py, "Nothing new")
NOTHING_NEW = {"type": "object", "required": ["queued", "reason"],
               "properties": {"queued": {"type": "boolean", "enum": [False]},
                              "reason": {"type": "string"}}}


class ExportNowView(ApiView):
    """Queue an export of one channel now."""

    role = "admin"
    fresh_row = True

    @extend_schema(operation_id="channel_export_now", request=None, responses={
        200: NOTHING_NEW,
        202: {"type": "object", "required": ["queued", "task_id"],
              "properties": {"queued": {"type": "boolean", "enum": [True]},
                             "task_id": {"type": "string"}}},
        **errors(404, 503)})
    def post(self, request: Request, name: str) -> Response:
        """Export now: queued for the export worker (BrokerUnavailable: api/handler.py)."""
        subscription = self.row.export_subscription
        if drained(self.row, subscription, ExportRun):
            return Response({"queued": False, "reason": f"nothing new: subscription "
                             f"{subscription!r} holds no untaken event"})
        return Response({"queued": True, "task_id": queue_export(self.row)}, status=202)

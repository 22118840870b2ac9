"""GET /api/v1/channels — every channel the caller may inspect, with its figures (one that
cannot be opened is listed unhealthy, with its reason); POST /api/v1/channels — create a
channel and its files (appliance.manage_channels; an admin token for all channels, or a
staff user). Admin role.
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels
from appliance.api.base import ApiView
from appliance.api.channel import DETAIL, detail
from appliance.api.channel_settings import CREATE_REQUEST, check_settings
from appliance.api.schema import RequiredBodySchema, errors
from appliance.manage_channels import create_channel
from appliance.models import Channel
from appliance.permissions import allowed, allowed_everywhere

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


class ChannelsView(ApiView):
    """List channels, or create one."""

    role = "admin"
    schema = RequiredBodySchema()

    @extend_schema(operation_id="channels_list", responses={
        200: {"type": "object", "required": ["channels"],
              "properties": {"channels": {"type": "array", "items": {"type": "object"}}}},
        **errors()})
    def get(self, request: Request) -> Response:
        """List channels."""
        rows = [row for row in Channel.objects.all() if allowed(request, self.role, row)]
        return Response({"channels": [summary(row) for row in rows]})

    @extend_schema(operation_id="channel_create", request={"application/json": CREATE_REQUEST},
                   responses={201: DETAIL, **errors(400, 409, 415, 503)})
    def post(self, request: Request) -> Response:
        """Create a channel and its files."""
        if not allowed_everywhere(request, "admin"):
            self.permission_denied(request, "creating a channel needs an admin token for all "
                                            "channels (or a staff user)")
        row = create_channel(check_settings(request.data))  # Refused: api/handler.py
        return Response(detail(row), status=201)

"""Losses: what a channel found it can no longer deliver, and the operator's acknowledgement.

    POST /api/v1/channels/{name}/losses/acknowledge   -> 200 {"acknowledged": N, "losses": {...}}

The engine keeps every loss (offsets, file, byte range, cause, events) in the channel's
loss ledger and reports the channel `degraded` until an operator acknowledges them; the
channel's detail (`status.losses`), /metrics and the UI show the same records. Admin role.
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels
from appliance.api.base import ApiView
from appliance.api.schema import errors

_LOSSES = {"type": "object", "description": "the channel's loss ledger (status.losses)",
           "additionalProperties": True}
_ACKNOWLEDGED = {
    "type": "object", "additionalProperties": False, "required": ["acknowledged", "losses"],
    "properties": {"acknowledged": {"type": "integer", "minimum": 0,
                                    "description": "loss records acknowledged by this call"},
                   "losses": _LOSSES}}


class LossesAcknowledgeView(ApiView):
    """Acknowledge every loss the channel recorded: its health stops saying so."""

    role = "admin"

    @extend_schema(request=None, responses={200: _ACKNOWLEDGED, **errors(404, 503)})
    def post(self, request: Request, name: str) -> Response:
        """Acknowledge the channel's recorded losses."""
        channel = channels.open_channel(self.row)
        acknowledged = channel.acknowledge_losses()
        return Response({"acknowledged": acknowledged, "losses": channel.status()["losses"]})

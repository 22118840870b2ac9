"""Recreating a channel whose storage is missing: the operator's explicit word.

    POST /api/v1/channels/{name}/recreate   -> 200 {"recreated": [paths], "status": {...}}

A channel whose files are missing (a volume not mounted, a directory removed) is never
made again by itself: every use answers 503 channel-storage-missing naming the paths
(appliance/channels.py, "Storage that vanished"). This makes it again, empty where its files
are missing, and records the loss in its loss ledger (health degraded until acknowledged:
POST .../losses/acknowledge). 409 channel-conflict when nothing is missing; 503
channel-storage-missing when another process holds the channel and would not let go.
Admin role.
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels
from appliance.api.base import ApiView
from appliance.api.schema import errors
from appliance.manage_channels import recreate_channel

_RECREATED = {
    "type": "object", "additionalProperties": False, "required": ["recreated", "status"],
    "properties": {"recreated": {"type": "array", "items": {"type": "string"},
                                 "description": "the paths that were missing, made again"},
                   "status": {"type": "object", "additionalProperties": True,
                              "description": "the channel's status now (its loss recorded)"}}}


class ChannelRecreateView(ApiView):
    """Recreate a channel whose storage is missing, empty, recording the loss."""

    role = "admin"

    @extend_schema(request=None, responses={200: _RECREATED, **errors(404, 409, 503)})
    def post(self, request: Request, name: str) -> Response:
        """Recreate the channel's missing files, empty, recording the loss."""
        missing = recreate_channel(self.row)  # Refused, StorageMissing: api/handler.py
        status = channels.open_channel(self.row).status()
        return Response({"recreated": [str(p) for p in missing], "status": status})

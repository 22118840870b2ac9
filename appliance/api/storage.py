"""Recreating a channel whose storage is missing: the operator's explicit word.

    POST /api/v1/channels/{name}/recreate   -> 200 {"recreated": [paths], "status": {...}}
         optional body {"next_offsets": {"<partition>": <offset>}}

A channel whose files are missing (a volume not mounted, a directory removed) is never
made again by itself: every use answers 503 channel-storage-missing naming the paths
(appliance/channels.py, "Storage that vanished"). This makes it again, empty where its files
are missing, and records the loss in its loss ledger (health degraded until acknowledged:
POST .../losses/acknowledge). 409 channel-conflict when nothing is missing; 503
channel-storage-missing when another process holds the channel and would not let go.
next_offsets: each partition named, made again, goes on at that offset at the least, above
what a drain sent beyond the channel's last checkpoint (a drain refuses a recreated
partition whose offsets it had sent: channel_engine/incarnations.py); 400 invalid-setting
naming next_offsets when malformed or naming a partition whose files are there.
Admin role.
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels
from appliance.api.base import ApiView
from appliance.api.schema import errors
from appliance.manage_channels import Refused, recreate_channel
from channel_engine import MAX_OFFSET

_RECREATED = {
    "type": "object", "additionalProperties": False, "required": ["recreated", "status"],
    "properties": {"recreated": {"type": "array", "items": {"type": "string"},
                                 "description": "the paths that were missing, made again"},
                   "status": {"type": "object", "additionalProperties": True,
                              "description": "the channel's status now (its loss recorded)"}}}


_RECREATE = {
    "type": "object", "additionalProperties": False,
    "properties": {"next_offsets": {
        # keys are partition numbers (ASCII digits), checked by the view: OpenAPI 3.0 has
        # no propertyNames to say so
        "type": "object",
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
        "description": "partition number (ASCII digits) -> the offset that partition, made "
                       "again, goes on at the least: above what a drain sent (its refusal "
                       "names it)"}}}


class ChannelRecreateView(ApiView):
    """Recreate a channel whose storage is missing, empty, recording the loss."""

    role = "admin"

    @extend_schema(request={"application/json": _RECREATE},
                   responses={200: _RECREATED, **errors(400, 404, 409, 503)})
    def post(self, request: Request, name: str) -> Response:
        """Recreate the channel's missing files, empty, recording the loss."""
        body = {} if request.data is None else request.data  # no body: none given
        if not isinstance(body, dict):
            raise Refused({"error": ["the body is an object: {\"next_offsets\": {...}}"]})
        extra = sorted(set(body) - {"next_offsets"})
        if extra:
            raise Refused({extra[0]: ["unknown field: a recreate takes next_offsets only"]})
        # Refused, StorageMissing: api/handler.py
        missing = recreate_channel(self.row, body.get("next_offsets"))
        status = channels.open_channel(self.row).status()
        return Response({"recreated": [str(p) for p in missing], "status": status})

"""Channel management over the API (admin role).

    POST   /api/v1/channels                 create: the record and the files
    PATCH  /api/v1/channels/{name}          change settings
    DELETE /api/v1/channels/{name}?force=1  delete: the record and the files

A change is applied live: every process reopens its handle on the channel
when it sees the new settings, and ownership moves to a process that has
them (channel_engine/channel.py). Changes that would strand events are refused
with the reason: name and data_dirs (the partition logs live there), fewer
partitions (keys would move). Deleting a channel that holds untaken events is
refused unless forced.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels
from appliance.inspect import ChannelDetailView, ChannelListView, detail
from appliance.models import Channel

SETTABLE = set(channels.SETTINGS) | {"puts_paused"}
FIXED = ("name", "data_dirs")


def _unknown(body: Any) -> Response | None:
    if not isinstance(body, dict):
        return Response({"__all__": ["expected a JSON object of settings"]}, status=400)
    unknown = sorted(set(body) - SETTABLE)
    if unknown:
        return Response({unknown[0]: ["unknown setting"]}, status=400)
    return None


def _invalid(exc: ValidationError) -> Response:
    return Response(exc.message_dict, status=400)


class ChannelsView(ChannelListView):
    """List channels, or create one."""

    @extend_schema(operation_id="channel_create", request=OpenApiTypes.OBJECT,
                   responses={201: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT,
                              409: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        """Create a channel and its files."""
        bad = _unknown(request.data)
        if bad is not None:
            return bad
        if Channel.objects.filter(name=request.data.get("name")).exists():
            return Response({"name": ["a channel with this name exists"]}, status=409)
        row = Channel(**request.data)
        try:
            with transaction.atomic():
                channels.to_config(row)
                row.save()
                channels.open_channel(row)  # the files; an error rolls the record back
        except ValidationError as exc:
            return _invalid(exc)
        return Response(detail(row), status=201)


class ChannelView(ChannelDetailView):
    """Describe, change or delete one channel."""

    @extend_schema(operation_id="channel_update", request=OpenApiTypes.OBJECT,
                   responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT})
    def patch(self, request: Request, name: str) -> Response:
        """Change settings (live), or say why a change cannot be made."""
        row = get_object_or_404(Channel, name=name)
        self.check_object_permissions(request, row)
        bad = _unknown(request.data)
        if bad is not None:
            return bad
        for field in FIXED:
            if field in request.data and request.data[field] != getattr(row, field):
                return Response({field: [f"cannot change: the partition logs of {name!r} "
                                         "live where they are"]}, status=400)
        if request.data.get("partitions", row.partitions) < row.partitions:
            return Response({"partitions": [f"cannot shrink from {row.partitions}: keys "
                                            "would move and events be stranded"]}, status=400)
        for field, value in request.data.items():
            setattr(row, field, value)
        try:
            channels.to_config(row)
        except ValidationError as exc:
            return _invalid(exc)
        row.save()
        return Response(detail(row))

    @extend_schema(operation_id="channel_delete",
                   parameters=[OpenApiParameter("force", bool)],
                   responses={204: None, 409: OpenApiTypes.OBJECT})
    def delete(self, request: Request, name: str) -> Response:
        """Delete a channel and its files (refused while events are untaken, unless forced)."""
        row = get_object_or_404(Channel, name=name)
        self.check_object_permissions(request, row)
        force = request.query_params.get("force", "").lower() in ("1", "true", "yes")
        config = channels.to_config(row)
        untaken = channels.open_channel(row).status()["events_untaken"]
        if untaken and not force:
            return Response({"error": f"channel {name!r} holds {untaken} untaken events; "
                                      "delete with ?force=true to drop them"}, status=409)
        channels.close_channel(name)
        row.delete()
        for p in range(config.partitions):
            shutil.rmtree(config.partition_dir(p), ignore_errors=True)
        for directory in (config.checkpoint_dir, config.backup_checkpoint_dir):
            if directory:
                shutil.rmtree(Path(directory), ignore_errors=True)
        return Response(status=204)

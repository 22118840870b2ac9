"""Take transactions over HTTP, for consumers on other machines.

    POST /api/v1/channels/{name}/takes                {"max_events": N, "lease_seconds": S}
         -> 200 {"take_id", "lease_expires_at_ms", "events": [event, ...]}
    POST /api/v1/channels/{name}/takes/{id}/commit    -> 200 {"committed": true}
    POST /api/v1/channels/{name}/takes/{id}/rollback  -> 200 {"rolled_back": true}

An event is {"partition", "offset", "timestamp", "key", "headers", "body",
"body_base64"}: key, header values and body as text when they are UTF-8 (else
null), and the body always as base64 too. The take is leased: committed or rolled
back by any web worker that gets its id, and returned to the queue by itself when
the lease runs out (commit then answers 409). An empty channel answers at once
with no events (and no take to commit).
"""
from __future__ import annotations

import base64
import time
from typing import Any

import orjson
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from appliance import channels
from appliance.models import Channel
from appliance.permissions import HasRole
from appliance.produce import errors
from channel_engine import Event, TakeExpiredError

MAX_LEASE_S = 3600


class TakeRequest(serializers.Serializer):
    """What a consumer asks for."""

    max_events = serializers.IntegerField(min_value=1)
    lease_seconds = serializers.IntegerField(min_value=1, max_value=MAX_LEASE_S, default=60)


class _Event(serializers.Serializer):  # for the OpenAPI schema
    partition = serializers.IntegerField()
    offset = serializers.IntegerField()
    timestamp = serializers.IntegerField()
    key = serializers.CharField(allow_null=True)
    headers = serializers.DictField(child=serializers.CharField(allow_null=True))
    body = serializers.CharField(allow_null=True)
    body_base64 = serializers.CharField()


class _TakeResponse(serializers.Serializer):
    take_id = serializers.IntegerField(allow_null=True)
    lease_expires_at_ms = serializers.IntegerField(allow_null=True)
    events = _Event(many=True)


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


def event_json(event: Event) -> dict[str, Any]:
    """An event as the API shows it."""
    return {"partition": event.partition, "offset": event.offset,
            "timestamp": event.timestamp, "key": _text(event.key),
            "headers": {k: _text(v) for k, v in event.headers.items()},
            "body": _text(event.body), "body_base64": base64.b64encode(event.body).decode()}


class _ChannelView(APIView):
    permission_classes = [HasRole]
    role = "consume"

    def channel_row(self, request: Request, name: str) -> Channel:
        row = get_object_or_404(Channel, name=name)
        self.check_object_permissions(request, row)
        return row


class TakesView(_ChannelView):
    """Begin a take transaction and get its events."""

    @extend_schema(request=TakeRequest, responses={200: _TakeResponse, **errors(400, 404, 415)})
    def post(self, request: Request, name: str) -> HttpResponse:
        """Take up to max_events events under a lease."""
        row = self.channel_row(request, name)
        asked = TakeRequest(data=request.data)
        asked.is_valid(raise_exception=True)
        max_events, lease_s = asked.validated_data["max_events"], \
            asked.validated_data["lease_seconds"]
        if max_events > row.transaction_capacity:
            return HttpResponse(orjson.dumps({"max_events": [
                f"at most transaction_capacity={row.transaction_capacity}"]}), status=400,
                content_type="application/json")
        channel = channels.open_channel(row)
        tx = channel.take(lease_ms=lease_s * 1000)
        events = tx.take(max_events)
        if not events:
            tx.rollback()
            body: dict[str, Any] = {"take_id": None, "lease_expires_at_ms": None, "events": []}
        else:
            body = {"take_id": tx.take_id,
                    "lease_expires_at_ms": int(time.time() * 1000) + lease_s * 1000,
                    "events": [event_json(e) for e in events]}
        return HttpResponse(orjson.dumps(body), content_type="application/json")


_TAKE_ID = OpenApiParameter("take_id", {"type": "integer", "minimum": 0},
                            OpenApiParameter.PATH)


class TakeCommitView(_ChannelView):
    """Commit a take: its events are gone for good."""

    @extend_schema(request=None, parameters=[_TAKE_ID], responses={
        200: {"type": "object", "properties": {"committed": {"type": "boolean", "enum": [True]}},
              "required": ["committed"], "additionalProperties": False},
        **errors(404, 409, html404=True)})
    def post(self, request: Request, name: str, take_id: int) -> Response:
        """Commit."""
        row = self.channel_row(request, name)
        try:
            channels.open_channel(row).commit_take(take_id)
        except TakeExpiredError as exc:
            return Response({"error": str(exc)}, status=409)
        return Response({"committed": True})


class TakeRollbackView(_ChannelView):
    """Roll a take back: its events return to the head of the queue."""

    @extend_schema(request=None, parameters=[_TAKE_ID], responses={
        200: {"type": "object",
              "properties": {"rolled_back": {"type": "boolean", "enum": [True]}},
              "required": ["rolled_back"], "additionalProperties": False},
        **errors(404, html404=True)})
    def post(self, request: Request, name: str, take_id: int) -> Response:
        """Roll back."""
        row = self.channel_row(request, name)
        channels.open_channel(row).rollback_take(take_id)
        return Response({"rolled_back": True})

"""POST /api/v1/channels/{name}/events — one request is one put transaction.

Every event is committed or none is. The body is parsed by event_parsing (no
serializer per event); the response lists where the events went:

    200 {"events": N, "committed": [{"partition", "first_offset", "last_offset"}]}
    400 {"error", "index", "field", "reason"}   bad input: nothing written
    401 / 403                                   no token / not allowed here
    404                                         no such channel
    413                                         body over WEIR_MAX_PRODUCE_BYTES, or more
                                                events than the channel's transaction_capacity
    503 + Retry-After                           channel full (after keep_alive_ms), disk
                                                guard tripped, or puts paused by an operator
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from appliance import channels
from appliance.event_parsing import EventError, parse
from appliance.models import Channel
from appliance.permissions import HasRole
from channel_engine import ChannelFullError, DiskSpaceError, InvalidEventError

RETRY_AFTER_S = 1


class _Committed(serializers.Serializer):  # for the OpenAPI schema only
    partition = serializers.IntegerField()
    first_offset = serializers.IntegerField()
    last_offset = serializers.IntegerField()


class _ProduceResponse(serializers.Serializer):
    events = serializers.IntegerField()
    committed = _Committed(many=True)


class _Error(serializers.Serializer):
    error = serializers.CharField()
    index = serializers.IntegerField(allow_null=True, required=False)
    field = serializers.CharField(required=False)
    reason = serializers.CharField(required=False)


class RawBodyParser(BaseParser):
    """Hand the body over unparsed (event_parsing does the work, without a serializer)."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Any = None) -> bytes:
        """The body's bytes."""
        return bytes(stream.read()) if stream is not None else b""


class ProduceView(APIView):
    """Put events into a channel, atomically."""

    permission_classes = [HasRole]
    role = "produce"
    parser_classes = [RawBodyParser]  # event_parsing parses; DRF only hands the bytes over

    @extend_schema(
        request={"application/json": {"type": "object"},
                 "application/x-ndjson": {"type": "string"}},
        responses={200: _ProduceResponse, 400: _Error, 413: _Error,
                   503: OpenApiResponse(_Error, description="full, disk guard, or paused")},
        description=__doc__)
    def post(self, request: Request, name: str) -> Response:
        """Produce events."""
        row = get_object_or_404(Channel, name=name)
        self.check_object_permissions(request, row)
        limit = settings.WEIR_MAX_PRODUCE_BYTES
        if int(request.META.get("CONTENT_LENGTH") or 0) > limit:
            return _error(413, f"body over WEIR_MAX_PRODUCE_BYTES={limit} bytes")
        try:
            events = parse(request.data, request.content_type or "")
        except EventError as exc:
            return Response(exc.to_dict(), status=400)
        if len(events) > row.transaction_capacity:
            return _error(413, f"{len(events)} events exceed this channel's "
                               f"transaction_capacity={row.transaction_capacity}")
        if row.puts_paused:
            return _error(503, f"puts to channel {name!r} are paused by an operator",
                          retry=True)
        channel = channels.open_channel(row)
        try:
            with channel.put() as tx:
                tx.put_all(events)
        except InvalidEventError as exc:
            return Response({"error": str(exc), "index": exc.index, "field": exc.field,
                             "reason": exc.reason}, status=400)
        except (ChannelFullError, DiskSpaceError) as exc:
            return _error(503, str(exc), retry=True)
        committed = [{"partition": p, "first_offset": first, "last_offset": last}
                     for p, first, last in tx.committed]
        return Response({"events": len(events), "committed": committed})


def _error(status: int, message: str, retry: bool = False) -> Response:
    response = Response({"error": message}, status=status)
    if retry:
        response["Retry-After"] = str(RETRY_AFTER_S)
    return response

"""POST /api/v1/channels/{name}/events — one request is one put transaction.

Every event is committed or none is. The body is parsed by event_parsing (no
serializer per event); the response lists where the events went. Errors are problems
(appliance/api/problems.py; type slug in brackets):

    200 {"events": N, "committed": [{"partition", "first_offset", "last_offset"}]}
    400 [invalid-event] index, field            bad input: nothing written
    400 [parse-error] content_length            a body shorter than its Content-Length (the
                                                client went away): nothing written
    401 / 403                                   no token / not allowed here
    404 [channel-not-found]                     no such channel
    413 [body-too-large, too-many-events,       body over WEIR_MAX_PRODUCE_BYTES, more events
         batch-too-large]                       than the channel's transaction_capacity, or a
                                                partition's batch over max_batch_bytes or
                                                segment_bytes
    503 + Retry-After [channel-full,            channel full (after keep_alive_ms), disk
         disk-space-low, puts-paused,           guard tripped, puts paused by an operator,
         channel-write-failed]                  or a partition's log failed (I/O error)
    507 + Retry-After [disk-full]               the disk is full (ENOSPC): nothing written;
                                                counted (weir_channel_disk_full_errors_total)
                                                and the channel's health is degraded until
                                                a put succeeds or space returns
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response

from appliance.api.base import ApiView
from appliance.api.problems import Problem
from appliance.api.schema import RequiredBodySchema, errors
from appliance.event_parsing import MAX_HEADER_NAME, MAX_HEADERS, MAX_TIMESTAMP, parse
from appliance.producing import PUT_ERROR, put_events


class _Committed(serializers.Serializer):  # for the OpenAPI schema only
    partition = serializers.IntegerField()
    first_offset = serializers.IntegerField()
    last_offset = serializers.IntegerField()


class _ProduceResponse(serializers.Serializer):
    events = serializers.IntegerField()
    committed = _Committed(many=True)


_EVENT_IN = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "body": {"type": "string"},
        "body_base64": {"type": "string", "format": "byte"},
        "key": {"type": "string", "nullable": True},
        "headers": {"type": "object", "nullable": True, "maxProperties": MAX_HEADERS,
                    "additionalProperties": {"type": "string", "nullable": True},
                    "description": "header values are strings; a null value is stored as "
                                   "\"\" (as Flume does), and read back as \"\"; names "
                                   f"at most {MAX_HEADER_NAME} bytes (UTF-8); a "
                                   "\"timestamp\" header (Flume's: ms since the epoch, as "
                                   "digits) is the event's time when it has no timestamp "
                                   "field; another value is a header only"},
        "timestamp": {"type": "integer", "nullable": True, "minimum": 0, "maximum": MAX_TIMESTAMP,
                      "description": "ms since the epoch, up to 9999-12-31T23:59:59.999Z "
                                     "(default: now)"},
    },
    "oneOf": [{"required": ["body"], "not": {"required": ["body_base64"]}},
              {"required": ["body_base64"], "not": {"required": ["body"]}}],
}
_EVENTS = {"type": "array", "minItems": 1, "items": _EVENT_IN}
PRODUCE_REQUEST = {
    "application/json": {"oneOf": [
        {"type": "object", "additionalProperties": False, "required": ["events"],
         "properties": {"events": _EVENTS}, "description": "Weir's own"},
        {**_EVENTS, "description": "Flume's HTTP source JSON"}]},
    "application/x-ndjson": {"type": "string",
                             "description": "one event object (as above) per line"},
}
class RawBodyParser(BaseParser):
    """Hand the body over unparsed (event_parsing does the work, without a serializer)."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Any = None) -> bytes:
        """The body's bytes."""
        return bytes(stream.read()) if stream is not None else b""


class ProduceView(ApiView):
    """Put events into a channel, atomically."""

    role = "produce"
    parser_classes = [RawBodyParser]  # event_parsing parses; DRF only hands the bytes over
    schema = RequiredBodySchema()

    @extend_schema(
        request=PRODUCE_REQUEST,
        responses={200: _ProduceResponse, **errors(400, 404, 413, 503, 507)},
        description=__doc__)
    def post(self, request: Request, name: str) -> Response:
        """Produce events."""
        failed = request.META.get(PUT_ERROR)
        if failed is not None:  # the fast path's put failed: answer what it raised
            raise failed
        row, limit = self.row, settings.WEIR_MAX_PRODUCE_BYTES
        length = request.META.get("CONTENT_LENGTH") or "0"
        if not (length.isascii() and length.isdigit()):  # gunicorn checks; others may not
            raise Problem(400, "validation-error", "Content-Length: not a number",
                          field="content_length")
        if int(length) > limit:
            raise Problem(413, "body-too-large", f"body over WEIR_MAX_PRODUCE_BYTES={limit} "
                                                 "bytes")
        # without a body DRF gives {} rather than calling the parser: b"" then
        body = request.data if isinstance(request.data, bytes) else b""
        if len(body) != int(length):  # the client went away mid-body: a cut NDJSON parses
            raise Problem(400, "parse-error", f"the body ended after {len(body)} of the "
                                              f"{int(length)} bytes its Content-Length says",
                          field="content_length")
        events = parse(body, request.content_type or "")
        # engine errors: api/handler.py
        committed = [{"partition": p, "first_offset": first, "last_offset": last}
                     for p, first, last in put_events(row, events)]
        return Response({"events": len(events), "committed": committed})

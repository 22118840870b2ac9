"""POST /api/v1/channels/{name}/events — one request is one put transaction.

Every event is committed or none is. The body is parsed by event_parsing (no
serializer per event); the response lists where the events went:

    200 {"events": N, "committed": [{"partition", "first_offset", "last_offset"}]}
    400 {"error", "index", "field", "reason"}   bad input: nothing written
    401 / 403                                   no token / not allowed here
    404                                         no such channel
    413                                         body over WEIR_MAX_PRODUCE_BYTES, more events
                                                than the channel's transaction_capacity, or a
                                                partition's batch over max_batch_bytes or
                                                segment_bytes
    503 + Retry-After                           channel full (after keep_alive_ms), disk
                                                guard tripped, puts paused by an operator,
                                                or a partition's log failed (I/O error)
    507 + Retry-After                           the disk is full (ENOSPC): nothing written;
                                                counted (weir_channel_disk_full_errors_total)
                                                and the channel's health is degraded until
                                                a put succeeds or space returns
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from appliance import channels, row_cache
from appliance.event_parsing import (
    MAX_HEADER_NAME,
    MAX_HEADERS,
    MAX_TIMESTAMP,
    EventError,
    parse,
)
from appliance.models import Channel
from appliance.permissions import HasRole
from channel_engine import (
    BatchTooLargeError,
    ChannelEngineError,
    ChannelFullError,
    DiskFullError,
    DiskSpaceError,
    InvalidEventError,
    LogOfflineError,
    StorageError,
)

RETRY_AFTER_S = 1


class _Committed(serializers.Serializer):  # for the OpenAPI schema only
    partition = serializers.IntegerField()
    first_offset = serializers.IntegerField()
    last_offset = serializers.IntegerField()


class _ProduceResponse(serializers.Serializer):
    events = serializers.IntegerField()
    committed = _Committed(many=True)


_DETAIL = {"type": "object", "properties": {"detail": {"type": "string"}},
           "required": ["detail"]}
_FIELD_ERRORS = {"type": "object", "additionalProperties": True,
                 "description": "field name -> messages (DRF validation errors)"}
_MESSAGE = {"type": "object", "properties": {"error": {"type": "string"}},
            "required": ["error"]}
ERROR_DESCRIPTIONS = {
    400: "bad input", 401: "no or bad token", 403: "the token may not do that here",
    404: "no such channel (or path)", 409: "conflict", 413: "too large",
    415: "unsupported request content type", 416: "offset out of range",
    429: "rate limited (Retry-After)",
    503: "unavailable: the channel or its disk (Retry-After when retrying helps)",
    507: "the disk is full: nothing written (Retry-After)"}


def errors(*codes: int, html404: bool = False,
           **bodies: Any) -> dict[int | tuple[int, str], OpenApiResponse]:
    """Documented error responses: 401/403/429 for every authenticated view, plus `codes`,
    plus the WSGI server's own 414/431 pages;
    `bodies` ("e400": schema) override the default body schema of a status. `html404`: the
    path has an <int:...> part, and a value that is not one matches no route at all, which
    Django answers with its own text/html 404 page."""
    out: dict[int | tuple[int, str], OpenApiResponse] = {}
    for code in sorted({401, 403, 429, *codes}):
        default = _FIELD_ERRORS if code == 400 else _DETAIL if code in (401, 403, 404, 415, 429) \
            else _MESSAGE
        out[code] = OpenApiResponse(bodies.get(f"e{code}", default),
                                    description=ERROR_DESCRIPTIONS[code])
    if html404:
        out[(404, "text/html")] = OpenApiResponse(
            {"type": "string"}, description="no such path (Django's page)")
    # answered by the WSGI server (gunicorn) before the request reaches the appliance
    out[(414, "text/html")] = OpenApiResponse(
        {"type": "string"}, description="request line over 4094 bytes (the server's page)")
    out[(431, "text/html")] = OpenApiResponse(
        {"type": "string"}, description="a header over 8190 bytes (the server's page)")
    return out


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
                                   f"at most {MAX_HEADER_NAME} bytes (UTF-8)"},
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
_ERROR_400 = {"type": "object", "required": ["error"], "properties": {
    "error": {"type": "string"}, "index": {"type": "integer", "nullable": True},
    "field": {"type": "string"}, "reason": {"type": "string"}}}


class RequiredBodySchema(AutoSchema):
    """drf-spectacular leaves a request body given as a plain JSON Schema dict optional;
    for views that need one, say it is required."""

    def _get_request_body(self, direction: str = "request") -> dict[str, Any] | None:
        body: dict[str, Any] | None = super()._get_request_body(direction)
        if body is not None:
            body["required"] = True
        return body


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
    schema = RequiredBodySchema()

    @extend_schema(
        request=PRODUCE_REQUEST,
        responses={200: _ProduceResponse,
                   **errors(400, 404, 413, 503, 507, e400=_ERROR_400)},
        description=__doc__)
    def post(self, request: Request, name: str) -> Response:
        """Produce events."""
        row = row_cache.channel(name)
        if row is None:
            raise NotFound(f"no channel {name!r}")
        self.check_object_permissions(request, row)
        limit = settings.WEIR_MAX_PRODUCE_BYTES
        length = request.META.get("CONTENT_LENGTH") or "0"
        if not (length.isascii() and length.isdigit()):  # gunicorn checks; others may not
            return Response({"error": "Content-Length: not a number", "index": None,
                             "field": "content_length", "reason": "not a number"}, status=400)
        if int(length) > limit:
            return _error(413, f"body over WEIR_MAX_PRODUCE_BYTES={limit} bytes")
        try:
            # without a body DRF gives {} rather than calling the parser: b"" then
            body = request.data if isinstance(request.data, bytes) else b""
            events = parse(body, request.content_type or "")
        except EventError as exc:
            return Response(exc.to_dict(), status=400)
        if len(events) > row.transaction_capacity:
            return _error(413, f"{len(events)} events exceed this channel's "
                               f"transaction_capacity={row.transaction_capacity}")
        if row.puts_paused:
            return _error(503, f"puts to channel {name!r} are paused by an operator",
                          retry=True)
        try:
            with channels.open_channel(row).put() as tx:
                tx.put_all(events)
        except InvalidEventError as exc:
            return Response({"error": str(exc), "index": exc.index, "field": exc.field,
                             "reason": exc.reason}, status=400)
        except BatchTooLargeError as exc:  # a partition's batch, once encoded
            return _error(413, f"the events of one partition encode to {exc.size} bytes, over "
                               f"this channel's {exc.setting}={exc.limit}: send fewer")
        except (ChannelFullError, DiskSpaceError) as exc:
            return _error(503, str(exc), retry=True)
        except DiskFullError as exc:
            return _error(507, f"the disk is full, nothing was written: {exc}", retry=True)
        except (StorageError, LogOfflineError) as exc:
            raise_if_deleted(row, exc)  # a channel deleted under this request: 404
            return _error(503, f"the channel could not write, nothing was acknowledged: {exc}",
                          retry=True)
        except ChannelEngineError as exc:
            raise_if_deleted(row, exc)
            raise
        committed = [{"partition": p, "first_offset": first, "last_offset": last}
                     for p, first, last in tx.committed]
        return Response({"events": len(events), "committed": committed})


def raise_if_deleted(row: Channel, exc: Exception) -> None:
    """NotFound (404) when an engine error came from the channel being deleted (or recreated)
    under the request: it is answered like any channel that does not exist."""
    if channels.deleted(row):
        raise NotFound(f"no channel {row.name!r} (deleted)") from exc


def _error(status: int, message: str, retry: bool = False) -> Response:
    response = Response({"error": message}, status=status)
    if retry:
        response["Retry-After"] = str(RETRY_AFTER_S)
    return response

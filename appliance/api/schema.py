"""The OpenAPI kit of the API views (drf-spectacular): the Problem component, the error
responses of an operation, and a request body that is required.

Every error an operation can answer is documented as application/problem+json with the
Problem schema (appliance/api/problems.py), 416 with its offsets; schemathesis holds the
views to it (tests/appliance/test_schemathesis.py).
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from appliance.api.problems import CONTENT_TYPE, TYPE_BASE


class ProblemSerializer(serializers.Serializer):
    """RFC 9457 problem details: every API error (README, "API errors")."""

    type = serializers.URLField(help_text=f"{TYPE_BASE}<slug>: the kind of problem")
    title = serializers.CharField(help_text="the same for every problem of this type")
    status = serializers.IntegerField(help_text="the HTTP status")
    detail = serializers.CharField(help_text="this occurrence, in words")
    field = serializers.CharField(required=False,
                                  help_text="the request field or channel setting at fault")
    index = serializers.IntegerField(required=False, min_value=0,
                                     help_text="the event at fault in a produce request")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()), required=False,
        help_text="every field at fault: name -> messages")
    retry_after = serializers.IntegerField(required=False, min_value=1,
                                           help_text="seconds to wait (as Retry-After)")
    request_id = serializers.CharField(required=False,
                                       help_text="5xx: the id the appliance logged it under")
    path = serializers.CharField(required=False,
                                 help_text="the file or directory at fault on the appliance")
    paths = serializers.ListField(child=serializers.CharField(), required=False,
                                  help_text="the channel's files or directories missing")

    class Meta:
        ref_name = "Problem"


class RangeProblemSerializer(ProblemSerializer):
    """An offset range the partition does not serve, with the range it does."""

    log_start_offset = serializers.IntegerField(required=False)
    log_end_offset = serializers.IntegerField(required=False)
    last_stable_offset = serializers.IntegerField(required=False)

    class Meta:
        ref_name = "RangeProblem"


ERROR_DESCRIPTIONS = {
    400: "bad input", 401: "no or bad token", 403: "the token may not do that here",
    404: "no such channel (or path)", 409: "conflict with the channel's state",
    413: "too large", 415: "unsupported request content type", 416: "offset out of range",
    429: "rate limited (Retry-After)",
    503: "unavailable: the channel, its disk or the broker (Retry-After when retrying helps)",
    507: "the disk is full: nothing written (Retry-After)"}


def errors(*codes: int) -> dict[int | tuple[int, str], OpenApiResponse]:
    """Documented error responses, problems all: 401/403/429 for every view, plus
    `codes`, plus the WSGI server's own 414/431 pages."""
    out: dict[int | tuple[int, str], OpenApiResponse] = {}
    for code in sorted({401, 403, 429, *codes}):
        body = RangeProblemSerializer if code == 416 else ProblemSerializer
        out[(code, CONTENT_TYPE)] = OpenApiResponse(body, description=ERROR_DESCRIPTIONS[code])
    # answered by the WSGI server (gunicorn) before the request reaches the appliance
    out[(414, "text/html")] = OpenApiResponse(
        {"type": "string"}, description="request line over 4094 bytes (the server's page)")
    out[(431, "text/html")] = OpenApiResponse(
        {"type": "string"}, description="a header over 8190 bytes (the server's page)")
    return out


class RequiredBodySchema(AutoSchema):
    """drf-spectacular leaves a request body given as a plain JSON Schema dict optional;
    for views that need one, say it is required."""

    def _get_request_body(self, direction: str = "request") -> dict[str, Any] | None:
        body: dict[str, Any] | None = super()._get_request_body(direction)
        if body is not None:
            body["required"] = True
        return body

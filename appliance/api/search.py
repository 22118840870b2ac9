"""GET /api/v1/channels/{name}/events — search a channel's events newest first across its
partitions, or tail it; reading never takes (the queue does not move). The same path's
POST is produce (appliance/api/produce.py, in the produce role); GET (and HEAD) is this
search, in the admin role (as the per-partition events API, appliance/api/events.py).
ChannelEventsView serves both on the one path (as the OpenAPI schema needs one view class
per path), with admin as its default: a method not named needs the strongest role.

    ?key=&header=name:value&contains=&regex=&partition=&limit=&scan_limit=&budget_ms=
      -> 200 {"events": [event, ...] newest first, "scanned", "total", "remaining",
              "stopped", "stopped_early", "cursor", "tail"}
    &cursor=C   go on with older events (a previous answer's cursor)
    &after=C    a tail: events at or after these positions, oldest first
      -> 200 {"events": [...], "scanned", "after"}   (poll again with the new after)
    400 [validation-error] field: a regex RE2 cannot compile, a limit out of range, a header
        without ':'

The query's fields: appliance/search_query.py; the scan and its bounds (hits, events
scanned, time): appliance/event_search.py. `total` is the events the searched partitions
hold, `remaining` those older than the cursor not scanned yet; `stopped` says which bound
ended the scan ("limit"; "bytes": the hits hold about 1 MiB, as the per-partition events
API answers at most; "scan_limit", "time_budget"; null: nothing older is left), and
`stopped_early` whether it was the scan limit or the time budget. `tail` is where a tail of
the same partitions starts (their ends when the scan began).
"""
from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels, event_search
from appliance.api.base import ApiView
from appliance.api.events import EventOut, event_json
from appliance.api.produce import ProduceView
from appliance.api.schema import errors
from appliance.search_query import (
    BUDGET_MS,
    DEFAULTS,
    MAX_LIMIT,
    MAX_PATTERN,
    MAX_SCAN,
    MAX_TEXT,
    BadQuery,
    parse_search,
)

CURSOR = {"type": "string",
          "pattern": r"^$|^[0-9]{1,6}:[0-9]{1,19}(,[0-9]{1,6}:[0-9]{1,19})*$"}
EMPTY = {"type": "string", "maxLength": 0}  # an empty value is the default (a form's "all")


class _SearchPage(serializers.Serializer):  # for the OpenAPI schema
    events = EventOut(many=True)
    scanned = serializers.IntegerField(help_text="events scanned by this request")
    total = serializers.IntegerField(required=False,
                                     help_text="events the searched partitions hold")
    remaining = serializers.IntegerField(required=False,
                                         help_text="older events not scanned yet")
    stopped = serializers.ChoiceField(event_search.STOPPED,
                                      allow_null=True, required=False)
    stopped_early = serializers.BooleanField(required=False)
    cursor = serializers.CharField(allow_null=True, required=False,
                                   help_text="pass as cursor= for older events")
    tail = serializers.CharField(required=False, help_text="pass as after= to tail from now")
    after = serializers.CharField(required=False, help_text="a tail's next after=")


def _int(name: str, low: int, high: int, doc: str) -> OpenApiParameter:
    number = {"type": "integer", "minimum": low, "maximum": high, "default": DEFAULTS[name]}
    return OpenApiParameter(name, {"anyOf": [number, EMPTY]}, description=doc)


def _text(name: str, doc: str, longest: int = MAX_TEXT) -> OpenApiParameter:
    return OpenApiParameter(name, {"type": "string", "maxLength": longest}, description=doc)


PARAMETERS = [
    _text("key", "the key is this (UTF-8), exactly"),
    OpenApiParameter("header", {"type": "array", "items": {
        "type": "string", "pattern": "^[^:]+:", "maxLength": MAX_TEXT}}, explode=True,
        description="name:value: a header of that name and value (repeat: all must match)"),
    _text("contains", "the body holds this text (in its first MiB)"),
    _text("regex", "the body (its first MiB, as UTF-8 text) matches this regular expression, "
          "in RE2 syntax (https://github.com/google/re2/wiki/Syntax: no backreferences or "
          "lookaround)", MAX_PATTERN),
    OpenApiParameter("partition", {"anyOf": [{"type": "integer", "minimum": 0}, EMPTY]},
                     description="only this partition (default: every one)"),
    _int("limit", 1, MAX_LIMIT, "hits at most"),
    _int("scan_limit", 1, MAX_SCAN, "events scanned at most"),
    _int("budget_ms", *BUDGET_MS, "time the scan may take (ms)"),
    OpenApiParameter("cursor", CURSOR, description="older events: a previous answer's cursor"),
    OpenApiParameter("after", CURSOR, description="a tail: events at or after these "
                                                  "partition:offset positions"),
]


class SearchView(ApiView):
    """Search or tail a channel's events (GET), in the admin role."""

    role = "admin"

    @extend_schema(parameters=PARAMETERS, responses={200: _SearchPage, **errors(400, 404, 503)},
                   description=__doc__)
    def get(self, request: Request, name: str) -> Response:
        """Search events newest first across partitions, or tail them."""
        try:
            search = parse_search(request.query_params, self.row.partitions)
        except BadQuery as bad:
            raise ValidationError({k: [v] for k, v in bad.errors.items()}) from None
        channel = channels.open_channel(self.row)
        if search.after is not None:
            hits, after, scanned = event_search.read_after(channel, search.after,
                                                           search.filters, search.bounds.limit)
            return Response({"events": [event_json(e) for e in hits], "scanned": scanned,
                             "after": event_search.cursor_text(after)})
        result = event_search.search(channel, search.partitions, search.filters,
                                     search.bounds, search.cursor)
        return Response({"events": [event_json(e) for e in result.hits],
                         **event_search.describe(result)})


class ChannelEventsView(SearchView, ProduceView):
    """Search or tail events (GET, HEAD: admin, SearchView), or produce them (POST: produce,
    ProduceView, with its parser and schema); any other method needs admin."""

    role = "admin"
    method_roles = {"POST": "produce"}

"""A channel's subscriptions: each takes every event of the channel once, at its own pace
(Kafka's consumer groups over one log; channel_engine/queue/subscriptions.py).

    GET    /api/v1/channels/{name}/subscriptions              consume   every subscription
    POST   /api/v1/channels/{name}/subscriptions              admin     {"name", "start"}
    GET    /api/v1/channels/{name}/subscriptions/{sub}        consume   one
    DELETE /api/v1/channels/{name}/subscriptions/{sub}        admin     never `default`
    POST   /api/v1/channels/{name}/subscriptions/{sub}/reset  admin     {"to"}

A position (`start`, `to`) is "earliest" (the log start), "latest" (the end: only events
put from now on), {"timestamp_ms": t} (the first event at or after t; the end when none
is) or {"offsets": {"<partition>": offset, ...}} (each in [log start, last stable offset];
partitions not named start at earliest on an add and stay as they are on a reset), as
kafka-consumer-groups --reset-offsets. Add, remove and reset are durable when they
answer (a checkpoint is written first). A reset or removal with takes open answers 409
subscription-busy (commit or roll them back first); a take that names the subscription
while it changes, the same.

A subscription shows its lag: events untaken (queued and in flight), per partition too,
the timestamp and age of its oldest untaken event, its take counters, and whether the
channel's export drains it.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels, lag, manage_subscriptions
from appliance.api.base import ApiView
from appliance.api.schema import RequiredBodySchema, errors
from appliance.manage_subscriptions import MAX_I64, NAME_PATTERN
from appliance.models import Channel
from channel_engine import ChannelEngineError, UnknownSubscriptionError, check_subscription_name

POSITION = {"oneOf": [
    {"type": "string", "enum": ["earliest", "latest"]},
    {"type": "object", "additionalProperties": False, "required": ["timestamp_ms"],
     "properties": {"timestamp_ms": {"type": "integer", "minimum": 0, "maximum": MAX_I64}}},
    {"type": "object", "additionalProperties": False, "required": ["offsets"],
     "properties": {"offsets": {
         "type": "object", "minProperties": 1,
         "description": "partition number (as text) -> offset",
         "additionalProperties": {"type": "integer", "minimum": 0, "maximum": MAX_I64}}}}],
    "description": '"earliest", "latest", {"timestamp_ms": t} or {"offsets": {"0": 10}}'}
ADD_REQUEST = {"type": "object", "additionalProperties": False, "required": ["name"],
               "properties": {"name": {"type": "string", "pattern": NAME_PATTERN},
                              "start": {**POSITION, "default": "earliest"}}}
RESET_REQUEST = {"type": "object", "additionalProperties": False, "required": ["to"],
                 "properties": {"to": POSITION}}
_COUNT = {"type": "integer", "minimum": 0}
SUBSCRIPTION = {
    "type": "object",
    "required": ["name", "events_untaken", "events_queued", "events_in_flight", "open_takes",
                 "oldest_untaken_timestamp_ms", "oldest_untaken_age_ms", "export", "kafka",
                 "counters", "partitions"],
    "properties": {
        "name": {"type": "string"},
        "events_untaken": {**_COUNT, "description": "lag: events not yet committed by a take"},
        "events_queued": _COUNT, "events_in_flight": _COUNT, "open_takes": _COUNT,
        "oldest_untaken_timestamp_ms": {"type": "integer", "nullable": True},
        "oldest_untaken_age_ms": {"type": "integer", "nullable": True},
        "export": {"type": "boolean", "description": "the channel's export drains it"},
        "kafka": {"type": "boolean", "description": "the channel's Kafka sink drains it"},
        "counters": {"type": "object", "additionalProperties": {"type": "integer"}},
        "partitions": {"type": "array", "items": {
            "type": "object", "properties": {"partition": _COUNT, "taken_through": _COUNT,
                                             "events_untaken": _COUNT, "events_queued": _COUNT,
                                             "events_in_flight": _COUNT}}}}}
LIST = {"type": "object", "required": ["subscriptions"],
        "properties": {"subscriptions": {"type": "array", "items": SUBSCRIPTION}}}
_SUB = OpenApiParameter("sub", {"type": "string"}, OpenApiParameter.PATH,
                        description="the subscription's name")


def subscription_json(row: Channel, name: str) -> dict[str, Any]:
    """One subscription of the channel as the API shows it; 404 when there is none."""
    status = channels.open_channel(row).status()
    if name not in status["subscriptions"]:
        raise UnknownSubscriptionError(row.name, name, list(status["subscriptions"]))
    return lag.subscription_lag(row, status)[name]


@contextmanager
def _refused_input(field: str) -> Iterator[None]:
    """The ValueError of a bad request field as a 400 naming it (the engine's errors pass:
    SubscriptionExistsError is a ValueError too, and a 409)."""
    try:
        yield
    except ChannelEngineError:
        raise
    except ValueError as exc:
        raise ValidationError({field: [str(exc)]}) from exc


class SubscriptionsView(ApiView):
    """List a channel's subscriptions, or add one."""

    role = "consume"
    method_roles = {"POST": "admin"}
    schema = RequiredBodySchema()
    parser_classes = [JSONParser]

    @extend_schema(operation_id="subscriptions_list", responses={200: LIST, **errors(404, 503)})
    def get(self, request: Request, name: str) -> Response:
        """Every subscription of the channel, `default` first, with its lag."""
        status = channels.open_channel(self.row).status()
        return Response({"subscriptions": list(lag.subscription_lag(self.row, status).values())})

    @extend_schema(operation_id="subscription_add", request={"application/json": ADD_REQUEST},
                   responses={201: SUBSCRIPTION, **errors(400, 404, 409, 415, 503)})
    def post(self, request: Request, name: str) -> Response:
        """Add a subscription at `start` (earliest unless given); durable when it answers."""
        body = request.data
        if not isinstance(body, dict):
            raise ValidationError({"name": ["expected a JSON object with name and start"]})
        unknown = sorted(set(body) - {"name", "start"})
        if unknown:
            raise ValidationError({unknown[0]: ["unknown field"]})
        with _refused_input("name"):
            sub = check_subscription_name(body.get("name"))
        with _refused_input("start"):
            manage_subscriptions.add(self.row, sub, manage_subscriptions.position(
                body.get("start", "earliest"), self.row.partitions))
        return Response(subscription_json(self.row, sub), status=201)


class SubscriptionView(ApiView):
    """One subscription: describe or remove it."""

    role = "consume"
    method_roles = {"DELETE": "admin"}

    @extend_schema(operation_id="subscription_detail", parameters=[_SUB],
                   responses={200: SUBSCRIPTION, **errors(404, 503)})
    def get(self, request: Request, name: str, sub: str) -> Response:
        """The subscription and its lag."""
        return Response(subscription_json(self.row, sub))

    @extend_schema(operation_id="subscription_remove", parameters=[_SUB],
                   responses={204: None, **errors(404, 409, 503)})
    def delete(self, request: Request, name: str, sub: str) -> Response:
        """Remove a subscription with no take open; what only it held is freed."""
        manage_subscriptions.remove(self.row, sub)  # Refused: api/handler.py
        return Response(status=204)


class SubscriptionResetView(ApiView):
    """Move a subscription (kafka-consumer-groups --reset-offsets)."""

    role = "admin"
    schema = RequiredBodySchema()
    parser_classes = [JSONParser]

    @extend_schema(operation_id="subscription_reset", parameters=[_SUB],
                   request={"application/json": RESET_REQUEST},
                   responses={200: SUBSCRIPTION, **errors(400, 404, 409, 415, 503)})
    def post(self, request: Request, name: str, sub: str) -> Response:
        """Reset to `to`; refused (409) while it has takes open; durable when it answers."""
        body = request.data
        if not isinstance(body, dict) or set(body) != {"to"}:
            raise ValidationError({"to": ["expected a JSON object with just `to`"]})
        with _refused_input("to"):
            manage_subscriptions.reset(self.row, sub, manage_subscriptions.position(
                body["to"], self.row.partitions))
        return Response(subscription_json(self.row, sub))

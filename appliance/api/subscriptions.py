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

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels, lag
from appliance.api.base import ApiView
from appliance.api.problems import Problem
from appliance.api.schema import RequiredBodySchema, errors
from appliance.models import Channel
from channel_engine import (
    DEFAULT_SUBSCRIPTION,
    ChannelEngineError,
    UnknownSubscriptionError,
    check_subscription_name,
)

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"  # channel_engine.check_subscription_name's rule
MAX_I64 = 2**63 - 1
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
                 "oldest_untaken_timestamp_ms", "oldest_untaken_age_ms", "export",
                 "counters", "partitions"],
    "properties": {
        "name": {"type": "string"},
        "events_untaken": {**_COUNT, "description": "lag: events not yet committed by a take"},
        "events_queued": _COUNT, "events_in_flight": _COUNT, "open_takes": _COUNT,
        "oldest_untaken_timestamp_ms": {"type": "integer", "nullable": True},
        "oldest_untaken_age_ms": {"type": "integer", "nullable": True},
        "export": {"type": "boolean", "description": "the channel's export drains it"},
        "counters": {"type": "object", "additionalProperties": {"type": "integer"}},
        "partitions": {"type": "array", "items": {
            "type": "object", "properties": {"partition": _COUNT, "taken_through": _COUNT,
                                             "events_untaken": _COUNT, "events_queued": _COUNT,
                                             "events_in_flight": _COUNT}}}}}
LIST = {"type": "object", "required": ["subscriptions"],
        "properties": {"subscriptions": {"type": "array", "items": SUBSCRIPTION}}}
_SUB = OpenApiParameter("sub", {"type": "string"}, OpenApiParameter.PATH,
                        description="the subscription's name")


def position(value: Any, field: str, partitions: int) -> Any:
    """The engine's position for a request's `start` or `to`; ValidationError naming the
    field when it is none of the four forms (module doc)."""
    if value in ("earliest", "latest"):
        return value
    if isinstance(value, dict) and set(value) == {"timestamp_ms"}:
        stamp = value["timestamp_ms"]
        if type(stamp) is int and 0 <= stamp <= MAX_I64:
            return value
        raise ValidationError({field: ["timestamp_ms must be an integer >= 0 (ms since "
                                       "the epoch)"]})
    if isinstance(value, dict) and set(value) == {"offsets"}:
        return _offsets(value["offsets"], field, partitions)
    raise ValidationError({field: ['expected "earliest", "latest", {"timestamp_ms": t} or '
                                   '{"offsets": {"<partition>": offset}}']})


def _offsets(offsets: Any, field: str, partitions: int) -> dict[int, int]:
    if not isinstance(offsets, dict) or not offsets:
        raise ValidationError({field: ["offsets must be an object of partition -> offset"]})
    heads = {}
    for key, offset in offsets.items():
        if not (key.isascii() and key.isdigit() and int(key) < partitions):
            raise ValidationError({field: [f"offsets: the channel has partitions 0 to "
                                           f"{partitions - 1}, not {key!r}"]})
        if type(offset) is not int or not 0 <= offset <= MAX_I64:
            raise ValidationError({field: [f"offsets: partition {key}'s offset must be an "
                                           "integer >= 0"]})
        heads[int(key)] = offset
    return heads


def subscription_json(row: Channel, name: str) -> dict[str, Any]:
    """One subscription of the channel as the API shows it; 404 when there is none."""
    status = channels.open_channel(row).status()
    if name not in status["subscriptions"]:
        raise UnknownSubscriptionError(row.name, name, list(status["subscriptions"]))
    return lag.subscription_lag(row, status)[name]


def _engine_refusal(exc: ValueError, field: str) -> ValidationError:
    """A position the engine refused (an offset outside the log): a 400 naming the field."""
    return ValidationError({field: [str(exc)]})


class SubscriptionsView(ApiView):
    """List a channel's subscriptions, or add one."""

    role = "consume"
    schema = RequiredBodySchema()
    parser_classes = [JSONParser]

    def get_permissions(self) -> list[Any]:
        """Reading needs consume; adding, admin."""
        self.role = "admin" if self.request.method == "POST" else "consume"
        return super().get_permissions()

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
        try:
            sub = check_subscription_name(body.get("name"))
        except ValueError as exc:
            raise ValidationError({"name": [str(exc)]}) from exc
        start = position(body.get("start", "earliest"), "start", self.row.partitions)
        try:
            channels.open_channel(self.row).add_subscription(sub, start)
        except ChannelEngineError:  # SubscriptionExistsError is a ValueError too: a 409
            raise
        except ValueError as exc:
            raise _engine_refusal(exc, "start") from exc
        return Response(subscription_json(self.row, sub), status=201)


class SubscriptionView(ApiView):
    """One subscription: describe or remove it."""

    role = "consume"

    def get_permissions(self) -> list[Any]:
        """Reading needs consume; removing, admin."""
        self.role = "admin" if self.request.method == "DELETE" else "consume"
        return super().get_permissions()

    @extend_schema(operation_id="subscription_detail", parameters=[_SUB],
                   responses={200: SUBSCRIPTION, **errors(404, 503)})
    def get(self, request: Request, name: str, sub: str) -> Response:
        """The subscription and its lag."""
        return Response(subscription_json(self.row, sub))

    @extend_schema(operation_id="subscription_remove", parameters=[_SUB],
                   responses={204: None, **errors(404, 409, 503)})
    def delete(self, request: Request, name: str, sub: str) -> Response:
        """Remove a subscription with no take open; what only it held is freed."""
        if sub == DEFAULT_SUBSCRIPTION:
            raise Problem(409, "channel-conflict", "subscription 'default' cannot be removed: "
                          "takes that name no subscription use it", field="sub")
        if sub == self.row.export_subscription:
            raise Problem(409, "channel-conflict", f"the channel's export drains {sub!r}: "
                          "set export_subscription to another first", field="sub")
        channels.open_channel(self.row).remove_subscription(sub)
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
        to = position(body["to"], "to", self.row.partitions)
        try:
            channels.open_channel(self.row).reset_subscription(sub, to)
        except ChannelEngineError:
            raise
        except ValueError as exc:
            raise _engine_refusal(exc, "to") from exc
        return Response(subscription_json(self.row, sub))

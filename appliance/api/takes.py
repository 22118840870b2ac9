"""Take transactions over HTTP, for consumers on other machines.

    POST /api/v1/channels/{name}/takes                {"max_events": N, "lease_seconds": S,
                                                       "subscription": "default"}
         -> 200 {"take_id", "lease_expires_at_ms", "events": [event, ...]}
    POST /api/v1/channels/{name}/takes/{take_id}/commit    -> 200 {"committed": true,
                                                                   "already_committed": bool}
    POST /api/v1/channels/{name}/takes/{take_id}/rollback  -> 200 {"rolled_back": true}

A take reads the queue of one subscription (appliance/api/subscriptions.py): `default`
unless it names another; a token scoped to subscriptions takes from those alone (403
otherwise). Commit and rollback need only the receipt: it stands for the take, whose
subscription the engine remembers.

A take_id is a receipt, as an SQS receipt handle is: "<engine take id>.<signature>",
the signature an HMAC (SECRET_KEY) of the channel, the engine's id and the caller
(token or user). Only the caller that took the events can commit or roll them back;
any other receipt answers 404.

An event is {"partition", "offset", "timestamp", "key", "headers", "body",
"body_base64"}: key, header values and body as text when they are UTF-8 (else
null), and the body always as base64 too. The take is leased: committed or rolled
back by any web worker that gets its receipt, and returned to the queue by itself when
the lease runs out (commit then answers 409). An empty channel answers at once
with no events (and no take to commit).

Retries are safe: commit is idempotent (a repeated commit answers 200 with
"already_committed": true, so a consumer whose first answer was lost learns the
truth), and so is rollback of a take already returned (200). What cannot be done
answers 409 with the reason: a commit after the take was rolled back or its lease ran
out (its events are queued again), a rollback after commit (they are gone for good).
The owner remembers how its last 10,000 takes ended; for older ones, or after the
channel's owner process changed, a commit answers 409 "gone" as for a lapsed lease.
"""
from __future__ import annotations

import re
import time
from typing import Any

import orjson
from django.http import HttpResponse
from django.utils.crypto import constant_time_compare, salted_hmac
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels
from appliance.api.base import ApiView
from appliance.api.events import EventOut, event_json
from appliance.api.problems import Problem
from appliance.api.schema import errors
from appliance.manage_subscriptions import NAME_PATTERN
from appliance.models import ApiToken, Channel
from channel_engine import DEFAULT_SUBSCRIPTION, TakeCommittedError

MAX_LEASE_S = 3600
RECEIPT = r"^[0-9]{1,20}\.[0-9a-f]{20}$"


def _caller(request: Request) -> str:
    token = request.auth
    return f"t{token.pk}" if isinstance(token, ApiToken) else f"u{request.user.pk}"


def receipt(channel: Channel, take_id: int, caller: str) -> str:
    """The take_id a consumer sees: the engine's id, signed for this channel (this one: a
    channel recreated under its name is another) and caller."""
    signature = salted_hmac("weir.take", f"{channel.name}:{channel.pk}:{take_id}:{caller}",
                            algorithm="sha256").hexdigest()[:20]
    return f"{take_id}.{signature}"


def take_id_of(request: Request, channel: Channel, given: str) -> int:
    """The engine's take id of a receipt this caller was given; 404 for any other."""
    if not re.fullmatch(RECEIPT, given, flags=re.ASCII) or not constant_time_compare(
            given, receipt(channel, int(given.partition(".")[0]), _caller(request))):
        raise Problem(404, "not-found", "no such take for this caller (take_id is the "
                                        "receipt a take gave)", field="take_id")
    return int(given.partition(".")[0])


class TakeRequest(serializers.Serializer):
    """What a consumer asks for."""

    max_events = serializers.IntegerField(min_value=1, max_value=2**31 - 1,
                                          help_text="at most the channel's transaction_capacity")
    lease_seconds = serializers.IntegerField(min_value=1, max_value=MAX_LEASE_S, default=60)
    subscription = serializers.RegexField(
        NAME_PATTERN, default=DEFAULT_SUBSCRIPTION, max_length=64,
        help_text="the subscription whose queue to take from")


class _TakeResponse(serializers.Serializer):
    take_id = serializers.RegexField(RECEIPT, allow_null=True)
    lease_expires_at_ms = serializers.IntegerField(allow_null=True)
    events = EventOut(many=True)


class TakesView(ApiView):
    """Begin a take transaction and get its events."""

    role = "consume"

    # documented as JSON: a form's empty field reads as an omitted one in DRF (a
    # subscription sent as "" would take from `default`); forms are taken as before
    @extend_schema(request={"application/json": TakeRequest},
                   responses={200: _TakeResponse, **errors(400, 404, 409, 415, 503)})
    def post(self, request: Request, name: str) -> HttpResponse:
        """Take up to max_events events under a lease."""
        row = self.row
        asked = TakeRequest(data=request.data)
        asked.is_valid(raise_exception=True)
        max_events, lease_s = asked.validated_data["max_events"], \
            asked.validated_data["lease_seconds"]
        subscription = asked.validated_data["subscription"]
        if max_events > row.transaction_capacity:
            raise ValidationError({"max_events": [
                f"at most transaction_capacity={row.transaction_capacity}"]})
        token = request.auth
        if isinstance(token, ApiToken) and not token.allows_subscription(subscription):
            raise Problem(403, "permission-denied", f"this token may take from subscriptions "
                          f"{', '.join(token.subscriptions)} only", field="subscription")
        tx = channels.open_channel(row).take(lease_ms=lease_s * 1000, subscription=subscription)
        events = tx.take(max_events)
        if not events:
            tx.rollback()
            body: dict[str, Any] = {"take_id": None, "lease_expires_at_ms": None, "events": []}
        else:
            body = {"take_id": receipt(row, tx.take_id, _caller(request)),
                    "lease_expires_at_ms": int(time.time() * 1000) + lease_s * 1000,
                    "events": [event_json(e) for e in events]}
        return HttpResponse(orjson.dumps(body), content_type="application/json")


_TAKE_ID = OpenApiParameter("take_id", {"type": "string", "pattern": RECEIPT},
                            OpenApiParameter.PATH, description="the receipt a take gave")


class TakeCommitView(ApiView):
    """Commit a take: its events are gone for good."""

    role = "consume"

    @extend_schema(request=None, parameters=[_TAKE_ID], responses={
        200: {"type": "object", "additionalProperties": False,
              "properties": {"committed": {"type": "boolean", "enum": [True]},
                             "already_committed": {
                                 "type": "boolean",
                                 "description": "true: a repeated commit, which changed nothing"}},
              "required": ["committed", "already_committed"]},
        **errors(404, 409, 503)}, description="Idempotent: a repeated commit answers 200 with "
        "already_committed; a take rolled back or lapsed answers 409.")
    def post(self, request: Request, name: str, take_id: str) -> Response:
        """Commit."""
        engine_id = take_id_of(request, self.row, take_id)
        try:
            channels.open_channel(self.row).commit_take(engine_id)
        except TakeCommittedError:  # a repeated commit (expired: 409 take-expired)
            return Response({"committed": True, "already_committed": True})
        return Response({"committed": True, "already_committed": False})


class TakeRollbackView(ApiView):
    """Roll a take back: its events return to the head of the queue."""

    role = "consume"

    @extend_schema(request=None, parameters=[_TAKE_ID], responses={
        200: {"type": "object",
              "properties": {"rolled_back": {"type": "boolean", "enum": [True]}},
              "required": ["rolled_back"], "additionalProperties": False},
        **errors(404, 409, 503)},
        description="Idempotent for a take already returned to the queue; 409 after a commit.")
    def post(self, request: Request, name: str, take_id: str) -> Response:
        """Roll back."""
        engine_id = take_id_of(request, self.row, take_id)
        channels.open_channel(self.row).rollback_take(engine_id)  # committed: 409
        return Response({"rolled_back": True})

"""The one shape of every API error: RFC 9457 problem details.

    Content-Type: application/problem+json
    {"type": "https://weir.dev/problems/channel-full", "title": "Channel full",
     "status": 503, "detail": "channel 'orders' is full: ...", "retry_after": 1}

Members (RFC 9457 section 3): `type` (a URI naming the kind of problem: always
TYPE_BASE + a slug from TITLES, never about:blank, so a client tells problems apart by
one member), `title` (the slug's, the same for every occurrence), `status` (the HTTP
status), `detail` (this occurrence, in words). Extension members, only where they apply:
`field` (the request field or setting at fault), `index` (the event at fault in a produce
batch, 0-based), `errors` (every field at fault: name -> messages), `retry_after` (seconds;
the `Retry-After` header says the same), `request_id` (5xx: appliance/request_id.py), and
for an offset range `log_start_offset`, `log_end_offset`, `last_stable_offset`; `path`
(the file or directory at fault: channel-exists), `paths` (those missing:
channel-storage-missing).

A view refuses by raising Problem; appliance/api/handler.py turns every other exception
into one. The slugs and titles below are the whole catalogue (README, "API errors").
"""
from __future__ import annotations

from typing import Any

import orjson
from django.http import HttpResponse

CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "https://weir.dev/problems/"
RETRY_AFTER_S = 1  # what a client waits before retrying a refusal that passes by itself

TITLES = {
    # the request itself
    "validation-error": "Invalid request",
    "bad-request": "Bad request",
    "parse-error": "Malformed request body",
    "invalid-event": "Invalid event",
    "invalid-setting": "Invalid channel setting",
    "unsupported-media-type": "Unsupported media type",
    "not-acceptable": "Not acceptable",
    "body-too-large": "Request body too large",
    "batch-too-large": "Batch too large",
    "too-many-events": "Too many events",
    "offset-out-of-range": "Offset out of range",
    "method-not-allowed": "Method not allowed",
    "not-found": "Not found",
    # who asks
    "not-authenticated": "Authentication required",
    "authentication-failed": "Authentication failed",
    "permission-denied": "Permission denied",
    "throttled": "Too many requests",
    "token-busy": "Too many requests in flight",
    # the channel's state
    "channel-not-found": "Channel not found",
    "channel-conflict": "Conflict with the channel's state",
    "channel-exists": "A channel's files are there already",
    "take-expired": "Take no longer open",
    "take-committed": "Take already committed",
    "subscription-not-found": "Subscription not found",
    "subscription-exists": "Subscription exists",
    "subscription-busy": "Subscription busy",
    "channel-full": "Channel full",
    "puts-paused": "Puts paused",
    "disk-space-low": "Disk space below the channel's minimum",
    "disk-full": "Disk full",
    "channel-write-failed": "Channel write failed",
    "channel-owner-changing": "Channel owner changing",
    "channel-cannot-open": "Channel cannot be opened",
    "channel-storage-missing": "Channel storage missing",
    "channel-damaged": "Channel damaged",
    # the appliance
    "broker-unavailable": "Task broker unavailable",
    "appliance-unavailable": "Appliance unavailable",
    "internal-error": "Internal server error",
}


class Problem(Exception):
    """A refusal the API answers as a problem: raise it from a view (or anything it calls)."""

    def __init__(self, status: int, slug: str, detail: str, *, field: str | None = None,
                 index: int | None = None, retry_after: int | None = None,
                 **extra: Any) -> None:
        super().__init__(detail)
        assert slug in TITLES, slug
        self.status, self.slug, self.detail = status, slug, detail
        self.members: dict[str, Any] = {"field": field, "index": index,
                                        "retry_after": retry_after, **extra}

    def body(self) -> dict[str, Any]:
        """The JSON object of the answer (members that do not apply left out)."""
        body = {"type": TYPE_BASE + self.slug, "title": TITLES[self.slug],
                "status": self.status, "detail": self.detail}
        body.update({k: v for k, v in self.members.items() if v is not None})
        return body

    def body_text(self) -> str:
        """The body as JSON text."""
        return orjson.dumps(self.body()).decode()

    def response(self, headers: dict[str, str] | None = None) -> HttpResponse:
        """The HTTP answer: problem+json, with Retry-After when retrying helps."""
        response = HttpResponse(orjson.dumps(self.body()), status=self.status,
                                content_type=CONTENT_TYPE)
        for name, value in (headers or {}).items():
            response[name] = value
        if self.members["retry_after"] is not None:
            response["Retry-After"] = str(self.members["retry_after"])
        return response


def retry_later(status: int, slug: str, detail: str) -> Problem:
    """A refusal that passes by itself: Retry-After RETRY_AFTER_S."""
    return Problem(status, slug, detail, retry_after=RETRY_AFTER_S)

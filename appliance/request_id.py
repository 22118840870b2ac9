"""Request ids and server errors: every request has an id, every log line of it carries the
id, every answer names it, and every 500 is logged with its traceback.

RequestIdMiddleware (first in MIDDLEWARE, so it wraps every other one) keeps a well-formed
incoming `X-Request-ID` (1-128 characters of A-Z a-z 0-9 . _ : -, such as nginx's
$request_id or a load balancer's) or makes one (32 hex digits: a version 4 UUID, as
uuid.uuid4().hex, its random bits from the random module: an id names a request in the
logs, it guards nothing, so it needs no os.urandom, a system call that releases the GIL,
on every request; random reseeds itself in a forked child, so workers never share a
sequence). The id is
`request.request_id`, the context variable `current()` of the request's thread while it is
handled, and the `X-Request-ID` header of every answer. A 5xx answer whose body is a JSON
object (a problem of the API, application/problem+json, included) gets `"request_id"`
added.

RequestIdFilter puts `request_id` on every log record ("-" outside a request) for LOGGING's
formatter (appliance/settings.py: one line a record, to stderr, which gunicorn and Celery
write to $WEIR_VAR_DIR/log/<process>.log under scripts/run.sh).

server_error is Django's handler500. Any exception a view (DRF's too: its exception handler
leaves non-API exceptions to Django), a middleware or a template raises reaches it after
Django has logged it with its traceback on the `django.request` logger. It answers a 500
problem (internal-error, naming the request id; appliance/api/problems.py) under /api/ and
a plain page naming the id elsewhere, built without templates so that a broken template
cannot break it. not_found is Django's handler404: a path no route matches (say a
partition that is not a number) is a 404 not-found problem under /api/, Django's page
elsewhere; bad_request (handler400: a suspicious request Django refuses before any view,
such as a Host not in ALLOWED_HOSTS) and permission_denied (handler403: Django's own
PermissionDenied outside DRF) answer problems under /api/ the same way.
"""
from __future__ import annotations

import contextvars
import json
import logging
import re
from collections.abc import Callable
from random import getrandbits

from django.http import HttpRequest, HttpResponse, HttpResponseServerError
from django.templatetags.static import static
from django.utils.html import escape
from django.views import defaults

from appliance.api.problems import Problem

HEADER = "X-Request-ID"
JSON_TYPES = ("application/json", "application/problem+json")
_WELL_FORMED = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# a version 4 UUID's fixed bits (RFC 4122: version 4, variant 10), as uuid.UUID sets them
_UUID4_CLEAR = ~(0xC000 << 48 | 0xF000 << 64)
_UUID4_SET = 0x8000 << 48 | 4 << 76
_current: contextvars.ContextVar[str] = contextvars.ContextVar("weir_request_id", default="-")


def current() -> str:
    """The id of the request this thread is handling, or "-"."""
    return _current.get()


def bind(rid: str) -> contextvars.Token[str]:
    """Make `rid` the current request id of this thread (for a request served outside
    Django's middleware: appliance/fast_produce.py); unbind() with what it returns."""
    return _current.set(rid)


def unbind(token: contextvars.Token[str]) -> None:
    """Restore the request id bind() replaced."""
    _current.reset(token)


def request_id_of(incoming: str | None) -> str:
    """The incoming id when well-formed, else a new one."""
    if incoming and _WELL_FORMED.fullmatch(incoming):
        return incoming
    return f"{getrandbits(128) & _UUID4_CLEAR | _UUID4_SET:032x}"


class RequestIdMiddleware:
    """Gives each request its id and returns it on every answer (see the module doc)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        """Handle the request with its id set; name the id on the answer."""
        rid = request_id_of(request.headers.get(HEADER))
        request.request_id = rid  # type: ignore[attr-defined]
        token = bind(rid)
        try:
            response = self.get_response(request)
        finally:
            unbind(token)
        response[HEADER] = rid
        if response.status_code >= 500:
            _name_in_json_body(response, rid)
        return response


def _name_in_json_body(response: HttpResponse, rid: str) -> None:
    """Add "request_id" to a JSON object body (a 503 of the API, say)."""
    if response.streaming or response.get("Content-Type", "").split(";")[0] not in \
            JSON_TYPES:
        return
    try:
        body = json.loads(response.content)
    except ValueError:
        return
    if not isinstance(body, dict) or "request_id" in body:
        return
    body["request_id"] = rid
    response.content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    if response.has_header("Content-Length"):
        response["Content-Length"] = str(len(response.content))


class RequestIdFilter(logging.Filter):
    """Puts the current request id on every record as `request_id`."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the id; never drops a record."""
        record.request_id = _current.get()
        return True


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: a problem naming the request id under /api/, a plain page elsewhere."""
    rid = getattr(request, "request_id", None) or current()
    if request.path.startswith("/api/"):
        return Problem(500, "internal-error", "the server failed to answer this request; it "
                       f"is logged with its traceback under request id {rid}",
                       request_id=rid).response()
    # plain HTML, no template: rendering one may be what failed
    return HttpResponseServerError(
        '<!doctype html><html lang="en"><meta charset="utf-8"><title>Server error · Weir'
        f'</title><link rel="stylesheet" href="{escape(static("weir/weir.css"))}">'
        f'<link rel="icon" href="{escape(static("weir/favicon.svg"))}" type="image/svg+xml">'
        '<header class="top"><a class="brand" href="/">Weir</a></header><main>'
        "<h1>Server error</h1><p>The server failed to answer this request. It is "
        f"logged with its traceback under request id <code id=\"request-id\">{escape(rid)}"
        "</code>: give that id to whoever runs this appliance.</p>"
        '<p><a href="/">Back to the channels</a></p></main></html>',
        content_type="text/html; charset=utf-8")


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler400: a bad-request problem under /api/, Django's own page elsewhere."""
    if request.path.startswith("/api/"):
        return Problem(400, "bad-request", "the request was refused before reaching the "
                       "API (see the appliance's log for why)").response()
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler403: a permission-denied problem under /api/, Django's own page elsewhere."""
    if request.path.startswith("/api/"):
        return Problem(403, "permission-denied", str(exception) or "not allowed"
                       ).response()
    return defaults.permission_denied(request, exception)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler404: a not-found problem under /api/, Django's own page elsewhere."""
    if request.path.startswith("/api/"):
        return Problem(404, "not-found", f"no such path: {request.path}").response()
    return defaults.page_not_found(request, exception)

"""The produce endpoint's fast path: POST /api/v1/channels/{name}/events served in front of
Django (appliance/wsgi.py wraps Django's WSGI application in FastProduce).

Why: a 1-event request spent about 60% of its CPU in Django's middleware, DRF's dispatch
and two Redis round trips (the row cache's generation and the throttle's counter), around
a put that costs a tenth of that (bench/http_small.py, py-spy). Here a request that will
be answered 200 takes the shortest road: the same checks, the same put, the same answer,
without the framework around them.

It serves a request only when it can tell, without Django, that Django would answer it
200:
  * POST to /api/v1/channels/<name>/events (no SCRIPT_NAME, no query string, no cookie), a
    Host ALLOWED_HOSTS accepts, an Accept that takes JSON (none, */*, application/* or
    application/json, without parameters), a Content-Length (not chunked) within
    WEIR_MAX_PRODUCE_BYTES and a body that long;
  * a `Bearer` (or `Token`) key of a live token (appliance/auth.py, appliance/row_cache.py)
    allowed to produce on an existing channel (appliance/permissions.py);
  * within the token's rate (appliance/throttling.py, which counts it once);
  * a body appliance/event_parsing.py accepts, within the channel's transaction_capacity,
    puts not paused (appliance/producing.py).
Anything else goes on to Django as it came (the body read here handed on, and the request
id), which answers it as before: every refusal (400, 401, 403, 404, 413, 429, 503) keeps
one implementation, and so does any failure before the put (a database error reading a
token, say: Django's 500, logged under the request id).
An exception from the put itself (channel full, disk full, an owner change, a bug) is
handed to Django with the request (environ[PUT_ERROR]); the produce view raises it instead
of putting again, so it is answered, logged and counted like any other. Django's
request_started and request_finished receivers' work is done around the fast path's own
(request_boundary: database connections, the row cache's per-request generation), and
log lines carry the request id. The 200 has the headers Django's middleware would add
(request id, CSP, security headers, Vary, Allow): tests/appliance/test_fast_produce.py
compares the two answers header by header.
"""
from __future__ import annotations

import io
import logging
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from django import db
from django.conf import settings
from django.http import HttpRequest
from django.http.request import split_domain_port, validate_host

from appliance import csp, request_id, row_cache
from appliance.auth import TokenAuthentication, touch
from appliance.event_parsing import EventError, parse
from appliance.models import ApiToken, Channel, hash_key
from appliance.producing import PUT_ERROR, put_events
from appliance.throttling import COUNTED, TokenRateThrottle
from channel_engine import PendingEvent

log = logging.getLogger(__name__)
_PATH = re.compile(r"/api/v1/channels/([A-Za-z0-9._-]+)/events")
_JSON_RANGES = {"*/*", "application/*", "application/json"}
# what request_boundary stands for: tests/appliance/test_fast_produce.py checks that these
# are all the receivers Django's request signals have (close_caches: nothing here uses
# Django's cache; reset_urlconf: nothing here sets a urlconf)
RECEIVERS = {"started": {"reset_queries", "close_old_connections", "request_started"},
             "finished": {"close_old_connections", "close_caches", "reset_urlconf",
                          "request_finished"}}
_thread = threading.local()  # this thread's database connection (_thread_connection)
StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def request_boundary(row_cache_hook: Callable[..., None]) -> None:
    """What the receivers of Django's request_started and request_finished do, for this
    path (RECEIVERS; sending the signals costs a tenth of a request): the row cache's
    per-request generation, and the connection housekeeping (close_old_connections,
    reset_queries) when this thread has a database connection open."""
    row_cache_hook()
    if _thread_connection().connection is not None:
        db.reset_queries()
        db.close_old_connections()


def _thread_connection() -> Any:
    """This thread's default database connection (Django's wrapper, one a thread), found once
    a thread: db.connection finds it through two proxies and an asgiref Local at every use.
    Found again should Django's handler get new storage."""
    storage = db.connections._connections
    found = getattr(_thread, "connection", None)
    if found is None or found[0] is not storage:
        found = _thread.connection = (storage, db.connections[db.DEFAULT_DB_ALIAS])
    return found[1]


class FastProduce:
    """A WSGI application: the fast path for produce requests, Django for the rest."""

    def __init__(self, django: WsgiApp) -> None:
        self.django = django
        self.headers = self._fixed_headers("/api/v1/channels/-/events")  # a 200's, fixed
        self.hosts: dict[str, bool] = {}  # Host header -> ALLOWED_HOSTS accepts it
        self.throttle: TokenRateThrottle | None = None  # at first use: the rate then

    def __call__(self, environ: dict[str, Any], start_response: StartResponse
                 ) -> Iterable[bytes]:
        """Serve a produce request that will succeed; hand anything else to Django."""
        match = _PATH.fullmatch(environ.get("PATH_INFO", ""))
        if match is None or environ.get("REQUEST_METHOD") != "POST" or not self._plain(environ):
            return self.django(environ, start_response)
        rid = request_id.request_id_of(environ.get("HTTP_X_REQUEST_ID"))
        environ["HTTP_X_REQUEST_ID"] = rid  # Django, answering instead, keeps the same id
        bound = request_id.bind(rid)
        try:
            answer = self._produce(environ, match.group(1))
        finally:
            request_id.unbind(bound)
            try:
                request_boundary(row_cache.request_finished)
            except Exception:  # noqa: BLE001 - a committed put's 200 must not become a 500
                log.warning("after a produce request: the database connection's clean-up "
                            "failed", exc_info=True)
        if answer is None:
            return self.django(environ, start_response)
        start_response("200 OK", [*self.headers, ("Content-Length", str(len(answer))),
                                  (request_id.HEADER, rid)])
        return [answer]

    def _plain(self, environ: dict[str, Any]) -> bool:
        """A request whose answer no middleware, renderer or cookie changes beyond the
        headers added here (no query string: ?format=; no cookie: CSRF's; no Accept
        parameter: indent=)."""
        if environ.get("SCRIPT_NAME") or environ.get("QUERY_STRING") or \
                "HTTP_COOKIE" in environ or "HTTP_TRANSFER_ENCODING" in environ or \
                settings.SECURE_SSL_REDIRECT or settings.SECURE_HSTS_SECONDS or \
                settings.USE_X_FORWARDED_HOST:
            return False
        accept = environ.get("HTTP_ACCEPT", "")
        if accept and (";" in accept or any(part.strip() not in _JSON_RANGES
                                            for part in accept.split(","))):
            return False
        # as Django's get_host: an empty Host header is a Host, refused
        host = environ["HTTP_HOST"] if "HTTP_HOST" in environ else environ.get("SERVER_NAME", "")
        valid = self.hosts.get(host)
        if valid is None:
            domain, _ = split_domain_port(host)
            valid = bool(domain) and validate_host(domain, settings.ALLOWED_HOSTS)
            if len(self.hosts) < 64:  # a client may send any Host: remember a few
                self.hosts[host] = valid
        return valid

    def _produce(self, environ: dict[str, Any], name: str) -> bytes | None:
        """Put the request's events and return the answer's body; None to hand the request
        to Django (its body restored), which answers it."""
        try:
            request_boundary(row_cache.request_started)
            checked = self._checked(environ, name)
        except Exception:  # noqa: BLE001 - nothing is written yet: Django answers (and logs)
            log.debug("produce fast path: handed to Django", exc_info=True)
            return None
        if checked is None:
            return None
        row, events = checked
        try:
            committed = put_events(row, events)
        except Exception as exc:  # noqa: BLE001 - every kind is Django's to answer
            environ[PUT_ERROR] = exc
            return None
        return orjson.dumps({"events": len(events), "committed": [
            {"partition": p, "first_offset": first, "last_offset": last}
            for p, first, last in committed]})

    def _checked(self, environ: dict[str, Any], name: str
                 ) -> tuple[Channel, list[PendingEvent]] | None:
        """The channel and the events of a request that may be put; None for any other."""
        length = environ.get("CONTENT_LENGTH") or "0"
        if not (length.isascii() and length.isdigit()) or \
                int(length) > settings.WEIR_MAX_PRODUCE_BYTES:
            return None
        body = environ["wsgi.input"].read(int(length)) if int(length) else b""
        environ["wsgi.input"] = io.BytesIO(body)  # for Django, should it answer instead
        if len(body) != int(length):  # the client went away mid-body
            return None
        token = self._token(environ.get("HTTP_AUTHORIZATION", ""))
        row = row_cache.channel(name)
        if token is None or row is None or not token.allows("produce", None) or \
                not token.allows("produce", row):
            return None
        if self.throttle is None:
            self.throttle = TokenRateThrottle()
        if not self.throttle.allow_token(token):
            return None  # Django counts it again, and refuses it as the window is spent
        environ[COUNTED] = True  # Django, answering instead, must not count it again
        try:
            events = parse(body, environ.get("CONTENT_TYPE", ""))
        except EventError:
            return None
        if len(events) > row.transaction_capacity or row.puts_paused:
            return None
        return row, events

    @staticmethod
    def _token(header: str) -> ApiToken | None:
        """The live token of an Authorization header TokenAuthentication accepts, else
        None; split as DRF splits it (bytes, ASCII whitespace only)."""
        parts = header.encode("latin-1").split()  # WSGI headers are latin-1 text
        if len(parts) != 2 or \
                parts[0].decode(errors="replace").lower() not in TokenAuthentication.keywords:
            return None
        token = row_cache.token(hash_key(parts[1].decode(errors="replace")))
        if token is not None:
            touch(token)
        return token

    @staticmethod
    def _fixed_headers(path: str) -> list[tuple[str, str]]:
        """The headers Django, DRF and the middleware put on every produce 200, but its
        Content-Length and request id."""
        from appliance.api.search import ChannelEventsView  # Django's apps are ready now
        view = ChannelEventsView()
        view.setup(HttpRequest())  # as Django's view() does: a GET view answers HEAD too
        headers = [("Content-Type", "application/json"), ("Vary", "Accept"),
                   ("Allow", ", ".join(view._allowed_methods())),
                   ("X-Frame-Options", settings.X_FRAME_OPTIONS),
                   (csp.HEADER, csp.policy_for(path))]
        if settings.SECURE_CONTENT_TYPE_NOSNIFF:
            headers.append(("X-Content-Type-Options", "nosniff"))
        if settings.SECURE_REFERRER_POLICY:
            headers.append(("Referrer-Policy", settings.SECURE_REFERRER_POLICY))
        if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
            headers.append(("Cross-Origin-Opener-Policy",
                            settings.SECURE_CROSS_ORIGIN_OPENER_POLICY))
        return headers

"""Every API error is one shape, an RFC 9457 problem (application/problem+json: type, title,
status, detail; field/index/errors, retry_after with Retry-After where they apply), made by
one exception handler (appliance/api/handler.py) from DRF's exceptions, the engine's and the
appliance's own; every API view is an ApiView, which answers a channel it cannot find with a
404 problem; Django's own 404 and 500 under /api/ are problems too, pages elsewhere."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from appliance_helpers import channel_row, problem, token_client
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from django.test import Client, RequestFactory, override_settings
from django.urls import URLPattern, get_resolver
from rest_framework import exceptions

from appliance import channels
from appliance.api.base import ApiView
from appliance.api.handler import exception_handler
from appliance.api.problems import CONTENT_TYPE, TITLES, TYPE_BASE, Problem
from appliance.event_parsing import EventError
from appliance.exports import BrokerUnavailable
from appliance.manage_channels import Refused
from appliance.models import Channel
from channel_engine import (
    BatchTooLargeError,
    ChannelClosedError,
    ChannelFullError,
    ChannelGoneError,
    ChannelLockedError,
    CorruptRecordError,
    DiskFullError,
    DiskSpaceError,
    InvalidEventError,
    LogOfflineError,
    OffsetOutOfRangeError,
    OwnerLostError,
    StorageError,
    TakeCommittedError,
    TakeExpiredError,
    TransactionCapacityError,
)

pytestmark = pytest.mark.django_db

# exception -> (status, type slug, members it must carry)
CASES: list[tuple[Exception, int, str, dict[str, object]]] = [
    (Problem(413, "body-too-large", "too big"), 413, "body-too-large", {"detail": "too big"}),
    (exceptions.ValidationError({"max_events": ["too many"], "lease_seconds": ["bad"]}), 400,
     "validation-error", {"field": "max_events",
                          "errors": {"max_events": ["too many"], "lease_seconds": ["bad"]}}),
    (exceptions.ValidationError("give offset or timestamp"), 400, "validation-error",
     {"errors": {"non_field_errors": ["give offset or timestamp"]}}),
    (exceptions.ParseError("JSON parse error"), 400, "parse-error", {}),
    (exceptions.NotAuthenticated(), 401, "not-authenticated", {}),
    (exceptions.AuthenticationFailed("unknown or revoked token"), 401,
     "authentication-failed", {"detail": "unknown or revoked token"}),
    (exceptions.PermissionDenied("no"), 403, "permission-denied", {"detail": "no"}),
    (exceptions.NotFound("no such take"), 404, "not-found", {}),
    (Http404("nothing here"), 404, "not-found", {"detail": "nothing here"}),
    (exceptions.MethodNotAllowed("PUT"), 405, "method-not-allowed", {}),
    (exceptions.NotAcceptable(), 406, "not-acceptable", {}),
    (exceptions.UnsupportedMediaType("text/plain"), 415, "unsupported-media-type", {}),
    (exceptions.Throttled(wait=2.5), 429, "throttled", {"retry_after": 3}),
    (ChannelGoneError("channel 'orders' was deleted"), 404, "channel-not-found", {}),
    (InvalidEventError(3, "key", "too long"), 400, "invalid-event",
     {"index": 3, "field": "key"}),
    (EventError(2, "timestamp", "must be an integer"), 400, "invalid-event",
     {"index": 2, "field": "timestamp"}),
    (EventError(None, "json", "not valid JSON"), 400, "invalid-event", {"field": "json"}),
    (BatchTooLargeError(5000, 4096, "segment_bytes"), 413, "batch-too-large",
     {"field": "segment_bytes"}),
    (TransactionCapacityError("orders", 200, 100), 413, "too-many-events", {}),
    (OffsetOutOfRangeError(99, 10, 20), 416, "offset-out-of-range",
     {"field": "offset", "log_start_offset": 10, "log_end_offset": 20}),
    (TakeExpiredError("its lease expired"), 409, "take-expired", {}),
    (TakeCommittedError("already committed"), 409, "take-committed", {}),
    (ChannelFullError("orders", 60, 100, 100, 0), 503, "channel-full", {"retry_after": 1}),
    (DiskSpaceError("/data", 10, 100), 503, "disk-space-low", {"retry_after": 1}),
    (DiskFullError("/data", OSError(28, "No space left on device"), "append"), 507,
     "disk-full", {"retry_after": 1}),
    (StorageError("/data", OSError(5, "I/O error"), "append"), 503, "channel-write-failed",
     {"retry_after": 1}),
    (LogOfflineError("/data", OSError(5, "I/O error")), 503, "channel-write-failed",
     {"retry_after": 1}),
    (ChannelLockedError("/home", "pid 1"), 503, "channel-owner-changing", {"retry_after": 1}),
    (ChannelClosedError("closed"), 503, "channel-owner-changing", {"retry_after": 1}),
    (OwnerLostError("the owner went away"), 503, "channel-owner-changing", {"retry_after": 1}),
    (CorruptRecordError("/data/0.log", 17, "bad CRC"), 500, "channel-damaged", {}),
    (Refused({"capacity": ["must be > 0"]}), 400, "invalid-setting",
     {"field": "capacity", "errors": {"capacity": ["must be > 0"]}}),
    (Refused({"name": ["a channel with this name exists"]}, status=409), 409,
     "channel-conflict", {"field": "name"}),
    (Refused({"error": ["holds 3 untaken events"]}, status=409), 409, "channel-conflict",
     {"detail": "holds 3 untaken events"}),
    (Refused({"error": ["cannot be opened"]}, status=503), 503, "channel-cannot-open", {}),
    (BrokerUnavailable("ConnectionError: refused"), 503, "broker-unavailable",
     {"retry_after": 1}),
]


@pytest.mark.parametrize(("exc", "status", "slug", "members"), CASES,
                         ids=[f"{type(case[0]).__name__}-{case[1]}" for case in CASES])
def test_each_error_is_a_problem_with_its_members(exc: Exception, status: int, slug: str,
                                                  members: dict[str, object]) -> None:
    response = exception_handler(exc, {"view": None})
    assert response is not None
    assert response.status_code == status and response["Content-Type"] == CONTENT_TYPE
    body = orjson.loads(response.content)
    assert body["type"] == TYPE_BASE + slug and body["title"] == TITLES[slug]
    assert body["status"] == status and isinstance(body["detail"], str) and body["detail"]
    for name, value in members.items():
        assert body[name] == value, (name, body)
    extension = set(body) - {"type", "title", "status", "detail"}
    assert extension <= {"field", "index", "errors", "retry_after", "log_start_offset",
                         "log_end_offset"}, body
    assert ("retry_after" in body) == response.has_header("Retry-After")
    if "retry_after" in body:
        assert response["Retry-After"] == str(body["retry_after"])


def test_an_exception_with_no_documented_answer_is_left_to_django() -> None:
    assert exception_handler(RuntimeError("a bug"), {"view": None}) is None


def failing_open(exc: Exception) -> Callable[..., object]:
    def open_channel(*args: object, **kwargs: object) -> object:
        raise exc
    return open_channel


def test_it_answers_404_for_a_channel_deleted_under_the_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row went while the request ran (a delete in another worker): 404. With the row
    there, the same error is a channel made again by another process: retry (503)."""
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        channel_row(tmp_path)

        def deleted_meanwhile(*args: object, **kwargs: object) -> object:
            Channel.objects.filter(name="orders").delete()
            raise ChannelGoneError("channel 'orders' was deleted")

        monkeypatch.setattr(channels, "open_channel", deleted_meanwhile)
        response = token_client("admin").get("/api/v1/channels/orders")
    assert "deleted" in problem(response, 404, "channel-not-found")["detail"]


@pytest.mark.parametrize("error", [FileNotFoundError(2, "No such file or directory"),
                                   StorageError(Path("/gone"), OSError(2, "gone"), "writing")])
def test_an_error_of_a_channel_deleted_during_the_request_is_a_404(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """The row is gone by the time the error is answered (another worker's delete renamed
    its files away mid-request): 404 like any channel that is not there, never a 500."""
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        row = channel_row(tmp_path)

        def deleted_then_failing(*_: object, **__: object) -> Any:
            Channel.objects.filter(pk=row.pk).delete()
            raise error
        monkeypatch.setattr(channels, "open_channel", deleted_then_failing)
        response = token_client("produce").post(
            "/api/v1/channels/orders/events", {"events": [{"body": "x"}]}, format="json")
    problem(response, 404, "channel-not-found")


def test_it_answers_503_with_retry_after_when_no_owner_can_be_reached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        channel_row(tmp_path)
        monkeypatch.setattr(channels, "open_channel", failing_open(ChannelLockedError(
            tmp_path / "orders", "pid 1, which does not answer on owner.sock after 30000 ms")))
        response = token_client("admin").get("/api/v1/channels/orders")
    body = problem(response, 503, "channel-owner-changing", retry_after=1)
    assert "try again" in body["detail"]


def test_it_answers_503_when_the_handle_was_closed_under_the_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        channel_row(tmp_path)
        monkeypatch.setattr(channels, "open_channel", failing_open(
            ChannelClosedError("channel 'orders' is closed")))
        response = token_client("admin").get("/api/v1/channels/orders")
    problem(response, 503, "channel-owner-changing", retry_after=1)


def test_drf_refusals_over_http_are_problems(tmp_path: Path) -> None:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        channel_row(tmp_path)
        client = token_client("admin")
        url = "/api/v1/channels/orders/takes"
        refused = client.put(url, {"max_events": 1}, format="json")
        problem(refused, 405, "method-not-allowed")
        assert "POST" in refused["Allow"]
        problem(client.post(url, "max_events=1", content_type="text/plain"), 415,
                "unsupported-media-type")
        problem(client.post(url, "{not json", content_type="application/json"), 400,
                "parse-error")
        bad = problem(client.post(url, {"max_events": 0}, format="json"), 400,
                      "validation-error", field="max_events")
        assert list(bad["errors"]) == ["max_events"]
        anonymous = Client().get("/api/v1/channels")
        problem(anonymous, 401, "not-authenticated")
        assert anonymous["WWW-Authenticate"] == 'Bearer realm="weir"'
    channels.close_all()


def test_a_path_no_route_matches_is_a_problem_under_api_and_a_page_elsewhere() -> None:
    client = token_client("admin")
    problem(client.get("/api/v1/channels/orders/partitions/x/events"), 404, "not-found")
    problem(client.get("/api/v2/anything"), 404, "not-found")
    page = client.get("/no-such-page")
    assert page.status_code == 404 and "problem" not in page["Content-Type"]
    health = Client().get("/health")
    assert health.status_code == 200 and health["Content-Type"] == "application/json"


def test_a_request_django_refuses_before_any_view_is_a_problem_under_api() -> None:
    """A Host not in ALLOWED_HOSTS (handler400) and Django's own PermissionDenied
    (handler403): problems under /api/, Django's pages elsewhere."""
    client = Client(HTTP_HOST="evil.example")
    problem(client.get("/api/v1/channels"), 400, "bad-request")
    page = client.get("/no-such-page")
    assert page.status_code == 400 and "problem" not in page["Content-Type"]
    from appliance import request_id
    request = RequestFactory().get("/api/v1/channels")
    denied = request_id.permission_denied(request, DjangoPermissionDenied("no"))
    assert denied.status_code == 403 and denied["Content-Type"] == CONTENT_TYPE
    assert orjson.loads(denied.content) == {
        "type": f"{TYPE_BASE}permission-denied", "title": TITLES["permission-denied"],
        "status": 403, "detail": "no"}
    page = request_id.permission_denied(RequestFactory().get("/admin/"),
                                        DjangoPermissionDenied())
    assert page.status_code == 403 and "problem" not in page["Content-Type"]


def _api_routes() -> list[tuple[str, Any]]:
    """(route, view class) of every DRF endpoint: /api/v1/... and /metrics."""
    routes = []
    for pattern in get_resolver().url_patterns:
        if isinstance(pattern, URLPattern) and hasattr(pattern.callback, "view_class"):
            route = str(pattern.pattern)
            if route.startswith("api/v1/") or route == "metrics":
                routes.append((route, pattern.callback.view_class))
    return routes


def test_every_api_view_is_an_api_view() -> None:
    routes = _api_routes()
    assert len(routes) == 17, routes
    for route, view in routes:
        assert issubclass(view, ApiView), route
        assert view.role in ("produce", "consume", "admin"), route


def test_every_route_naming_a_channel_answers_404_problem_for_an_unknown_one() -> None:
    client = token_client("admin")
    named = [route for route, _ in _api_routes() if "<str:name>" in route]
    assert len(named) == 14, named
    for route, view in _api_routes():
        if "<str:name>" not in route:
            continue
        url = "/" + (route.replace("<str:name>", "nope").replace("<int:partition>", "0")
                     .replace("<str:take_id>", "1.0123456789abcdef0123")
                     .replace("<str:sub>", "default"))
        for method in (m for m in ("get", "post", "patch", "delete") if hasattr(view, m)):
            response = getattr(client, method)(url, {}, format="json")
            body = problem(response, 404, "channel-not-found")
            assert "'nope'" in body["detail"], (method, url, body)

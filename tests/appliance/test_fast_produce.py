"""The produce fast path (appliance/fast_produce.py) answers as Django would, or lets Django
answer: every request is sent to the WSGI application gunicorn serves (appliance.wsgi)
and to Django's alone, and the two answers are compared — status, headers (but Date and
a fresh request id) and body (but the offsets two puts get). Each case also says who
answered: a 200 must come from the fast path (else it is no faster), every refusal from
Django (its one implementation), the put's own failures through Django once, without a
second put."""
from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest
from appliance_helpers import channel_row
from asgiref.local import Local
from django import db
from django.core import signals
from django.core.cache import cache
from django.db.utils import OperationalError

from appliance import channels, fast_produce, producing, shared_redis, throttling
from appliance.models import ApiToken, Channel
from appliance.throttling import TokenRateThrottle
from appliance.wsgi import django_application
from channel_engine import ChannelFullError

pytestmark = pytest.mark.django_db(transaction=True)
URL = "/api/v1/channels/orders/events"
EVENT = json.dumps({"events": [{"body": "hello", "key": "k", "headers": {"h": "v"}}]}).encode()


class Answer:
    """A WSGI answer: status line, headers and body."""

    def __init__(self, app: Callable[..., Iterable[bytes]], environ: dict[str, Any]) -> None:
        seen: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
            seen.update(status=status, headers=headers)
        chunks = app(environ, start_response)
        self.body = b"".join(chunks)
        getattr(chunks, "close", lambda: None)()  # Django sends request_finished here
        self.status = int(seen["status"].split()[0])
        self.headers = {name.lower(): value for name, value in seen["headers"]}

    def comparable(self) -> tuple[int, dict[str, str], Any]:
        """What must be equal between the two paths."""
        headers = {k: v for k, v in self.headers.items() if k not in ("date", "x-request-id")}
        body: Any = self.body
        if self.headers.get("content-type", "").endswith("json"):
            body = json.loads(self.body)
            if isinstance(body, dict):
                body.pop("request_id", None)
                for committed in body.get("committed", ()):
                    committed.pop("first_offset"), committed.pop("last_offset")
                    committed.pop("partition")
        if self.status == 200:
            headers.pop("content-length")  # offsets of other lengths
        return self.status, headers, body


def environ(body: bytes = EVENT, key: str | None = None, method: str = "POST",
            path: str = URL, content_type: str = "application/json",
            **headers: str) -> dict[str, Any]:
    """A WSGI environ as gunicorn makes one."""
    env: dict[str, Any] = {}
    setup_testing_defaults(env)
    env.update(REQUEST_METHOD=method, PATH_INFO=path, CONTENT_TYPE=content_type,
               CONTENT_LENGTH=str(len(body)), HTTP_HOST="127.0.0.1:8000",
               SERVER_PORT="8000", **{"wsgi.input": io.BytesIO(body)})
    if key is not None:
        env["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    env.update({f"HTTP_{name.upper()}": value for name, value in headers.items()})
    return env


@pytest.fixture
def orders(root: Path) -> Channel:
    return channel_row(root, partitions=2, transaction_capacity=3)


@pytest.fixture
def handed() -> list[str]:
    """The paths of the requests the fast path handed to Django."""
    return []


@pytest.fixture
def fast(handed: list[str]) -> fast_produce.FastProduce:
    def django(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        handed.append(env["PATH_INFO"])
        return django_application(env, start_response)
    return fast_produce.FastProduce(django)


def both(fast: fast_produce.FastProduce, make: Callable[[], dict[str, Any]]
         ) -> tuple[Answer, Answer]:
    """The answer of the served application, then Django's, to the same request."""
    served = Answer(fast, make())
    return served, Answer(django_application, make())


def test_a_good_request_is_served_by_the_fast_path_as_django_serves_it(
        orders: Channel, fast: fast_produce.FastProduce, handed: list[str]) -> None:
    _, key = ApiToken.issue("p", ["produce"], [orders])
    for body, content_type in [
            (EVENT, "application/json"),
            (b'[{"body": "flume", "headers": {"timestamp": "1700000000000"}}]',
             "application/json; charset=UTF-8"),
            (b'{"body": "a"}\n{"body_base64": "AAE="}\n', "application/x-ndjson")]:
        served, plain = both(fast, lambda b=body, t=content_type: environ(  # type: ignore[misc]
            b, key, content_type=t, accept="*/*"))
        assert served.status == 200, served.body
        assert served.comparable() == plain.comparable()
        assert served.headers["x-request-id"]
    assert handed == [], "a good request never reaches Django"
    assert channels.open_channel(orders).status()["events_queued"] == 2 * (1 + 1 + 2)


def test_the_request_id_a_client_sends_is_kept(
        orders: Channel, fast: fast_produce.FastProduce) -> None:
    _, key = ApiToken.issue("p", ["produce"], [orders])
    served = Answer(fast, environ(key=key, x_request_id="lb-1234"))
    assert (served.status, served.headers["x-request-id"]) == (200, "lb-1234")


@pytest.mark.parametrize("case", [
    "bad-json", "no-token", "unknown-token", "consume-token", "other-channel", "no-channel",
    "too-many-events", "body-too-large", "paused", "html", "bad-host", "chunked",
    "bad-length", "revoked", "query-string", "cookie", "accept-parameter", "empty-host",
    "nbsp-in-authorization", "short-body"])
def test_every_refusal_is_django_s_answer(
        case: str, orders: Channel, root: Path, fast: fast_produce.FastProduce,
        handed: list[str], settings: Any) -> None:
    row, key = ApiToken.issue("p", ["produce"], [orders])
    make: Callable[[], dict[str, Any]] = lambda: environ(key=key)  # noqa: E731
    if case == "bad-json":
        make = lambda: environ(b"{nope", key)  # noqa: E731
    elif case == "no-token":
        make = lambda: environ()  # noqa: E731
    elif case == "unknown-token":
        make = lambda: environ(key="weir_0000_nope")  # noqa: E731
    elif case == "consume-token":
        key = ApiToken.issue("c", ["consume"], [orders])[1]
    elif case == "other-channel":
        key = ApiToken.issue("o", ["produce"], [channel_row(root, "other")])[1]
    elif case == "no-channel":
        make = lambda: environ(key=key, path="/api/v1/channels/nope/events")  # noqa: E731
    elif case == "too-many-events":
        make = lambda: environ(b'[{"body":"1"},{"body":"2"},{"body":"3"},{"body":"4"}]',  # noqa: E731
                               key)
    elif case == "body-too-large":
        settings.WEIR_MAX_PRODUCE_BYTES = 10
    elif case == "paused":
        Channel.objects.filter(pk=orders.pk).update(puts_paused=True)
        from appliance import row_cache
        row_cache.changed()  # as the pause action's save announces it
    elif case == "html":
        make = lambda: environ(key=key, accept="text/html")  # noqa: E731
    elif case == "bad-host":
        make = lambda: {**environ(key=key), "HTTP_HOST": "evil.example"}  # noqa: E731
    elif case == "chunked":
        make = lambda: {**environ(key=key), "HTTP_TRANSFER_ENCODING": "chunked",  # noqa: E731
                        "CONTENT_LENGTH": ""}
    elif case == "bad-length":
        make = lambda: {**environ(key=key), "CONTENT_LENGTH": "12x"}  # noqa: E731
    elif case == "revoked":
        row.revoke()
    elif case == "query-string":
        make = lambda: {**environ(key=key), "QUERY_STRING": "format=api"}  # noqa: E731
    elif case == "cookie":
        make = lambda: {**environ(key=key), "HTTP_COOKIE": "csrftoken=bad"}  # noqa: E731
    elif case == "accept-parameter":
        make = lambda: environ(key=key, accept="application/json; indent=4")  # noqa: E731
    elif case == "empty-host":
        make = lambda: {**environ(key=key), "HTTP_HOST": ""}  # noqa: E731
    elif case == "nbsp-in-authorization":
        make = lambda: {**environ(), "HTTP_AUTHORIZATION": f"Bearer\xa0{key}"}  # noqa: E731
    elif case == "short-body":  # the client went away mid-body
        make = lambda: {**environ(key=key), "CONTENT_LENGTH": str(len(EVENT) + 10)}  # noqa: E731
    served, plain = both(fast, make)
    assert handed == [make()["PATH_INFO"]], "answered by Django"
    if case in ("html", "chunked", "query-string", "cookie", "accept-parameter"):
        # Django serves these: the browsable API, a chunked body, a cookie, indented JSON
        assert served.status == plain.status == 200
        assert served.headers["content-type"] == plain.headers["content-type"]
        return
    assert served.status >= 400, served.body
    assert served.comparable() == plain.comparable()


def test_a_token_over_its_rate_is_refused_by_django_counted_once(
        orders: Channel, fast: fast_produce.FastProduce, handed: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TokenRateThrottle, "THROTTLE_RATES", {"token": "2/minute"})
    monkeypatch.setattr(TokenRateThrottle, "timer", lambda self: 1_795_000_090.0)
    monkeypatch.setattr(throttling, "fast", lambda op: op(shared_redis.shared_redis()))
    cache.clear()
    _, key = ApiToken.issue("p", ["produce"], [orders])
    answers = [Answer(fast, environ(key=key)) for _ in range(3)]
    assert [a.status for a in answers] == [200, 200, 429]
    assert int(answers[2].headers["retry-after"]) > 0
    assert len(handed) == 1
    cache.clear()


def test_a_failed_put_is_answered_by_django_without_a_second_put(
        orders: Channel, fast: fast_produce.FastProduce, handed: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, key = ApiToken.issue("p", ["produce"], [orders])
    puts: list[int] = []

    def full(row: Channel, events: list[Any]) -> Any:
        puts.append(len(events))
        raise ChannelFullError("orders", len(events), 10, 10, 0)
    monkeypatch.setattr(producing, "put_events", full)
    monkeypatch.setattr(fast_produce, "put_events", full)
    monkeypatch.setattr("appliance.api.produce.put_events", full)
    served = Answer(fast, environ(key=key))
    assert served.status == 503, served.body
    assert json.loads(served.body)["type"].endswith("/channel-full")
    assert puts == [1] and handed == [URL]


def test_a_bug_in_the_put_is_a_logged_500_naming_the_request(
        orders: Channel, fast: fast_produce.FastProduce,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _, key = ApiToken.issue("p", ["produce"], [orders])

    def broken(row: Channel, events: list[Any]) -> Any:
        raise AttributeError("a bug")
    monkeypatch.setattr(fast_produce, "put_events", broken)
    served = Answer(fast, environ(key=key, x_request_id="rid-42"))
    assert served.status == 500
    assert json.loads(served.body)["request_id"] == "rid-42"
    assert any("a bug" in (r.exc_text or "") or r.exc_info and "a bug" in str(r.exc_info[1])
               for r in caplog.records)


def test_the_fast_path_does_what_every_receiver_of_django_s_request_signals_does() -> None:
    for name, signal in (("started", signals.request_started),
                         ("finished", signals.request_finished)):
        receivers = {ref().__name__ for _, ref, *_ in signal.receivers if ref() is not None}
        assert receivers == fast_produce.RECEIVERS[name], (
            f"a receiver of request_{name} changed: make fast_produce.request_boundary do "
            "what it does, then update RECEIVERS")


def test_a_lease_of_the_rate_is_spent_on_the_fast_path_and_django_refuses_beyond_it(
        orders: Channel, fast: fast_produce.FastProduce, handed: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TokenRateThrottle, "THROTTLE_RATES", {"token": "8/minute"})
    monkeypatch.setattr(TokenRateThrottle, "timer", lambda self: 1_795_000_210.0)
    monkeypatch.setattr(throttling, "LEASE_SHARE", 2)  # leases of 4: two trips to Redis
    monkeypatch.setattr(throttling, "fast", lambda op: op(shared_redis.shared_redis()))
    monkeypatch.setattr(throttling, "_leases", {})
    cache.clear()
    _, key = ApiToken.issue("p", ["produce"], [orders])
    answers = [Answer(fast, environ(key=key)).status for _ in range(10)]
    assert answers == [200] * 8 + [429] * 2
    assert len(handed) == 2
    cache.clear()


def test_a_failure_before_the_put_is_django_s_500_naming_the_request(
        orders: Channel, fast: fast_produce.FastProduce, handed: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, key = ApiToken.issue("p", ["produce"], [orders])

    def locked(token: ApiToken) -> None:
        raise OperationalError("database is locked")
    monkeypatch.setattr(fast_produce, "touch", locked)
    monkeypatch.setattr("appliance.auth.touch", locked)
    served = Answer(fast, environ(key=key, x_request_id="rid-7"))
    assert served.status == 500 and handed == [URL]
    assert served.headers["content-type"] == "application/problem+json"
    assert json.loads(served.body)["request_id"] == served.headers["x-request-id"] == "rid-7"
    assert channels.open_channel(orders).status()["events_queued"] == 0



def test_the_boundary_cleans_up_this_thread_s_open_connection_and_follows_a_new_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """request_boundary finds the thread's connection once; it still sees the connection
    open now, and a new one should Django's handler get new storage."""
    cleaned: list[str] = []
    monkeypatch.setattr(db, "reset_queries", lambda: cleaned.append("reset_queries"))
    monkeypatch.setattr(db, "close_old_connections", lambda: cleaned.append("close_old"))
    db.connection.close()
    fast_produce.request_boundary(lambda: None)
    assert cleaned == []
    db.connection.ensure_connection()
    fast_produce.request_boundary(lambda: None)
    assert cleaned == ["reset_queries", "close_old"]
    monkeypatch.setattr(db.connections, "_connections", Local())  # a fresh, closed wrapper
    fast_produce.request_boundary(lambda: None)
    assert cleaned == ["reset_queries", "close_old"]

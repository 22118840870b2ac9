"""Chunked request bodies (Transfer-Encoding: chunked, no Content-Length) against a real
gunicorn: read whole, as if their length had been sent; over the limit 413."""
from __future__ import annotations

import http.client
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings
from test_gunicorn import gunicorn, manage

from appliance.chunked import ChunkedBodyMiddleware

pytestmark = pytest.mark.own_sqlite  # its appliance runs on a SQLite database of its own

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[int, str]]:
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "WEIR_DATA_ROOT": str(tmp_path / "channels")}
    env.pop("DATABASE_URL", None)
    manage(env, "migrate", "--noinput")
    manage(env, "create_channel", "orders", "--set", "minimum_required_space=0")
    key = manage(env, "create_token", "ops", "--role", "admin").strip().splitlines()[-1]
    with gunicorn(env, workers=1) as url:
        yield int(url.rsplit(":", 1)[1]), key


def chunked(port: int, key: str, method: str, path: str, pieces: list[bytes]
            ) -> tuple[int, dict[str, object]]:
    """Send `pieces` as the chunks of a body without Content-Length; status and JSON."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=iter(pieces), encode_chunked=True, headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json",
            "Transfer-Encoding": "chunked"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_it_reads_chunked_bodies_whole_under_gunicorn(server: tuple[int, str]) -> None:
    port, key = server
    body = json.dumps({"events": [{"body": f"e{i}"} for i in range(3)]}).encode()
    status, result = chunked(port, key, "POST", "/api/v1/channels/orders/events",
                             [body[:7], body[7:20], body[20:]])
    assert (status, result["events"]) == (200, 3), result
    status, result = chunked(port, key, "PATCH", "/api/v1/channels/orders",
                             [b'{"capacity": ', b"50000}"])
    assert status == 200 and result["status"]["capacity"] == 50000, result  # type: ignore[index]


def _echo(request: HttpRequest) -> HttpResponse:
    return HttpResponse(request.body)


def test_it_answers_413_for_a_chunked_body_over_the_limit_without_reading_it_all() -> None:
    def request(body: bytes) -> HttpRequest:
        made = RequestFactory().post("/api/v1/channels/orders/events", content_type="x/y")
        made.META.pop("CONTENT_LENGTH")
        made.META.update({"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input": io.BytesIO(body)})
        return made

    middleware = ChunkedBodyMiddleware(_echo)
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10):
        assert middleware(request(b"0123456789")).content == b"0123456789"
        refused = middleware(request(b"0123456789!" + b"x" * 100))
    assert refused.status_code == 413 and refused["Content-Type"] == "application/problem+json"
    body = json.loads(refused.content)
    assert body["type"] == "https://weir.dev/problems/body-too-large" and body["status"] == 413
    assert "over 10 bytes" in body["detail"]

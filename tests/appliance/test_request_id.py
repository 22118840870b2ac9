"""Request ids and server errors (appliance/request_id.py): every answer names its request's
id, every log line of the request carries it, and every 500 (an API view, a UI view, a
middleware) is logged with its traceback and answered naming the id, as JSON under /api/.
The views that fail are this module's URLs (ROOT_URLCONF); the last test runs a real
gunicorn on test settings and reads the traceback in its stderr."""
from __future__ import annotations

import io
import json
import logging
import logging.config
import os
import re
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import problem
from django.conf import settings as django_settings
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from test_gunicorn import ROOT, free_port, manage, wait_for_health

from appliance.api.problems import retry_later
from appliance.request_id import request_id_of
from appliance.urls import handler500  # noqa: F401
from appliance.urls import urlpatterns as appliance_urls

log = logging.getLogger("appliance.test_request_id")


class Failing(Exception):
    """What the failing views raise."""


class ApiBoom(APIView):
    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []

    def get(self, request: Request) -> Response:
        log.info("api view about to fail")
        raise Failing("api-view-marker")


class ApiBusy(APIView):
    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []

    def get(self, request: Request) -> Response:
        raise retry_later(503, "puts-paused", "puts are paused")


def ui_boom(request: HttpRequest) -> HttpResponse:
    raise Failing("ui-view-marker")


def logs_a_line(request: HttpRequest) -> HttpResponse:
    log.info("a line of this request")
    return HttpResponse("ok")


urlpatterns = [
    path("api/v1/boom", ApiBoom.as_view()),
    path("api/v1/busy", ApiBusy.as_view()),
    path("boom", ui_boom),
    path("logs", logs_a_line),
    *appliance_urls,
]


@pytest.fixture()
def urls(settings: Any) -> None:
    settings.ROOT_URLCONF = __name__


@pytest.fixture()
def log_output() -> Iterator[io.StringIO]:
    """What LOGGING's stderr handler writes during the test (its format and filter)."""
    handlers = [h for h in logging.getLogger().handlers if h.name == "stderr"]
    if not handlers:  # a Celery worker of an earlier test module took over the root logger
        logging.config.dictConfig(django_settings.LOGGING)  # as django.setup() does
        handlers = [h for h in logging.getLogger().handlers if h.name == "stderr"]
    handler = handlers[0]
    out = io.StringIO()
    old = handler.setStream(out)
    yield out
    handler.setStream(old)  # type: ignore[arg-type]


@pytest.fixture()
def browser() -> Client:
    return Client(raise_request_exception=False)  # answer 500s as in production


def lines_of(output: io.StringIO, rid: str) -> list[str]:
    return [line for line in output.getvalue().splitlines() if f"[request {rid}]" in line]


def test_it_answers_an_api_500_as_a_problem_naming_the_request_id(
        urls: None, browser: Client, log_output: io.StringIO) -> None:
    response = browser.get("/api/v1/boom")
    rid = response["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid)
    assert rid in problem(response, 500, "internal-error", request_id=rid)["detail"]
    text = log_output.getvalue()
    assert f"ERROR django.request [request {rid}] Internal Server Error: /api/v1/boom" in text
    assert "Traceback (most recent call last)" in text
    assert "Failing: api-view-marker" in text
    assert lines_of(log_output, rid)[0].endswith("api view about to fail")


def test_it_answers_a_ui_500_with_a_page_naming_the_request_id(
        urls: None, browser: Client, log_output: io.StringIO) -> None:
    response = browser.get("/boom", HTTP_X_REQUEST_ID="ui-req-42")
    assert response.status_code == 500
    assert response["Content-Type"].startswith("text/html")
    assert response["X-Request-ID"] == "ui-req-42"
    assert b'<code id="request-id">ui-req-42</code>' in response.content
    assert "Content-Security-Policy" in response
    text = log_output.getvalue()
    assert "ERROR django.request [request ui-req-42] Internal Server Error: /boom" in text
    assert "Failing: ui-view-marker" in text and "Traceback" in text


def test_it_logs_and_answers_a_500_raised_in_a_middleware(
        urls: None, browser: Client, log_output: io.StringIO,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Any, request: HttpRequest) -> None:
        raise Failing("middleware-marker")
    monkeypatch.setattr("django.contrib.sessions.middleware.SessionMiddleware.process_request",
                        broken)
    response = browser.get("/api/v1/channels")
    rid = response["X-Request-ID"]
    problem(response, 500, "internal-error", request_id=rid)
    assert "Failing: middleware-marker" in log_output.getvalue()
    assert lines_of(log_output, rid)


def test_it_adds_the_request_id_to_a_5xx_problem(urls: None, browser: Client) -> None:
    response = browser.get("/api/v1/busy", HTTP_X_REQUEST_ID="busy-1")
    problem(response, 503, "puts-paused", detail="puts are paused", retry_after=1,
            request_id="busy-1")
    assert int(response["Content-Length"]) == len(response.content)


def test_it_names_the_request_id_on_every_answer_and_log_line(
        urls: None, browser: Client, log_output: io.StringIO) -> None:
    for where in ("/health", "/login/", "/api/v1/channels", "/no-such-page", "/logs"):
        assert browser.get(where)["X-Request-ID"], where
    response = browser.get("/logs", HTTP_X_REQUEST_ID="lines-7")
    assert response["X-Request-ID"] == "lines-7"
    assert lines_of(log_output, "lines-7")[0].endswith("a line of this request")
    log.info("outside any request")
    assert log_output.getvalue().splitlines()[-1].endswith(
        "[request -] outside any request")


@pytest.mark.parametrize("incoming", ["", "a" * 129, "abc def", "abc\nINFO forged line",
                                      "<script>", "ünïcode"])
def test_it_replaces_an_incoming_request_id_that_is_not_well_formed(incoming: str) -> None:
    assert re.fullmatch(r"[0-9a-f]{32}", request_id_of(incoming))


def test_a_made_request_id_is_a_version_4_uuid_never_repeated() -> None:
    made = [request_id_of(None) for _ in range(2000)]
    assert len(set(made)) == len(made)
    for rid in made[:50]:
        as_uuid = uuid.UUID(rid)
        assert (as_uuid.hex, as_uuid.version, as_uuid.variant) == (rid, 4, uuid.RFC_4122)


def test_a_forked_worker_makes_other_request_ids_than_its_parent() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, as a gunicorn worker forked from the arbiter
        os.write(write, " ".join(request_id_of(None) for _ in range(20)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as pipe:
        child = set(pipe.read().decode().split())
    assert len(child) == 20
    assert not child & {request_id_of(None) for _ in range(20)}


@pytest.mark.parametrize("incoming", ["a", "0f8e2c1d9b", "Root:1-5e-ab_c.d", "x" * 128])
def test_it_keeps_a_well_formed_incoming_request_id(incoming: str) -> None:
    assert request_id_of(incoming) == incoming


RAISING_SETTINGS = """
    from appliance.settings import *  # noqa: F403
    ROOT_URLCONF = "weir_raising_urls"
"""
RAISING_URLS = """
    from django.urls import path
    from rest_framework.permissions import AllowAny
    from rest_framework.views import APIView
    from appliance.urls import handler500, urlpatterns as base  # noqa: F401

    class Boom(APIView):
        permission_classes = [AllowAny]
        authentication_classes = []

        def get(self, request):
            raise RuntimeError("gunicorn-marker")

    urlpatterns = [path("api/v1/boom", Boom.as_view()), *base]
"""


@pytest.mark.own_sqlite  # its gunicorn runs on a SQLite database of its own
def test_it_logs_a_500_with_its_traceback_to_gunicorns_stderr(tmp_path: Path) -> None:
    (tmp_path / "weir_raising_settings.py").write_text(textwrap.dedent(RAISING_SETTINGS))
    (tmp_path / "weir_raising_urls.py").write_text(textwrap.dedent(RAISING_URLS))
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "WEIR_DATA_ROOT": str(tmp_path / "channels"),
           "DJANGO_SETTINGS_MODULE": "weir_raising_settings",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    env.pop("DATABASE_URL", None)
    manage(env, "migrate", "--noinput")
    port, stderr = free_port(), tmp_path / "gunicorn.log"
    with stderr.open("wb") as sink:  # as scripts/supervisor.py runs it
        gunicorn = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "appliance.wsgi", "--bind",
             f"127.0.0.1:{port}", "--workers", "1", "--threads", "2",
             "--no-control-socket"], cwd=ROOT, env=env, stdout=sink, stderr=sink,
            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_health(url)
        request = urllib.request.Request(f"{url}/api/v1/boom",
                                         headers={"X-Request-ID": "from-the-client-1"})
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(request, timeout=30)
        assert failed.value.code == 500
        assert failed.value.headers["X-Request-ID"] == "from-the-client-1"
        assert failed.value.headers["Content-Type"] == "application/problem+json"
        body = json.loads(failed.value.read())
        assert body["type"] == "https://weir.dev/problems/internal-error"
        assert (body["status"], body["request_id"]) == (500, "from-the-client-1")
    finally:
        os.killpg(gunicorn.pid, signal.SIGTERM)
        gunicorn.wait(timeout=30)
    text = stderr.read_text()
    assert ("ERROR django.request [request from-the-client-1] Internal Server Error: "
            "/api/v1/boom") in text
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: gunicorn-marker" in text

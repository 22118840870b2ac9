"""Redis paused (SIGSTOP: it accepts connections and never answers) or stopped, under a
real multi-worker gunicorn using a private redis-server: produce, take and commit answer
within a bound and correctly (throttling fails open, tokens and channels come from the
database), a token revoked meanwhile is refused at once in every worker and stays refused
once Redis is back, and "Export now" (API and UI) answers at once that the broker is
unreachable; after SIGCONT (or a restart) everything works again."""
from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from polling import wait_for
from test_channels_recreate import call
from test_gunicorn import ROOT, free_port, gunicorn, manage

pytestmark = pytest.mark.own_sqlite  # its appliance runs on a SQLite database of its own

FAST_S = 0.5  # produce, take, commit: one request's bound with Redis away
EXPORT_S = 1.0  # "export now": answered at once
ROUNDS = 8  # requests per check, a new connection each: they spread over the workers
timings: dict[str, list[float]] = {}


class Redis:
    """A private redis-server that a test may pause, resume, stop and start again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.answers, 10, "redis-server answers")

    def answers(self) -> bool:
        done = subprocess.run(["redis-cli", "-p", str(self.port), "ping"],
                              capture_output=True, text=True, timeout=5)
        return done.stdout.strip() == "PONG"

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()
            self.process = None


@pytest.fixture()
def redis_server() -> Iterator[Redis]:
    server = Redis(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def appliance(tmp_path: Path, redis_server: Redis):  # type: ignore[no-untyped-def]
    """gunicorn (2 workers) on the private Redis, channel orders, tokens, a staff user."""
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "WEIR_DATA_ROOT": str(tmp_path / "channels"),
           "REDIS_URL": f"redis://127.0.0.1:{redis_server.port}/0",
           "WEIR_ADMIN_PASSWORD": "outage-test-password", "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    manage(env, "migrate", "--noinput")
    manage(env, "ensure_admin")
    manage(env, "create_channel", "orders", "--set", "minimum_required_space=0")
    admin = manage(env, "create_token", "ops", "--role", "admin").strip().splitlines()[-1]
    keys = [manage(env, "create_token", f"app{i}", "--role", "produce", "--role", "consume"
                   ).strip().splitlines()[-1] for i in range(2)]
    with gunicorn(env, workers=2) as url:
        yield {"url": url, "admin": admin, "key": keys[0], "revoked": keys[1], "env": env}


def timed(what: str, url: str, key: str, method: str, path: str,
          body: object = None) -> tuple[int, dict[str, object]]:
    started = time.monotonic()
    status, answer = call(url, key, method, path, body, timeout=60)
    timings.setdefault(what, []).append(time.monotonic() - started)
    return status, answer


def produce_take_commit(appliance: dict[str, str]) -> None:
    """Every request answers correctly, each within FAST_S."""
    url, key = appliance["url"], appliance["key"]
    for _ in range(ROUNDS):
        status, body = timed("produce", url, key, "POST", "channels/orders/events",
                             {"events": [{"body": "x"}]})
        assert status == 200, body
        status, body = timed("take", url, key, "POST", "channels/orders/takes",
                             {"max_events": 1})
        assert status == 200 and body["events"], body
        status, body = timed("commit", url, key, "POST",
                             f"channels/orders/takes/{body['take_id']}/commit")
        assert status == 200, body
    for what in ("produce", "take", "commit"):
        assert max(timings[what][-ROUNDS:]) < FAST_S, (what, timings[what][-ROUNDS:])


def ui_session(url: str) -> urllib.request.OpenerDirector:
    """A logged-in operator's browser (cookies, CSRF)."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{url}/login/", timeout=30).read()
    csrf = next(c.value for c in jar if c.name == "csrftoken")
    form = urllib.parse.urlencode({"username": "admin", "password": "outage-test-password",
                                   "csrfmiddlewaretoken": csrf}).encode()
    opener.open(urllib.request.Request(f"{url}/login/", data=form,
                                       headers={"Referer": f"{url}/login/"}), timeout=30)
    return opener


def ui_export_now(url: str, browser: urllib.request.OpenerDirector) -> str:
    """Press "Export now"; the message the channel page shows after it."""
    jar = next(h for h in browser.handlers if isinstance(h, urllib.request.HTTPCookieProcessor))
    csrf = next(c.value for c in jar.cookiejar if c.name == "csrftoken")
    started = time.monotonic()
    with browser.open(urllib.request.Request(
            f"{url}/channels/orders/export",
            data=urllib.parse.urlencode({"csrfmiddlewaretoken": csrf}).encode(),
            headers={"Referer": f"{url}/channels/orders/"}), timeout=60) as response:
        page = response.read().decode()
        assert response.status == 200
    timings.setdefault("ui export now", []).append(time.monotonic() - started)
    found = re.findall(r"(Export (?:not )?queued[^<]*)", page)
    assert found, page[:2000]
    return found[0]


def api_export_now(appliance: dict[str, str]) -> tuple[int, dict[str, object]]:
    return timed("api export now", appliance["url"], appliance["admin"], "POST",
                 "channels/orders/exports")


def check_broker_refused(appliance: dict[str, str], browser: urllib.request.OpenerDirector,
                         reason: str) -> None:
    status, body = api_export_now(appliance)
    assert status == 503, body
    assert body["type"] == "https://weir.dev/problems/broker-unavailable", body
    assert (body["status"], body["retry_after"]) == (503, 1), body
    assert str(body["detail"]).startswith("export not queued: the broker is unreachable (")
    assert reason in str(body["detail"]), body
    assert timings["api export now"][-1] < EXPORT_S, timings["api export now"]
    message = ui_export_now(appliance["url"], browser)
    assert message.startswith("Export not queued: the broker is unreachable"), message
    assert timings["ui export now"][-1] < EXPORT_S, timings["ui export now"]


def check_recovered(appliance: dict[str, str], browser: urllib.request.OpenerDirector) -> None:
    def exports_again() -> bool:
        return api_export_now(appliance)[0] == 202
    wait_for(exports_again, 10, "export now is queued again")
    assert ui_export_now(appliance["url"], browser).startswith("Export queued")
    produce_take_commit(appliance)
    assert [call(appliance["url"], appliance["revoked"], "POST", "channels/orders/events",
                 {"events": [{"body": "x"}]})[0] for _ in range(ROUNDS)] == [401] * ROUNDS


def revoke_during_outage(appliance: dict[str, str]) -> None:
    """Revoke a token cached by the workers: refused from the next request, in every one."""
    url, key = appliance["url"], appliance["revoked"]
    manage(appliance["env"], "revoke_token", key.split("_")[1])
    assert [call(url, key, "POST", "channels/orders/events",
                 {"events": [{"body": "x"}]})[0] for _ in range(ROUNDS)] == [401] * ROUNDS


def warm(appliance: dict[str, str]) -> None:
    """Every worker caches both tokens and the channel row (Redis answering)."""
    for key in (appliance["key"], appliance["revoked"]):
        for _ in range(ROUNDS):
            assert call(appliance["url"], key, "POST", "channels/orders/events",
                        {"events": [{"body": "warm"}]})[0] == 200


@pytest.mark.parametrize("outage", ["paused", "stopped"])
def test_it_answers_at_once_and_correctly_while_redis_is_away_and_recovers_after(
        appliance, redis_server: Redis, outage: str) -> None:  # type: ignore[no-untyped-def]
    browser = ui_session(appliance["url"])
    warm(appliance)
    if outage == "paused":
        redis_server.pause()
    else:
        redis_server.stop()
    try:
        time.sleep(1.0)  # the workers' channel watchers notice the outage
        produce_take_commit(appliance)
        revoke_during_outage(appliance)
        check_broker_refused(appliance, browser,
                             "Timeout" if outage == "paused" else "Connection refused")
        produce_take_commit(appliance)
    finally:
        if outage == "paused":
            redis_server.resume()
        else:
            redis_server.start()
    check_recovered(appliance, browser)
    print(f"\nRedis {outage}: slowest " + ", ".join(
        f"{what} {max(values) * 1000:.0f} ms" for what, values in timings.items()))
    timings.clear()

"""One channel name created, deleted and created again as fast as the API allows, from
several threads against a real multi-worker gunicorn, while other threads read /metrics
and the channel, produce to it and delete it too: every answer is a documented one
(2xx, 404, 409, or a 503 problem with Retry-After), never a 500 —
whatever the owner election of a process whose handle is on the old channel meets."""
from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from test_channels_recreate import call
from test_gunicorn import ROOT, gunicorn, manage

pytestmark = pytest.mark.own_sqlite  # its appliance runs on a SQLite database of its own

WORKERS, RUN_S = 3, 8.0
REQUEST_TIMEOUT_S = 10  # an owner election gives up after 30 s: waiting that long fails


@pytest.fixture()
def churn_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    """gunicorn (3 workers, 2 threads each) with an admin token."""
    redis_url = os.environ.get("WEIR_TEST_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "WEIR_DATA_ROOT": str(tmp_path / "channels"), "REDIS_URL": f"{redis_url}/0",
           "WEIR_CACHE_PREFIX": f"weir-churn-{os.getpid()}", "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    manage(env, "migrate", "--noinput")
    admin = manage(env, "create_token", "ops", "--role", "admin", "--role", "produce"
                   ).strip().splitlines()[-1]
    with (tmp_path / "gunicorn.log").open("wb") as log, gunicorn(env, WORKERS, log) as url:
        yield url, admin, tmp_path / "channels"


def metrics(url: str, key: str) -> tuple[int, object]:
    request = urllib.request.Request(f"{url}/metrics",
                                     headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return int(response.status), ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()[:300].decode(errors="replace")


def test_it_answers_no_5xx_while_one_channel_name_is_deleted_and_recreated_rapidly(
        churn_server) -> None:  # type: ignore[no-untyped-def]
    url, admin, root = churn_server
    settings = {"name": "orders", "partitions": 2, "minimum_required_space": 0,
                "data_dirs": [str(root / "orders/data")],
                "checkpoint_dir": str(root / "orders/checkpoint")}
    seen: Counter[tuple[str, int]] = Counter()
    bad: list[str] = []
    last: dict[tuple[str, int], str] = {}
    deadline, cap = time.monotonic() + RUN_S, time.monotonic() + 6 * RUN_S

    def running() -> bool:
        # RUN_S at least, then on (up to 6 x RUN_S) until the name was created and deleted
        # three times: on a loaded machine RUN_S may hold fewer cycles than that.
        now = time.monotonic()
        churned = seen[("create", 201)] >= 3 and seen[("delete", 204)] >= 3
        return now < deadline or (now < cap and not churned)

    def record(what: str, request: Callable[[], tuple[int, object]]) -> None:
        try:
            status, body = request()
        except OSError as exc:  # a request waiting out an owner that never answers
            seen[(what, 0)] += 1
            bad.append(f"{what}: {exc!r} after {REQUEST_TIMEOUT_S} s")
            return
        seen[(what, status)] += 1
        last[(what, status)] = str(body)[:300]  # what a stuck churn answered, if it fails
        if status >= 500 and not (status == 503 and str(body.get(  # type: ignore[union-attr]
                "type")).startswith("https://weir.dev/problems/")):  # a 503 problem
            bad.append(f"{what} {status}: {str(body)[:300]}")

    def churner() -> None:
        while running():
            record("create", lambda: call(url, admin, "POST", "channels", settings,
                                          timeout=REQUEST_TIMEOUT_S))
            record("delete", lambda: call(url, admin, "DELETE", "channels/orders?force=true",
                                          timeout=REQUEST_TIMEOUT_S))

    def reader() -> None:
        while running():
            record("metrics", lambda: metrics(url, admin))
            record("detail", lambda: call(url, admin, "GET", "channels/orders",
                                          timeout=REQUEST_TIMEOUT_S))
            record("produce", lambda: call(url, admin, "POST", "channels/orders/events",
                                           {"events": [{"body": "x"}]},
                                           timeout=REQUEST_TIMEOUT_S))

    threads = ([threading.Thread(target=churner) for _ in range(3)]
               + [threading.Thread(target=reader) for _ in range(3)])
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=6 * RUN_S + 3 * REQUEST_TIMEOUT_S)
    assert not bad, f"{len(bad)} 5xx, first: {bad[:3]}; all answers: {dict(seen)}"
    assert seen[("create", 201)] >= 3 and seen[("delete", 204)] >= 3, \
        f"{sorted(seen.items())} {last.get(('create', 400))}"

"""A channel deleted and recreated under load, against a real multi-worker gunicorn and a
real Celery worker: every process lets go of the deleted channel's files at once (no
open descriptor on a deleted file: its disk space is freed), and every web worker serves
the new channel of the same name at once; meanwhile producers see 200 or the documented
404, never a 5xx."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from polling import wait_for
from test_gunicorn import ROOT, free_port, manage, stop, wait_for_health

pytestmark = pytest.mark.own_sqlite  # its appliance runs on a SQLite database of its own

WORKERS = 3


def call(url: str, key: str, method: str, path: str,
         body: object = None, timeout: float = 30) -> tuple[int, dict[str, object]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/api/v1/{path}", data=data, method=method,
                                     headers={"Authorization": f"Bearer {key}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read()
            return int(response.status), json.loads(text) if text else {}
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return int(exc.code), json.loads(text)
        except ValueError:
            return int(exc.code), {"text": text[:200].decode(errors="replace")}


def children(pid: int) -> list[int]:
    """Every descendant of a process."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            kids = (task / "children").read_text().split()
            found += [int(kid) for kid in kids]
            todo += [int(kid) for kid in kids]
    return found


def deleted_files_open(pids: list[int], under: Path) -> list[str]:
    """Open descriptors of these processes on deleted files under `under`."""
    held = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except FileNotFoundError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except FileNotFoundError:
                continue
            if target.startswith(str(under)) and target.endswith(" (deleted)"):
                held.append(f"{pid}: {target}")
    return held


def files_open(pids: list[int], under: Path) -> list[str]:
    """Open descriptors of these processes on files under `under`."""
    held = []
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except FileNotFoundError:
                continue
            if target.startswith(str(under)):
                held.append(f"{pid}: {target}")
    return held


@pytest.fixture()
def appliance(tmp_path: Path):  # type: ignore[no-untyped-def]
    """gunicorn (3 workers) and a Celery worker (prefork, 2 processes) on channel orders."""
    redis_url = os.environ.get("WEIR_TEST_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
    queue = f"weir-test-recreate-{os.getpid()}"
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "WEIR_DATA_ROOT": str(tmp_path / "channels"), "REDIS_URL": f"{redis_url}/0",
           "WEIR_CACHE_PREFIX": f"weir-recreate-{os.getpid()}", "WEIR_CELERY_QUEUE": queue,
           "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    manage(env, "migrate", "--noinput")
    manage(env, "create_channel", "orders", "--partitions", "2",
           "--set", "minimum_required_space=0")
    admin = manage(env, "create_token", "ops", "--role", "admin").strip().splitlines()[-1]
    key = manage(env, "create_token", "load", "--role", "produce", "--role", "consume"
                 ).strip().splitlines()[-1]
    port = free_port()
    bin_dir = Path(sys.executable).parent
    gunicorn = subprocess.Popen(
        [str(bin_dir / "gunicorn"), "appliance.wsgi", "--bind", f"127.0.0.1:{port}",
         "--workers", str(WORKERS), "--threads", "2", "--no-control-socket"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True)
    celery = subprocess.Popen(
        [str(bin_dir / "celery"), "-A", "appliance", "worker", "-Q", queue, "-c", "2",
         "--pool", "prefork", "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_health(url)
        yield {"url": url, "admin": admin, "key": key, "gunicorn": gunicorn.pid,
               "celery": celery.pid, "channels": tmp_path / "channels", "env": env}
    finally:
        stop(gunicorn)
        stop(celery)


def warm(url: str, key: str, requests: int = 30) -> None:
    """Produce with a new connection each time, so that every web worker (gunicorn hands
    connections to whichever accepts first) opens the channel, as its owner or a client."""
    for _ in range(requests):
        status, body = call(url, key, "POST", "channels/orders/events",
                            {"events": [{"body": "warm"}]})
        assert status == 200, body


def take_all(url: str, key: str) -> set[str]:
    """Take and commit every event of the channel; their bodies."""
    bodies: set[str] = set()
    while True:
        status, body = call(url, key, "POST", "channels/orders/takes", {"max_events": 1000})
        assert status == 200, body
        if not body["events"]:
            return bodies
        bodies.update(str(event["body"]) for event in body["events"])  # type: ignore[union-attr]
        status, _ = call(url, key, "POST", f"channels/orders/takes/{body['take_id']}/commit")
        assert status == 200


def flush_in_celery(env: dict[str, str]) -> None:
    """Run the flush task once in the Celery worker: one of its processes opens the channel."""
    manage(env, "shell", "-c", "from appliance import tasks; "
           "tasks.flush_channel.delay('orders', force=True).get(timeout=30)")


def delete_and_recreate_under_load(appliance: dict[str, object], pids: list[int]) -> None:
    """Four producers run while the channel is deleted (every process lets go of its files)
    and created again; they see 200 or 404, quickly."""
    url, admin, key = (str(appliance[k]) for k in ("url", "admin", "key"))
    root = Path(str(appliance["channels"]))
    settings = {"name": "orders", "partitions": 2, "data_dirs": [str(root / "orders/data")],
                "checkpoint_dir": str(root / "orders/checkpoint"),
                "minimum_required_space": 0}  # as manage.py create_channel made it
    statuses: list[int] = []
    slow: list[float] = []
    acked_after_create: set[str] = set()
    created_at = [float("inf")]
    done = threading.Event()

    def producer(number: int) -> None:
        for request in itertools.count():
            if done.is_set():
                return
            started = time.monotonic()
            bodies = [f"{number}-{request}-{i}" for i in range(20)]
            status, _ = call(url, key, "POST", "channels/orders/events",
                             {"events": [{"body": body} for body in bodies]})
            statuses.append(status)
            slow.append(time.monotonic() - started)
            if status == 200 and started > created_at[0]:
                acked_after_create.update(bodies)

    producers = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for thread in producers:
        thread.start()
    try:
        time.sleep(0.5)
        status, body = call(url, admin, "DELETE", "channels/orders?force=true")
        assert status == 204, body
        wait_for(lambda: not deleted_files_open(pids, root), 5,
                 "no process holds a deleted file of the channel")
        time.sleep(0.3)
        status, body = call(url, admin, "POST", "channels", settings)
        assert status == 201, body
        created_at[0] = time.monotonic()
        time.sleep(1.0)
    finally:
        done.set()
        for thread in producers:
            thread.join()
    assert statuses and set(statuses) <= {200, 404}, sorted(set(statuses))
    assert max(slow) < 5, f"a request took {max(slow):.1f} s"
    assert acked_after_create, "the producers were not served after the channel came back"
    # the new channel holds every event acknowledged since it was created
    taken = take_all(url, key)
    assert acked_after_create <= taken, len(acked_after_create - taken)
    warm(url, key)  # every web worker serves the new channel
    assert not deleted_files_open(pids, root)


def test_it_frees_and_serves_a_deleted_and_recreated_channel_in_every_process_at_once(
        appliance) -> None:  # type: ignore[no-untyped-def]
    root = appliance["channels"] / "orders"
    flush_in_celery(appliance["env"])  # first: a Celery worker process owns the channel
    web, celery = children(appliance["gunicorn"]), children(appliance["celery"])
    assert len(web) == WORKERS
    assert files_open(celery, root), "no Celery worker process owns the channel"
    warm(appliance["url"], appliance["key"])  # every web worker opens it as a client
    delete_and_recreate_under_load(appliance, web + celery)
    # now a web worker owns the new channel, and a Celery process is its client
    assert files_open(web, root), "no web worker owns the new channel"
    flush_in_celery(appliance["env"])
    delete_and_recreate_under_load(appliance, web + celery)
    flush_in_celery(appliance["env"])

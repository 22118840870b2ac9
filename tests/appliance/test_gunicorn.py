"""Parallel producers against a real multi-worker gunicorn: every acknowledged event is in
the channel exactly once (the engine's owner/client processes make several web workers
safe), and stopping gunicorn leaves no process behind."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from channel_engine import Channel, ChannelConfig

pytestmark = pytest.mark.own_sqlite  # its appliance runs on a SQLite database of its own

ROOT = Path(__file__).resolve().parents[2]
PRODUCERS, REQUESTS, EVENTS = 6, 25, 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def wait_for_health(url: str, deadline_s: float = 30) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("gunicorn did not answer /health")


def stop(process: subprocess.Popen[Any]) -> None:
    """Stop a process started in a session of its own, and everything it started."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextmanager
def gunicorn(env: dict[str, str], workers: int,
             stderr: int | IO[Any] = subprocess.DEVNULL) -> Iterator[str]:
    """A real gunicorn (`workers` x 2 threads) serving the appliance with `env` on a free
    loopback port, answering /health; its URL. Stopped with all its workers after."""
    port = free_port()
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), "appliance.wsgi", "--bind",
         f"127.0.0.1:{port}", "--workers", str(workers), "--threads", "2",
         "--no-control-socket"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_health(url)
        yield url
    finally:
        stop(process)
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # no worker left behind


@pytest.fixture()
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "WEIR_DATA_ROOT": str(tmp_path / "channels"), "DATABASE_URL": ""}
    env.pop("DATABASE_URL")
    manage(env, "migrate", "--noinput")
    manage(env, "create_channel", "orders", "--partitions", "3",
           "--set", "minimum_required_space=0")
    key = manage(env, "create_token", "load", "--role", "produce").strip().splitlines()[-1]
    with gunicorn(env, workers=3) as url:
        yield url, key, tmp_path / "channels" / "orders" / "checkpoint"


def produce(url: str, key: str, producer: int, acked: list[str], errors: list[str]) -> None:
    for request in range(REQUESTS):
        bodies = [f"{producer}-{request}-{i}" for i in range(EVENTS)]
        data = json.dumps({"events": [{"body": b, "key": b[-2:]} for b in bodies]}).encode()
        call = urllib.request.Request(f"{url}/api/v1/channels/orders/events", data=data,
                                      headers={"Authorization": f"Bearer {key}",
                                               "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(call, timeout=60) as response:
                result = json.loads(response.read())
            assert result["events"] == EVENTS
            acked.extend(bodies)
        except (urllib.error.URLError, AssertionError) as exc:
            errors.append(repr(exc))


def test_parallel_producers_on_a_multi_worker_server_lose_and_double_nothing(
        server) -> None:  # type: ignore[no-untyped-def]
    url, key, home = server
    acked: list[str] = []
    errors: list[str] = []
    threads = [threading.Thread(target=produce, args=(url, key, p, acked, errors))
               for p in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert len(acked) == PRODUCERS * REQUESTS * EVENTS
    with Channel.open(ChannelConfig.load(home)) as channel:  # a client of a web worker
        got: list[str] = []
        while True:
            with channel.take() as tx:
                events = tx.take(5000)
            if not events:
                break
            got += [e.body.decode() for e in events]
    assert sorted(got) == sorted(acked)


def status_of(url: str, key: str, method: str = "POST", path: str = "orders/events",
              body: dict[str, object] | None = None) -> int:
    data = json.dumps(body if body is not None else {"events": [{"body": "x"}]}).encode()
    call = urllib.request.Request(f"{url}/api/v1/channels/{path}", data=data, method=method,
                                  headers={"Authorization": f"Bearer {key}",
                                           "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(call, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_change_made_anywhere_holds_in_every_worker_at_once(
        server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Workers cache tokens and channel rows; a change made through one worker, or by
    another process, must still hold at the very next request in all of them."""
    url, key, _ = server
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "WEIR_DATA_ROOT": str(tmp_path / "channels")}
    env.pop("DATABASE_URL", None)
    admin = manage(env, "create_token", "ops", "--role", "admin").strip().splitlines()[-1]
    rounds = 12  # a new connection each: the requests spread over the workers
    assert [status_of(url, key) for _ in range(rounds)] == [200] * rounds
    assert status_of(url, admin, "PATCH", "orders", {"puts_paused": True}) == 200
    assert [status_of(url, key) for _ in range(rounds)] == [503] * rounds
    assert status_of(url, admin, "PATCH", "orders", {"puts_paused": False}) == 200
    assert [status_of(url, key) for _ in range(rounds)] == [200] * rounds
    prefix = key.split("_")[1]
    manage(env, "revoke_token", prefix)
    assert [status_of(url, key) for _ in range(rounds)] == [401] * rounds

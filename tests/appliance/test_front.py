"""The front (appliance/front.py): nginx before gunicorn, as the supervisor starts it.

Against one real appliance (gunicorn, 3 workers x 2 threads, behind nginx with
WEIR_TOKEN_MAX_IN_FLIGHT=2): a token's requests beyond the limit answer 429 with
Retry-After in DRF's shape while other tokens are served; slow clients — more than gunicorn
has threads — do not delay anyone; a chunked body reaches Django whole; a body over the
produce limit is refused before it is read. Then the config itself, the supervisor's
refusal to start without nginx, and (slow) WEIR_FRONT=none and the header timeout. The load
test is test_slow_clients.py.
"""
from __future__ import annotations

import dataclasses
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from front_helpers import CHANNEL, Server, web_server

from appliance import front
from scripts.log_rotation import Rotation
from scripts.supervisor import Config, Failed, Supervisor

pytestmark = pytest.mark.own_sqlite  # its appliance runs on a SQLite database of its own

LIMIT = 2
PATH = f"/api/v1/channels/{CHANNEL}/events"
BODY = json.dumps({"events": [{"body": "x"}]}).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with web_server(tmp_path_factory.mktemp("front"), ["busy", "calm"],
                    max_in_flight=LIMIT) as started:
        yield started


def connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def head(server: Server, authorization: str | None, length: int,
         extra: str = "") -> bytes:
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    return (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n{auth}"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n"
            ).encode()


def exchange(server: Server, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one whole request on a new connection; (status, headers, body)."""
    with connect(server) as sock:
        sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        top, _, body = data.partition(b"\r\n\r\n")
        lines = top.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            assert chunk
            body += chunk
        return int(lines[0].split()[1]), headers, body


def produce(server: Server, authorization: str | None) -> tuple[int, dict[str, str], bytes]:
    return exchange(server, head(server, authorization, len(BODY)) + BODY)


def slow_bodies(server: Server, authorization: str | None, count: int) -> list[socket.socket]:
    """`count` produce requests whose header is whole and whose body never ends."""
    held = []
    for _ in range(count):
        sock = connect(server)
        sock.sendall(head(server, authorization, 1000) + b'{"events": [')
        held.append(sock)
    time.sleep(0.3)  # nginx has read their headers
    return held


def test_it_answers_429_beyond_a_tokens_limit_and_serves_other_tokens(server: Server) -> None:
    busy, calm = server.tokens["busy"], server.tokens["calm"]
    held = slow_bodies(server, f"Bearer {busy}", LIMIT)
    try:
        for spelling in (f"Bearer {busy}", f"token  {busy} ", f"BEARER {busy}"):
            status, headers, body = produce(server, spelling)
            assert status == 429, (spelling, body)
            assert headers["retry-after"] == "1"
            assert headers["content-type"] == "application/problem+json"
            refused = json.loads(body)
            assert refused["type"] == "https://weir.dev/problems/token-busy"
            assert (refused["status"], refused["retry_after"]) == (429, 1)
            assert f"{LIMIT} requests in flight" in refused["detail"]
        status, _, body = produce(server, f"Bearer {calm}")
        assert status == 200 and json.loads(body)["events"] == 1
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while (status := produce(server, f"Bearer {busy}")[0]) == 429:
        assert time.monotonic() < deadline, "the limit was not released"
        time.sleep(0.1)
    assert status == 200


def test_it_serves_others_while_more_slow_clients_than_threads_hang(server: Server) -> None:
    threads = 3 * 2
    held = slow_bodies(server, None, threads + 2)
    for _ in range(threads + 2):  # headers that never end
        sock = connect(server)
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n".encode())
        held.append(sock)
    try:
        time.sleep(0.3)
        for _ in range(5):
            began = time.monotonic()
            status, _, body = produce(server, f"Bearer {server.tokens['calm']}")
            assert status == 200, body
            assert time.monotonic() - began < 2.0
    finally:
        for sock in held:
            sock.close()


def test_it_passes_a_chunked_body_whole(server: Server) -> None:
    chunked = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Authorization: Bearer {server.tokens['calm']}\r\n"
               "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    for start in range(0, len(BODY), 5):
        part = BODY[start:start + 5]
        chunked += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    status, _, body = exchange(server, chunked + b"0\r\n\r\n")
    assert status == 200 and json.loads(body)["events"] == 1, body


def test_it_carries_one_request_id_through_the_front_and_the_appliance(server: Server) -> None:
    auth = f"Bearer {server.tokens['calm']}"
    _, kept, _ = exchange(server, head(server, auth, len(BODY), "X-Request-ID: probe-1\r\n")
                          + BODY)
    assert kept["x-request-id"] == "probe-1"
    _, made, _ = exchange(server, head(server, auth, len(BODY), "X-Request-ID: bad id\r\n")
                          + BODY)
    assert len(made["x-request-id"]) == 32 and made["x-request-id"] != "bad id"
    _, refused, _ = exchange(server, head(server, auth, settings.WEIR_MAX_PRODUCE_BYTES + 1,
                                          "X-Request-ID: probe-413\r\n"))
    assert refused["x-request-id"] == "probe-413"  # nginx's own answers name it too


def test_it_refuses_a_body_over_the_produce_limit_before_reading_it(server: Server) -> None:
    limit = settings.WEIR_MAX_PRODUCE_BYTES
    status, headers, body = exchange(server, head(server, f"Bearer {server.tokens['calm']}",
                                                  limit + 1))
    assert status == 413 and headers["content-type"] == "application/problem+json"
    assert json.loads(body) == {"type": "https://weir.dev/problems/body-too-large",
                                "title": "Request body too large", "status": 413,
                                "detail": f"body over WEIR_MAX_PRODUCE_BYTES={limit} bytes"}


def test_its_access_log_is_rotated_and_nginx_writes_the_new_file(server: Server) -> None:
    """The supervisor renames a full access log and has nginx reopen it (SIGUSR1): the
    requests before land in nginx-access.log.1 (nginx flushes its buffer to the old file
    on reopen), those after in a new nginx-access.log, none lost."""
    log = server.var / "log" / "nginx-access.log"
    marker = f"/health?rotation-{time.monotonic_ns()}"
    supervisor, before = server.supervisor, server.supervisor.config
    supervisor.config = dataclasses.replace(before, rotation=Rotation(1024, 2))

    def ask(n: int) -> None:
        for _ in range(n):
            with urllib.request.urlopen(f"{server.url}{marker}", timeout=10) as answer:
                assert answer.status == 200

    def logged() -> int:
        return sum(path.read_text().count(marker) for path in
                   (log, log.with_name("nginx-access.log.1"), log.with_name("nginx-access.log.2"))
                   if path.exists())

    ask(20)  # > 1 KiB of log lines
    deadline = time.monotonic() + 10  # nginx flushes its log buffer every second
    while log.stat().st_size < 1024:
        assert time.monotonic() < deadline, log.stat().st_size
        time.sleep(0.2)
    try:
        supervisor.rotate_reopened_logs()
    finally:
        supervisor.config = before
    assert log.with_name("nginx-access.log.1").exists()
    ask(5)
    deadline = time.monotonic() + 10
    while not (log.exists() and marker in log.read_text()):
        assert time.monotonic() < deadline, "nginx did not reopen its access log"
        time.sleep(0.2)
    assert logged() == 25


def test_it_renders_a_config_nginx_accepts_with_every_limit(tmp_path: Path) -> None:
    config = front.FrontConfig("127.0.0.1:1", "unix:/nonexistent.sock", tmp_path, "off", 3)
    front.prepare(config)
    binary = front.nginx_binary()
    assert binary is not None
    assert front.check(binary, config) is None
    text = config.conf.read_text()
    for line in ("proxy_request_buffering on;", "client_header_timeout 10s;",
                 "client_body_timeout 10s;", "send_timeout 30s;", "keepalive_timeout 30s;",
                 f"client_max_body_size {settings.WEIR_MAX_PRODUCE_BYTES};",
                 "limit_conn weir_tokens 3;", "proxy_set_header X-Forwarded-For $remote_addr;",
                 "proxy_set_header X-Forwarded-Proto $scheme;"):
        assert line in text, line
    off = front.FrontConfig("127.0.0.1:1", "unix:/x.sock", tmp_path, "off", 0)
    assert "limit_conn " not in front.render(off)


def test_it_refuses_to_start_without_nginx_unless_told(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front, "nginx_binary", lambda: None)
    config = Config(tmp_path, "redis://127.0.0.1:1/0", "127.0.0.1:1", 1, 1,
                    ("weir", "weir-export"), "nginx", 4)
    supervisor = Supervisor(config, follow=False)
    with pytest.raises(Failed, match="nginx is not installed.*WEIR_FRONT=none"):
        supervisor.start_web()
    assert supervisor.children == []  # not even gunicorn


@pytest.mark.slow
def test_it_drops_a_client_whose_header_takes_longer_than_the_timeout(server: Server) -> None:
    began = time.monotonic()
    with connect(server) as sock:
        sock.settimeout(1.0)
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
        while True:  # a header line a second: each on time, the whole header never
            assert time.monotonic() - began < front.CLIENT_HEADER_TIMEOUT_S + 5
            try:
                if sock.recv(1024) == b"":
                    break
            except TimeoutError:
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                except (ConnectionResetError, BrokenPipeError):
                    break
            except ConnectionResetError:  # reset_timedout_connection: dropped with a RST
                break
    assert time.monotonic() - began >= front.CLIENT_HEADER_TIMEOUT_S - 0.5


@pytest.mark.slow  # a second appliance: ~8 s on a busy machine
def test_it_serves_gunicorn_directly_only_when_told(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with web_server(tmp_path, ["p"], kind="none") as direct:
        assert [child.name for child in direct.supervisor.children] == ["web"]
        status, _, body = produce(direct, f"Bearer {direct.tokens['p']}")
        assert status == 200, body
    assert "WEIR_FRONT=none: gunicorn serves" in capsys.readouterr().out

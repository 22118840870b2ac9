"""The buffering front: Debian's nginx in front of gunicorn (scripts/run.sh, docker-compose.yml).

    python -m appliance.front --listen 127.0.0.1:8000 --upstream unix:/…/web.sock --dir DIR
                              [--access-log FILE] [--max-in-flight N]

writes DIR/nginx.conf (render() below), checks it with `nginx -t`, then becomes nginx
(exec, in the foreground: `daemon off`), so its supervisor — scripts/supervisor.py or
Docker — watches and stops nginx itself. DIR also holds nginx's pid file and temp dirs;
nothing needs root (a root caller's workers run as root too, like the rest of Weir).

Why: gunicorn's threads read requests themselves, so a client sending its headers or its
body slowly held a thread for as long as it liked (six slow-header or three slow-body
connections starved everyone). nginx reads every request whole, with its own cheap
connections, before it reaches gunicorn:

  * client_header_timeout (CLIENT_HEADER_TIMEOUT_S, the whole header), client_body_timeout
    (between two reads of the body) and send_timeout: a stalled client is dropped;
  * proxy_request_buffering on: a body reaches gunicorn only once complete (a chunked one
    too, then with a Content-Length); client_max_body_size = MAX_PRODUCE_BYTES, answered
    413 body-too-large, a problem (application/problem+json) like the API's own;
  * proxy_buffering on: a slow reader of a response holds an nginx buffer, not a thread;
  * keepalive_timeout / keepalive_requests bound idle and long-lived client connections.

Per-token concurrency (WEIR_TOKEN_MAX_IN_FLIGHT, default 4; 0 = off): nginx's limit_conn,
keyed on the API key taken from `Authorization: Bearer|Token <key>` (case-insensitive,
as appliance/auth.py reads it), counts a token's requests from the moment their header is
read until answered — across all nginx workers (a shared memory zone) and so across every
gunicorn worker behind them. One more is answered at once, in C, without reaching Python:
429, Retry-After: 1, a token-busy problem. Requests without a token
(the UI's session, /health, /metrics) are not counted. Why here and not in Django: a
refusal in Django costs a gunicorn thread and a Redis round trip, so a client sending a
thousand requests at once would still queue them all in front of everyone else.

X-Forwarded-For is set to the address nginx saw (a client's own value is replaced) and
X-Forwarded-Proto to nginx's scheme; Django believes them only from WEIR_TRUSTED_PROXIES
(appliance/proxy.py). nginx's 502/504 (gunicorn not answering) are problems too.

Failure: no nginx binary, or a config nginx refuses → exit 2 with the reason on stderr.
"""
from __future__ import annotations

import argparse
import os
import pwd
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from appliance.api.problems import Problem
from appliance.env import MAX_PRODUCE_BYTES, token_max_in_flight

CLIENT_HEADER_TIMEOUT_S = 10
CLIENT_BODY_TIMEOUT_S = 10
SEND_TIMEOUT_S = 30
KEEPALIVE_TIMEOUT_S = 30
KEEPALIVE_REQUESTS = 1000
# Longer than any request the appliance serves (a full channel's keep_alive_ms, an
# operator's verify of a big channel from the UI).
PROXY_READ_TIMEOUT_S = 300
WORKER_CONNECTIONS = 8192
RETRY_AFTER_S = 1
NGINX_PATHS = ("/usr/sbin", "/sbin", "/usr/local/sbin")  # not on every user's PATH
TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


@dataclass(frozen=True)
class FrontConfig:
    """What one front serves: where it listens, where gunicorn is, where its files go."""

    listen: str  # HOST:PORT or PORT
    upstream: str  # unix:/path/web.sock or HOST:PORT
    directory: Path  # nginx.conf, nginx.pid, temp/
    access_log: str  # a path, or "off"
    max_in_flight: int = 4  # per token; 0: no limit
    max_body_bytes: int = MAX_PRODUCE_BYTES

    @property
    def conf(self) -> Path:
        """The generated config file."""
        return self.directory / "nginx.conf"


def render(config: FrontConfig) -> str:
    """nginx.conf for `config`."""
    directory = config.directory
    # A proxied request holds two descriptors; never ask for more than the hard limit
    # (an unprivileged nginx may not raise it, and would only warn).
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    files = min(2 * WORKER_CONNECTIONS + 64, hard if hard > 0 else 2 * WORKER_CONNECTIONS + 64)
    connections = max(64, min(WORKER_CONNECTIONS, files - 64))
    temp = "\n".join(f"    {name}_temp_path {directory / 'temp' / name};" for name in TEMP_DIRS)
    user = ""
    if os.geteuid() == 0:  # else nginx ignores `user`, with a warning
        user = f"user {pwd.getpwuid(0).pw_name};\n"
    access = config.access_log
    if access != "off":
        access += " weir buffer=32k flush=1s"
    limit, limit_zone = "", ""
    if config.max_in_flight:
        limit_zone = """
    # The API key of `Authorization: Bearer|Token <key>`, as appliance/auth.py reads it;
    # "" (not counted) without one.
    map $http_authorization $weir_token {
        default "";
        "~*^\\s*(?:bearer|token)\\s+(?<weir_key>\\S+)\\s*$" $weir_key;
    }
    limit_conn_zone $weir_token zone=weir_tokens:10m;
    limit_conn_status 429;
    limit_conn_log_level info;
"""
        limit = f"""
            limit_conn weir_tokens {config.max_in_flight};
            error_page 429 = @weir_busy;"""
    busy = problem(429, "token-busy", f"this token already has {config.max_in_flight} "
                   f"requests in flight (WEIR_TOKEN_MAX_IN_FLIGHT); retry after "
                   f"{RETRY_AFTER_S} second", retry_after=RETRY_AFTER_S)
    too_large = problem(413, "body-too-large",
                        f"body over WEIR_MAX_PRODUCE_BYTES={config.max_body_bytes} bytes")
    unavailable = problem(502, "appliance-unavailable", "the appliance behind the front is "
                          "not answering", retry_after=RETRY_AFTER_S)
    return f"""# Generated by appliance/front.py (python -m appliance.front): do not edit; it is
# written anew at every start. Why each limit: that module's docstring.
{user}worker_processes 2;
worker_rlimit_nofile {files};
pid {directory / 'nginx.pid'};
daemon off;
error_log stderr warn;

events {{
    worker_connections {connections};
}}

http {{
    server_tokens off;
    default_type application/octet-stream;
    # The request id (appliance/request_id.py): a well-formed incoming one kept, else
    # nginx's own; passed on and logged, so one id follows a request through both logs.
    map $http_x_request_id $weir_request_id {{
        default $request_id;
        "~^[A-Za-z0-9._:-]{{1,128}}$" $http_x_request_id;
    }}
    log_format weir '$remote_addr [$time_iso8601] "$request" $status $body_bytes_sent '
                    '$request_time $upstream_response_time $weir_request_id';
    access_log {access};
{temp}

    # Slow clients: nginx holds them, gunicorn never sees a request until it is whole.
    client_header_timeout {CLIENT_HEADER_TIMEOUT_S}s;
    client_body_timeout {CLIENT_BODY_TIMEOUT_S}s;
    send_timeout {SEND_TIMEOUT_S}s;
    reset_timedout_connection on;
    keepalive_timeout {KEEPALIVE_TIMEOUT_S}s;
    keepalive_requests {KEEPALIVE_REQUESTS};
    client_max_body_size {config.max_body_bytes};
    client_body_buffer_size 1m;
{limit_zone}
    upstream weir_web {{
        server {config.upstream};
    }}

    server {{
        listen {config.listen} backlog=4096;

        location / {{{limit}
            error_page 413 = @weir_too_large;
            error_page 502 504 = @weir_unavailable;
            proxy_pass http://weir_web;
            proxy_request_buffering on;
            proxy_buffering on;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Request-ID $weir_request_id;
            proxy_connect_timeout 5s;
            proxy_send_timeout 60s;
            proxy_read_timeout {PROXY_READ_TIMEOUT_S}s;
        }}

        location @weir_busy {{
            default_type application/problem+json;
            add_header X-Request-ID $weir_request_id always;
            add_header Retry-After {RETRY_AFTER_S} always;
            return 429 '{busy}\\n';
        }}

        location @weir_too_large {{
            default_type application/problem+json;
            add_header X-Request-ID $weir_request_id always;
            return 413 '{too_large}\\n';
        }}

        location @weir_unavailable {{
            default_type application/problem+json;
            add_header X-Request-ID $weir_request_id always;
            add_header Retry-After {RETRY_AFTER_S} always;
            return 502 '{unavailable}\\n';
        }}
    }}
}}
"""


def problem(status: int, slug: str, detail: str, retry_after: int | None = None) -> str:
    """An answer of nginx's own as the API's problem body (appliance/api/problems.py), a
    JSON text to put in single quotes in nginx.conf."""
    text = Problem(status, slug, detail, retry_after=retry_after).body_text()
    assert "'" not in text and "$" not in text, text  # nginx would read them
    return text


def nginx_binary() -> str | None:
    """nginx's path, or None when it is not installed."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *NGINX_PATHS])
    return shutil.which("nginx", path=path)


def nginx_argv(binary: str, config: FrontConfig) -> list[str]:
    """The command that runs nginx on `config` (in the foreground)."""
    return [binary, "-e", "stderr", "-p", f"{config.directory}/", "-c", str(config.conf)]


def prepare(config: FrontConfig) -> None:
    """Write the config and make its directories."""
    for name in TEMP_DIRS:
        (config.directory / "temp" / name).mkdir(parents=True, exist_ok=True)
    config.conf.write_text(render(config))


def check(binary: str, config: FrontConfig) -> str | None:
    """None when nginx accepts the config, else what it said."""
    done = subprocess.run([*nginx_argv(binary, config), "-t", "-q"], capture_output=True,
                          text=True, errors="replace", timeout=30)
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()


def main(argv: list[str] | None = None) -> int:
    """Write the config, check it, then exec nginx on it (returns only on failure)."""
    parser = argparse.ArgumentParser(prog="python -m appliance.front", description=(
        "Run nginx in front of gunicorn: buffer whole requests, drop slow clients, limit "
        "each API token's requests in flight (WEIR_TOKEN_MAX_IN_FLIGHT)."))
    parser.add_argument("--listen", required=True, help="HOST:PORT (or PORT) to serve")
    parser.add_argument("--upstream", required=True,
                        help="gunicorn: unix:/path/web.sock or HOST:PORT")
    parser.add_argument("--dir", required=True, type=Path,
                        help="for nginx.conf, the pid file and temp files")
    parser.add_argument("--access-log", default="off", help="a file, or off (the default)")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="per token (default: WEIR_TOKEN_MAX_IN_FLIGHT, else 4); 0: none")
    args = parser.parse_args(argv)
    try:
        max_in_flight = (token_max_in_flight() if args.max_in_flight is None
                         else args.max_in_flight)
    except ImproperlyConfigured as exc:
        print(f"weir-front: {exc}", file=sys.stderr)
        return 2
    config = FrontConfig(args.listen, args.upstream, args.dir.resolve(), args.access_log,
                         max_in_flight)
    binary = nginx_binary()
    if binary is None:
        print("weir-front: nginx is not installed (Debian: apt-get install nginx; "
              "scripts/run.sh installs it)", file=sys.stderr)
        return 2
    prepare(config)
    refused = check(binary, config)
    if refused is not None:
        print(f"weir-front: nginx refuses {config.conf}:\n{refused}", file=sys.stderr)
        return 2
    limit = (f"at most {max_in_flight} requests in flight per token" if max_in_flight
             else "no per-token limit")
    print(f"weir-front: nginx on {config.listen} in front of gunicorn at {config.upstream} "
          f"({limit}); config {config.conf}", flush=True)
    os.execv(binary, nginx_argv(binary, config))
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())

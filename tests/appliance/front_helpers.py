"""A real gunicorn behind the real nginx front, started by the supervisor's own code
(Supervisor.start_web), on a fresh var dir with one channel and the tokens a test asks for.
Shared by test_front.py and test_slow_clients.py (and bench/slow_clients.py)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from appliance import front
from scripts.supervisor import Config, Supervisor

ROOT = Path(__file__).resolve().parents[2]
CHANNEL = "orders"

# One Django start for all of it. Policy durability (no fsync per put): the load tests
# measure the web path, not this shared machine's disk.
SETUP = """
import json
from django.core.management import call_command
from appliance.models import ApiToken
call_command("migrate", "--noinput", verbosity=0)
call_command("create_channel", "orders", "--partitions", "3", "--set",
             "minimum_required_space=0", "--set", "durability=policy", "--set", "flush_ms=1000")
print(json.dumps({name: ApiToken.issue(name, ["produce"])[1] for name in NAMES}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A started appliance: where it answers, its tokens by name, its var dir."""

    url: str
    port: int
    tokens: dict[str, str]
    var: Path
    supervisor: Supervisor


def require_nginx() -> None:
    if front.nginx_binary() is None:
        raise AssertionError("nginx is not installed: scripts/test.sh installs Debian's "
                             "(apt-get install nginx)")


@contextmanager
def web_server(tmp: Path, tokens: list[str], kind: str = "nginx",
               max_in_flight: int = 4, workers: int = 3) -> Iterator[Server]:
    """gunicorn (`workers` x 2 threads) behind nginx (or alone: kind "none")."""
    if kind == "nginx":
        require_nginx()
    port = free_port()
    var = tmp / "var"
    env = {**os.environ, "WEIR_VAR_DIR": str(var), "WEIR_DATA_ROOT": str(tmp / "channels"),
           "WEIR_BIND": f"127.0.0.1:{port}", "WEIR_FRONT": kind,
           "WEIR_TOKEN_MAX_IN_FLIGHT": str(max_in_flight),
           "DJANGO_SETTINGS_MODULE": "appliance.settings", "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    code = SETUP.replace("NAMES", json.dumps(tokens))
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    keys = json.loads(done.stdout.strip().splitlines()[-1])
    config = Config(var, env.get("REDIS_URL") or "redis://127.0.0.1:6379/0", env["WEIR_BIND"],
                    workers, 1, ("weir", "weir-export"), kind, max_in_flight,
                    web_threads=2)
    supervisor = Supervisor(config, follow=False, env=env)
    try:
        supervisor.start_web()
        yield Server(config.url, port, keys, var, supervisor)
    finally:
        supervisor.stop()

"""scripts/run.sh end to end, as an operator runs it: in the background (start, produce,
the worker and beat checkpoint the channel, status, a refused second start, stop) and in
the foreground (Ctrl-C). Each run gets its own var dir, ports and a private redis-server
(REDIS_URL names a free port), and leaves no process behind: every process run.sh starts
inherits WEIR_VAR_DIR=<the test's var dir>, which is how they are found (in /proc).

Also the test command's Redis (use_test_redis in scripts/common.sh, which scripts/test.sh
calls): a private redis-server when none answers, gone when the script exits; and its
PostgreSQL (use_test_postgres): a private server, stopped with the Redis on exit or
SIGTERM, or a failed command saying why when it cannot start. And the PostgreSQL pass it
runs beside the main one (start_background / finish_background): its output held until
the main pass is done, its status returned, and interrupted with its processes when the
script ends first."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

ROOT = Path(__file__).resolve().parents[1]
RUN = str(ROOT / "scripts" / "run.sh")
PYTHON = str(ROOT / ".venv" / "bin" / "python")
PASSWORD_LINE = re.compile(r"created admin user 'admin' with password: (\S+)")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def processes_of(var: Path, redis_port: int) -> set[int]:
    """Every live process of a run: those whose environment has WEIR_VAR_DIR=var, the
    private redis-server, and nginx's master and workers (both overwrite their environment
    with their process title: redis-server's names its port, nginx's master its config
    under var/, its workers are the master's children). Zombies have neither."""
    wanted = f"WEIR_VAR_DIR={var}".encode()
    redis_title = f"redis-server 127.0.0.1:{redis_port}\0".encode()
    master_title = b"nginx: master process "
    nginx_conf = f"-c {var}/front/nginx.conf".encode()
    found, parents = set(), {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
                cmdline = (entry / "cmdline").read_bytes()
                parents[int(entry.name)] = int((entry / "stat").read_text()
                                               .rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if (wanted in environ.split(b"\0") or redis_title in cmdline
                    or (cmdline.startswith(master_title) and nginx_conf in cmdline)):
                found.add(int(entry.name))
    found |= {pid for pid, parent in parents.items() if parent in found}
    return found - {os.getpid()}


def group_members(group: int) -> set[int]:
    """The live (not zombie) processes of a process group."""
    members = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[0] not in ("Z", "X") and int(fields[2]) == group:
                members.add(int(entry.name))
    return members


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Run:
    """One appliance's environment, as an operator's shell would have it."""

    env: dict[str, str]
    var: Path
    url: str
    web_port: int
    redis_port: int
    groups: set[int] = field(default_factory=set)  # its process groups, seen while it ran

    def processes(self) -> set[int]:
        return processes_of(self.var, self.redis_port)

    def record_groups(self) -> set[int]:
        """Every process group of the running appliance."""
        for pid in self.processes():
            try:
                self.groups.add(os.getpgid(pid))
            except ProcessLookupError:
                pass
        return self.groups

    def sh(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([RUN, *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def manage(self, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT,
                              env={**self.env, **extra_env}, capture_output=True, text=True,
                              timeout=60)

    def call(self, path: str, key: str | None = None,
             body: dict[str, Any] | None = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status), json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")


def nginx_master(run: Run) -> int:
    """The pid of the run's nginx master (its pid file)."""
    return int((run.var / "front" / "nginx.pid").read_text())


def kill_leftovers(run: Run) -> set[int]:
    """SIGKILL every process of the run still there after a few seconds (one whose
    supervisor died gets SIGTERM and stops by itself), and its group; return them."""
    deadline = time.monotonic() + 5
    while run.processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = run.processes()
    for pid in left:
        try:
            group = os.getpgid(pid)
            if group != os.getpgrp():
                os.killpg(group, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


@pytest.fixture()
def run(tmp_path: Path) -> Iterator[Run]:
    web_port, redis_port = free_ports(2)
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "WEIR_DATA_ROOT": str(tmp_path / "channels"), "WEIR_BIND": f"127.0.0.1:{web_port}",
           "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "WEIR_SCHEDULER_TICK_S": "0.5"}
    for name in ("DATABASE_URL", "WEIR_ADMIN_PASSWORD", "WEIR_ADMIN_USER", "WEIR_CELERY_QUEUE",
                 "WEIR_EXPORT_QUEUE", "WEIR_KAFKA_QUEUE"):
        env.pop(name, None)
    appliance = Run(env, tmp_path / "var", f"http://127.0.0.1:{web_port}", web_port,
                    redis_port)
    try:
        yield appliance
    finally:
        try:
            appliance.sh("--stop", timeout=90)
        finally:
            left = kill_leftovers(appliance)
    assert not left, f"processes left after the test: {sorted(left)}"


def wait_healthy(run: Run, deadline_s: float, process: subprocess.Popen[bytes],
                 output: Path) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert process.poll() is None, output.read_text()
        try:
            if run.call("/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no /health in {deadline_s} s:\n{output.read_text()}")


def assert_each_worker_consumes_its_queue(run: Run) -> None:
    """The task worker consumes only the default queue, the export worker only exports',
    the Kafka worker only the Kafka sink's (each worker's start-up banner lists its queues
    as `.> <name> exchange=...`)."""
    deadline = time.monotonic() + 30
    banners: dict[str, set[str]] = {}
    while time.monotonic() < deadline:
        banners = {name: set(re.findall(r"\.> (\S+)\s+exchange=",
                                        (run.var / "log" / f"{name}.log").read_text()))
                   for name in ("worker", "exports", "kafka")}
        if all(banners.values()):
            break
        time.sleep(0.3)
    assert banners == {"worker": {"weir"}, "exports": {"weir-export"},
                       "kafka": {"weir-kafka"}}, banners


def checkpoint_state(run: Run, key: str) -> tuple[int, bool]:
    status, detail = run.call("/api/v1/channels/t", key)
    assert status == 200, detail
    ok = any(r["task"] == "weir.checkpoint_channel" and r["outcome"] == "ok"
             for r in detail["recent_runs"])
    return int(detail["status"]["checkpoint"]["sequence"]), ok


@pytest.mark.timeout(240)
def test_background_run_serves_checkpoints_and_stops(run: Run) -> None:
    started = time.monotonic()
    first = run.sh("--background")
    took = time.monotonic() - started
    print(f"\nscripts/run.sh --background: healthy after {took:.1f} s")
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"Weir is running at {run.url}/" in first.stdout
    assert "starting a private redis-server" in first.stdout
    prefix = "weir-" + (run.var / "appliance_id").read_text()  # made by the supervisor
    assert (f"weir: Redis: redis://127.0.0.1:{run.redis_port}/0, this appliance's keys under "
            f"{prefix}: (its queues weir, weir-export, weir-kafka)") in first.stdout
    passwords = PASSWORD_LINE.findall(first.stdout)
    assert len(passwords) == 1, first.stdout
    assert first.stdout.count(passwords[0]) == 1
    for log in (run.var / "log").iterdir():  # shown once, never stored
        assert passwords[0] not in log.read_text(errors="replace"), log

    supervisor = int((run.var / "run" / "supervisor.pid").read_text())
    with redis.Redis(port=run.redis_port) as private:
        redis_pid = int(private.info()["process_id"])
    started_pids = run.processes()
    assert {supervisor, redis_pid} <= started_pids
    nginx = nginx_master(run)  # the front, on WEIR_BIND; gunicorn on a unix socket
    assert nginx in started_pids and port_open(run.web_port)
    assert (run.var / "run" / "web" / "web.sock").is_socket()
    # supervisor, redis, gunicorn + 3, nginx + 2, worker (+ its pool), exports (+ its pool),
    # beat
    assert len(started_pids) >= 11
    groups = run.record_groups()
    # supervisor, log writer, redis, web, nginx, worker, exports, kafka, beat
    assert len(groups) == 9
    assert_each_worker_consumes_its_queue(run)

    again = run.manage("ensure_admin")
    assert again.returncode == 0 and again.stdout.strip() == "admin user 'admin' exists"
    empty = run.manage("ensure_admin", WEIR_ADMIN_USER="")
    assert empty.returncode != 0 and "WEIR_ADMIN_USER is empty" in empty.stderr
    given = run.manage("ensure_admin", WEIR_ADMIN_USER="ops", WEIR_ADMIN_PASSWORD="pw-123456")
    assert given.returncode == 0 and "created admin user 'ops'" in given.stdout
    assert "pw-123456" not in given.stdout

    created = run.manage("create_channel", "t", "--set", "minimum_required_space=0",
                         "--set", "checkpoint_interval_ms=1000")
    assert created.returncode == 0, created.stderr
    token = run.manage("create_token", "p", "--role", "admin")
    assert token.returncode == 0, token.stderr
    key = token.stdout.strip().splitlines()[-1]
    for _ in range(3):
        code, body = run.call("/api/v1/channels/t/events", key, {"events": [{"body": "x"}]})
        assert code == 200, body
    produced_at, _ = checkpoint_state(run, key)
    deadline = time.monotonic() + 30
    while True:  # the worker checkpoints it when beat's checkpointer says it is due
        sequence, ok = checkpoint_state(run, key)
        if sequence > produced_at and ok:
            break
        assert time.monotonic() < deadline, (sequence, produced_at, ok)
        time.sleep(0.3)

    running = run.sh("--status")
    assert running.returncode == 0 and "Weir is running" in running.stdout
    refused = run.sh("--background")
    assert refused.returncode != 0 and "already running" in refused.stdout

    stopped = run.sh("--stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert run.processes() == set()
    assert not group_members(nginx)
    assert re.search(r"weir: stopping web, nginx, worker",
                     (run.var / "log" / "supervisor.log").read_text())
    assert not any(group_members(group) for group in groups)
    assert not port_open(run.web_port) and not port_open(run.redis_port)
    assert not (run.var / "run" / "supervisor.pid").exists()
    gone = run.sh("--status")
    assert gone.returncode == 3 and "not running" in gone.stdout

    started = time.monotonic()
    second = run.sh("--background")  # the same var dir: the admin exists, no password
    print(f"scripts/run.sh --background again: healthy after {time.monotonic() - started:.1f} s")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "admin user 'admin' exists" in second.stdout
    assert not PASSWORD_LINE.search(second.stdout) and passwords[0] not in second.stdout
    assert run.sh("--stop").returncode == 0
    assert run.processes() == set()
    nothing = run.sh("--stop")
    assert nothing.returncode == 0 and "not running" in nothing.stdout


@pytest.mark.timeout(240)
def test_foreground_run_shows_the_logs_and_stops_on_ctrl_c(run: Run, tmp_path: Path) -> None:
    output = tmp_path / "run.out"
    with output.open("wb") as out:
        process = subprocess.Popen([RUN], cwd=ROOT, env=run.env, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_healthy(run, 90, process, output)
        deadline = time.monotonic() + 30  # the banner, then the worker and beat at work
        while not re.search(r"Weir is running at.*\n\[beat\] [^\n]*beat: Starting.*"
                            r"\n\[worker\] [^\n]* ready\.", output.read_text(), re.S):
            assert time.monotonic() < deadline, output.read_text()
            time.sleep(0.2)
        started_pids = run.processes()
        assert process.pid in started_pids and len(started_pids) >= 11
        assert nginx_master(run) in started_pids
        groups = run.record_groups()
        assert len(groups) == 9
        os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        assert process.wait(timeout=30) == 0, output.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = output.read_text()
    assert run.processes() == set(), text
    assert not any(group_members(group) for group in groups)
    assert not port_open(run.web_port) and not port_open(run.redis_port)
    lines = text.splitlines()
    for name in ("redis", "migrate", "admin", "web", "nginx", "worker", "exports", "kafka",
                 "beat"):
        assert any(line.startswith(f"[{name}]") for line in lines), name
    assert any(line.startswith("[nginx]") and f"nginx on 127.0.0.1:{run.web_port} in front "
               "of gunicorn at unix:" in line for line in lines), text
    assert any(line.startswith("weir: stopping web, nginx,") for line in lines), text
    assert "weir: SIGINT: stopping" in lines and lines[-1] == "weir: stopped"
    assert not any("Sending due task" in line for line in lines)  # routine: only in the logs
    assert "Sending due task flusher" in (run.var / "log" / "beat.log").read_text()


# -- the test command's Redis (scripts/test.sh calls use_test_redis) ----------------------
SHOW_REDIS = """
import os, redis
client = redis.Redis.from_url(os.environ["WEIR_TEST_REDIS_URL"])
config = client.config_get("save") | client.config_get("appendonly")
print("pid", client.info()["process_id"], "save", repr(config["save"]), config["appendonly"])
"""


def use_test_redis(env: dict[str, str], then: str = "") -> subprocess.Popen[str]:
    script = (f'set -euo pipefail; . scripts/common.sh; use_test_redis; '
              f'echo "urls $WEIR_TEST_REDIS_URL $REDIS_URL"; {PYTHON} -c \'{SHOW_REDIS}\'; '
              f'{then}')
    return subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def read_start(process: subprocess.Popen[str]) -> tuple[list[str], str, int]:
    """The helper's output up to the test Redis's pid line: (lines, URL, pid)."""
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("pid "):
            break
    urls = next(line.split()[1:] for line in lines if line.startswith("urls "))
    assert urls[1] == f"{urls[0]}/0", lines  # REDIS_URL: the same server, db 0
    fields = lines[-1].split()
    assert fields[2:] == ["save", "''", "no"], lines  # no persistence
    return lines, urls[0], int(fields[1])


def gone(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ending", ["exit", "SIGTERM"])
def test_the_test_command_starts_a_private_redis_when_none_answers(
        tmp_path: Path, ending: str) -> None:
    dead = free_ports(1)[0]
    env = {**os.environ, "WEIR_TEST_REDIS_URL": f"redis://127.0.0.1:{dead}",
           "TMPDIR": str(tmp_path)}
    process = use_test_redis(env, "" if ending == "exit" else "sleep 30 & wait $!")
    try:
        lines, url, pid = read_start(process)
        assert f"no Redis answers at redis://127.0.0.1:{dead}: starting a private " \
               "redis-server" in lines[0], lines
        assert url != f"redis://127.0.0.1:{dead}" and list(tmp_path.glob("weir-test-redis.*"))
        if ending == "SIGTERM":
            process.send_signal(signal.SIGTERM)  # the script alone, as `kill` would
        assert process.wait(timeout=20) == (0 if ending == "exit" else 143)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    deadline = time.monotonic() + 5
    while not gone(pid):
        assert time.monotonic() < deadline, f"the private redis-server {pid} outlived it"
        time.sleep(0.1)
    assert not port_open(int(url.rsplit(":", 1)[1]))
    assert not list(tmp_path.glob("weir-test-redis.*"))  # its directory went with it
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the SIGTERM case's sleep
    except ProcessLookupError:
        pass


@pytest.mark.timeout(60)
def test_the_test_command_keeps_using_a_redis_that_answers(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    machine = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                               stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not port_open(port):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        process = use_test_redis({**os.environ, "WEIR_TEST_REDIS_URL":
                                  f"redis://127.0.0.1:{port}"})
        lines, url, pid = read_start(process)
        assert process.wait(timeout=20) == 0
        assert url == f"redis://127.0.0.1:{port}" and pid == machine.pid
        assert not any("starting a private" in line for line in lines), lines
        assert not gone(machine.pid)  # left running: it is not the script's
    finally:
        machine.terminate()
        machine.wait()


# -- the test command's PostgreSQL (scripts/test.sh calls use_test_postgres) -------------
SHOW_POSTGRES = """
import os, psycopg
with psycopg.connect(os.environ["WEIR_TEST_POSTGRES_URL"]) as db:
    row = db.execute("select current_database(), current_setting('fsync'),"
                     " current_setting('full_page_writes'),"
                     " current_setting('synchronous_commit')").fetchone()
print("settings", *row)
"""


def open_tmpdir(tmp_path: Path) -> Path:
    """A TMPDIR that PostgreSQL's unprivileged user can reach (pytest's are root-only)."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"weir-pg-test-{os.getpid()}-{tmp_path.name}"
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    return path


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ending", ["exit", "SIGTERM"])
def test_the_test_command_starts_a_private_postgres_and_redis_and_stops_both(
        tmp_path: Path, ending: str) -> None:
    dead_pg, dead_redis = free_ports(2)
    tmp = open_tmpdir(tmp_path)
    env = {**os.environ, "WEIR_TEST_POSTGRES_URL": f"postgresql://postgres@127.0.0.1:{dead_pg}/x",
           "WEIR_TEST_REDIS_URL": f"redis://127.0.0.1:{dead_redis}", "TMPDIR": str(tmp),
           "SHOW_POSTGRES": SHOW_POSTGRES}
    script = ('set -euo pipefail; . scripts/common.sh; use_test_redis; use_test_postgres; '
              f'{PYTHON} -c "$SHOW_POSTGRES"; '
              'echo "pids $(head -n 1 "$_test_postgres_dir/data/postmaster.pid") '
              '$_test_redis_pid $WEIR_TEST_POSTGRES_URL"; '
              + ("" if ending == "exit" else "sleep 30 & wait $!"))
    process = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("pids "):
                break
        assert any(f"no PostgreSQL answers at postgresql://postgres@127.0.0.1:{dead_pg}/x: "
                   "starting a private PostgreSQL" in line for line in lines), lines
        assert "settings test off off off" in lines, lines  # its database; no fsync
        _, postmaster, redis_pid, url = lines[-1].split()
        assert url.startswith("postgresql://postgres@127.0.0.1:") and url.endswith("/test")
        assert len(list(tmp.glob("weir-test-*"))) == 2  # one dir each
        if ending == "SIGTERM":
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == (0 if ending == "exit" else 143), lines
        for pid in (int(postmaster), int(redis_pid)):
            assert gone(pid), f"{pid} outlived the script"
        assert not port_open(int(url.rsplit(":", 1)[1].split("/")[0]))
        assert not list(tmp.iterdir())  # both dirs went with them
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the SIGTERM case's sleep
        except ProcessLookupError:
            pass


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="a dir closed to PostgreSQL's user needs root")
def test_the_test_command_fails_saying_why_when_postgres_cannot_start(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)  # the `postgres` user may not enter it
    env = {**os.environ, "TMPDIR": str(closed)}
    env.pop("WEIR_TEST_POSTGRES_URL", None)
    done = subprocess.run(["bash", "-c", "set -euo pipefail; . scripts/common.sh; "
                           "use_test_postgres; echo ran on"], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=50)
    assert done.returncode == 1 and "ran on" not in done.stdout
    assert "cannot write" in done.stderr and "set TMPDIR" in done.stderr, done.stderr
    assert not list(closed.iterdir())  # the temp dir was removed on the way out


# -- the test command's background pass (start_background / finish_background) ----------
@pytest.mark.timeout(60)
def test_the_test_command_prints_its_background_pass_after_the_main_one(tmp_path: Path) -> None:
    script = ("set -euo pipefail; . scripts/common.sh; "
              "start_background bash -c 'echo pass out; echo pass err >&2; exit 3'; "
              "sleep 0.5; echo main; status=0; finish_background || status=$?; "
              'echo "status $status"')
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, text=True, capture_output=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["main", "pass out", "pass err", "status 3"]
    assert not list(tmp_path.iterdir())  # its log went once printed


# Stands for pytest: tears down on SIGINT (KeyboardInterrupt), with a child in its group.
# It names its child (argv[1]) only once inside the try: a SIGINT sent as soon as the
# name is seen is always torn down from.
PASS = """
import os, pathlib, subprocess, sys, time
child = subprocess.Popen(["sleep", "60"])
try:
    pathlib.Path(sys.argv[1]).write_text(f"{child.pid} {os.getpgid(0)}")
    time.sleep(60)
except KeyboardInterrupt:
    child.kill()
    pathlib.Path(sys.argv[2]).write_text("torn down")
"""


@pytest.mark.timeout(60)
# "failure, started ignoring SIGINT": the test command itself was started with SIGINT
# ignored (a background job of a script, nohup), which every child inherits.
@pytest.mark.parametrize("ending", ["failure", "SIGTERM", "SIGINT ignored",
                                    "failure, started ignoring SIGINT"])
def test_the_test_command_interrupts_its_background_pass_when_it_ends_first(
        tmp_path: Path, ending: str) -> None:
    state, torn = tmp_path / "child", tmp_path / "torn"
    code = PASS if ending != "SIGINT ignored" else (
        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n" + PASS)
    script = ("set -euo pipefail; . scripts/common.sh; "
              f'start_background {PYTHON} -c "$PASS" {state} {torn}; echo "pass $_background_pid"; '
              + ("sleep 30 & wait $!" if ending == "SIGTERM" else
                 'until [ -s "$STATE" ]; do sleep 0.1; done; false'))
    env = {**os.environ, "TMPDIR": str(tmp_path), "PASS": code, "STATE": str(state),
           "WEIR_BACKGROUND_GRACE_S": "2"}
    def ignoring_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    process = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, start_new_session=True,
                               preexec_fn=ignoring_sigint if "started" in ending else None)
    group = 0
    try:
        assert process.stdout is not None
        group = int(process.stdout.readline().split()[1])
        deadline = time.monotonic() + 20
        while not state.exists() or not state.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        child, its_group = map(int, state.read_text().split())
        assert its_group == group != process.pid  # a process group of its own
        if ending == "SIGTERM":
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == (143 if ending == "SIGTERM" else 1)
        assert not group_members(group) and gone(child)
        assert torn.exists() == (ending != "SIGINT ignored")  # else killed after the grace
        assert {p.name for p in tmp_path.iterdir()} <= {"child", "torn"}  # no log left
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for pgid in (process.pid, group or process.pid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_run_sh_installs_only_what_the_supervisor_names(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    """The packages scripts/run.sh installs come from the supervisor's own settings: nginx
    only for the nginx front, redis-server only when a private Redis must start."""
    from scripts import supervisor

    monkeypatch.setenv("WEIR_VAR_DIR", str(tmp_path))
    with socket.socket() as free:  # nothing listens there: a private Redis is needed
        free.bind(("127.0.0.1", 0))
        monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{free.getsockname()[1]}/0")
    monkeypatch.setattr(supervisor.front, "nginx_binary", lambda: None)
    monkeypatch.setattr(supervisor.shutil, "which", lambda name: None)
    assert supervisor.missing_packages(supervisor.Config.from_env()) == ["nginx",
                                                                         "redis-server"]
    monkeypatch.setenv("WEIR_FRONT", "none")
    monkeypatch.setenv("REDIS_URL", "redis://redis.example:6379/0")  # not ours to start
    assert supervisor.missing_packages(supervisor.Config.from_env()) == []


def test_web_workers_and_threads_come_from_the_environment_and_are_checked(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """gunicorn's shape: the measured defaults (bench/README.md), WEIR_WEB_WORKERS and
    WEIR_WEB_THREADS when set, and a clear refusal naming the variable for a bad value."""
    from scripts import supervisor

    monkeypatch.setenv("WEIR_VAR_DIR", str(tmp_path))
    monkeypatch.delenv("WEIR_WEB_WORKERS", raising=False)
    monkeypatch.delenv("WEIR_WEB_THREADS", raising=False)
    config = supervisor.Config.from_env()
    assert (config.web_workers, config.web_threads) == (2, 8)
    monkeypatch.setenv("WEIR_WEB_WORKERS", "3")
    monkeypatch.setenv("WEIR_WEB_THREADS", "4")
    config = supervisor.Config.from_env()
    assert (config.web_workers, config.web_threads) == (3, 4)
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("WEIR_WEB_THREADS", bad)
        with pytest.raises(supervisor.Failed, match=f"WEIR_WEB_THREADS must be .*{bad!r}"):
            supervisor.Config.from_env()

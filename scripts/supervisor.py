"""Run the whole appliance on one machine: `scripts/run.sh [--background | --stop | --status]`,
which runs this module (`python -m scripts.supervisor`, from the repository's root). It is
a process supervisor, not part of the Django app: it imports the appliance's settings
helpers (appliance.env) and its nginx front (appliance.front), never Django's app registry.

What it runs, in this order (stopped in reverse: redis last):

    name     command                                            when
    -------  -------------------------------------------------  ------------------------------
    redis    redis-server --port <REDIS_URL's port>             only when nothing answers PING
             --dir $WEIR_VAR_DIR/redis --appendonly yes         at REDIS_URL and its host is
             --save ""                                          127.0.0.1 or localhost
    -        manage.py migrate --noinput                        once, output shown as [migrate]
    -        manage.py ensure_admin                             once, output shown as [admin]
                                                                (never written to a log file)
    web      gunicorn appliance.wsgi                            always
             --bind unix:$WEIR_VAR_DIR/run/web/web.sock         (--bind $WEIR_BIND when
             --workers $WEIR_WEB_WORKERS                        WEIR_FRONT=none)
             --threads $WEIR_WEB_THREADS
             --control-socket $WEIR_VAR_DIR/run/gunicorn.ctl
    nginx    python -m appliance.front --listen $WEIR_BIND      once gunicorn listens, unless
             --upstream unix:…/web.sock                         WEIR_FRONT=none; it writes
             --dir $WEIR_VAR_DIR/front                          front/nginx.conf and execs
                                                                Debian's nginx
    worker   celery -A appliance worker -n worker@%h            once web answers on /health
             --queues $WEIR_CELERY_QUEUE                        (started with web, the five
             --concurrency $WEIR_TASK_WORKERS                   Django imports at once took
    exports  celery -A appliance worker -n exports@%h           web twice as long to answer)
             --queues $WEIR_EXPORT_QUEUE --concurrency 1
    kafka    celery -A appliance worker -n kafka@%h
             --queues $WEIR_KAFKA_QUEUE --concurrency 1
    beat     celery -A appliance beat
             --schedule $WEIR_VAR_DIR/celerybeat-schedule

Why three workers: exports run for minutes and have a queue of their own (appliance/celery.py),
so the flusher's, checkpointer's and retention's tasks never wait behind them, nor the Kafka
sink's runs (up to a minute each), which have a queue of their own too. One export at a
time: a local Spark job already uses every core.

The front: clients reach gunicorn only through nginx (appliance/front.py says why: slow
clients and per-token concurrency), which listens on WEIR_BIND; gunicorn listens on a unix
socket in a 0700 directory, so nothing else reaches it. Without nginx installed, start-up
fails saying so (scripts/run.sh installs Debian's package first); WEIR_FRONT=none serves
gunicorn on WEIR_BIND directly, without either defence, for a deployment with a front of
its own (WEIR_TRUSTED_PROXIES then names it).

Environment (defaults): REDIS_URL (redis://127.0.0.1:6379/0), WEIR_BIND (127.0.0.1:8000),
WEIR_FRONT (nginx), WEIR_TOKEN_MAX_IN_FLIGHT (4), WEIR_WEB_WORKERS (2), WEIR_WEB_THREADS
(8), WEIR_TASK_WORKERS (2), WEIR_VAR_DIR (<repo>/var), WEIR_CELERY_QUEUE (weir),
WEIR_EXPORT_QUEUE (<default queue>-export), WEIR_KAFKA_QUEUE (<default queue>-kafka),
WEIR_REDIS_PREFIX (weir-<the id in $WEIR_VAR_DIR/appliance_id>), WEIR_LOG_MAX_BYTES
(10485760), WEIR_LOG_BACKUPS (5); the processes read everything else themselves
(appliance/settings.py: WEIR_DATA_ROOT (<var>/channels), WEIR_KEY_DIR (<var>/keys, made
0700; they refuse to start when others may use it), ...).

Each long-running process has its own process group (a new session, so a terminal's Ctrl-C
reaches only the supervisor); it gets SIGTERM should the supervisor die without stopping it
(PR_SET_PDEATHSIG). Its stdout and stderr are a pipe to the log writer
(scripts/log_writer.py), a process started before any child, in a session of its own and
without that death signal: it writes them to $WEIR_VAR_DIR/log/<name>.log rotated by size
(scripts/log_rotation.py: <name>.log.1 ... .WEIR_LOG_BACKUPS, each up to
WEIR_LOG_MAX_BYTES; nginx's access log, written by nginx, is renamed and reopened by
SIGUSR1, and the detached supervisor's own supervisor.log so by itself), and it outlives a
killed supervisor until the last child is gone, so what the children write while they stop
is kept. It hands the lines back to the supervisor for the foreground view; its own errors
go to supervisor.log. At start the supervisor says which Redis it uses (the URL, password
masked) and the prefix of the appliance's keys there (appliance/env.py: redis_prefix says
what is under it). Start-up is done when GET http://$WEIR_BIND/health answers 200 and the
workers and beat are started. Stopping sends SIGTERM to each group, waits up to
STOP_TIMEOUT_S, then SIGKILL.

    (no flag)     start, then show every log line prefixed with its process's name until
                  Ctrl-C / SIGTERM, or until a process exits (then stop the rest, exit 1)
    --background  start a detached supervisor, return once it is healthy
    --stop        SIGTERM the running supervisor and wait until it and its processes are gone
    --status      exit 0 when running, 3 when not

$WEIR_VAR_DIR/run/supervisor.pid holds the running supervisor's pid and is flocked while it
runs: a second start is refused, and a stale file (after kill -9) is recognized as such.
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import http.client
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from django.core.exceptions import ImproperlyConfigured

from appliance import front
from appliance.env import (
    UNIX_PEER,
    celery_queues,
    env_int,
    redis_prefix,
    redis_url,
    token_max_in_flight,
    trusted_proxies,
    var_dir,
)
from appliance.env import front as front_kind
from scripts.log_rotation import Rotation, rotate_reopened
from scripts.log_writer import LogWriter, Written

ROOT = Path(__file__).resolve().parent.parent
LOCAL_HOSTS = ("127.0.0.1", "localhost")
HEALTH_TIMEOUT_S = 60.0
REDIS_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 20.0
OUTPUT_DRAIN_S = 5.0  # how long an exited child's last lines may take to reach its log
# gunicorn's default shape, chosen by bench/http_small.py's sweep (bench/README.md): a
# produce request spends most of its time waiting for its fsync, so the threads waiting
# at once decide how many requests one group commit carries
WEB_WORKERS = 2
WEB_THREADS = 8
READY = "weir-supervisor: ready"  # the detached supervisor's last line to its starter
# Lines the foreground view leaves out (the log files keep them), several a second: beat
# sending its dispatchers every tick, the worker's receipt of each task, and the runs of
# the dispatchers and samplers (they return counts) or of per-channel tasks that found
# nothing due (appliance/tasks.py). Shown: per-channel work done, failures, all else.
ROUTINE = re.compile(r"Scheduler: Sending due task |\] received$|"
                     r"\] succeeded in [0-9.e-]+s: ([0-9]+|None|'nothing due')$")
NOT_RUNNING = 3  # --status exit code when not running (as LSB init scripts)
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


class Stop(Exception):
    """A stop was asked for (SIGINT, SIGTERM or SIGHUP)."""


class Failed(Exception):
    """Start-up failed or a process exited: the message says which and why."""


def emit(text: str) -> None:
    """Print and flush; should the reader go away (a closed pipe), carry on without it."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def say(message: str) -> None:
    """Print one line of the supervisor's own."""
    emit(f"weir: {message}")


@dataclass(frozen=True)
class Config:
    """What the environment asks for."""

    var_dir: Path
    redis_url: str
    bind: str
    web_workers: int
    task_workers: int
    queues: tuple[str, str, str]  # (default, exports, kafka): appliance.env.celery_queues()
    front: str = "nginx"  # or "none": WEIR_FRONT
    max_in_flight: int = 4  # per token, at the front: WEIR_TOKEN_MAX_IN_FLIGHT
    trusted_proxies: tuple[str, ...] = (UNIX_PEER,)  # WEIR_TRUSTED_PROXIES
    rotation: Rotation = Rotation()  # WEIR_LOG_MAX_BYTES, WEIR_LOG_BACKUPS
    web_threads: int = WEB_THREADS  # gunicorn threads a web worker: WEIR_WEB_THREADS

    @classmethod
    def from_env(cls) -> Config:
        """Read the environment; Failed on a bad value."""
        bind = os.environ.get("WEIR_BIND") or "127.0.0.1:8000"
        host, _, port = bind.rpartition(":")
        if not host or not port.isdigit():
            raise Failed(f"WEIR_BIND must be HOST:PORT, not {bind!r}")
        try:
            var, queues = var_dir(), celery_queues()
            kind, max_in_flight = front_kind(), token_max_in_flight()
            proxies = tuple(trusted_proxies())
            rotation = Rotation(env_int("WEIR_LOG_MAX_BYTES", Rotation.max_bytes, 1024, 2**40),
                                env_int("WEIR_LOG_BACKUPS", Rotation.backups, 1, 1000))
        except ImproperlyConfigured as exc:
            raise Failed(str(exc)) from exc
        return cls(var, redis_url(), bind,
                   _count("WEIR_WEB_WORKERS", WEB_WORKERS), _count("WEIR_TASK_WORKERS", 2),
                   queues, kind, max_in_flight, proxies, rotation,
                   web_threads=_count("WEIR_WEB_THREADS", WEB_THREADS))

    @property
    def url(self) -> str:
        """Where the web server answers (a wildcard bind is asked on 127.0.0.1)."""
        host, _, port = self.bind.rpartition(":")
        if host in ("0.0.0.0", "[::]", "::"):
            host = "127.0.0.1"
        return f"http://{host}:{port}"

    @property
    def pid_file(self) -> Path:
        """The running supervisor's pid, flocked while it runs."""
        return self.var_dir / "run" / "supervisor.pid"

    def log(self, name: str) -> Path:
        """The log file of the process `name`."""
        return self.var_dir / "log" / f"{name}.log"

    @property
    def web_socket(self) -> Path:
        """gunicorn's unix socket behind the front, in a directory only we may enter."""
        return self.var_dir / "run" / "web" / "web.sock"


def _count(name: str, default: int) -> int:
    raw = os.environ.get(name) or str(default)
    if not raw.isdigit() or int(raw) < 1:
        raise Failed(f"{name} must be a whole number of at least 1, not {raw!r}")
    return int(raw)


def masked(url: str) -> str:
    """`url` with its password (if any) shown as ***, fit for a log."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}***@{host}").geturl()


def redis_error(url: str) -> str | None:
    """None when a Redis answers PING at `url`, else why not."""
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2) as client:
            client.ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__
    return None


def private_redis_needed(url: str) -> bool:
    """True when nothing answers at `url` and it names this machine."""
    parts = urlsplit(url)
    return parts.scheme == "redis" and parts.hostname in LOCAL_HOSTS and bool(redis_error(url))


def missing_packages(config: Config) -> list[str]:
    """The Debian packages starting needs and this machine lacks (scripts/run.sh installs
    them): nginx for the front, redis-server when a private Redis must be started."""
    missing = []
    if config.front == "nginx" and front.nginx_binary() is None:
        missing.append("nginx")
    if shutil.which("redis-server") is None and private_redis_needed(config.redis_url):
        missing.append("redis-server")
    return missing


def http_ok(url: str) -> bool:
    """True when GET `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except (OSError, http.client.HTTPException):
        return False


def unix_socket_answers(path: Path) -> bool:
    """True when something accepts connections on the unix socket `path`."""
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def _label(name: str) -> str:
    return f"[{name}]".ljust(10)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _open_log(path: Path) -> int:
    """An fd appending to the log `path`; Failed when it cannot be opened."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise Failed(f"cannot open the log {path}: {exc.strerror or exc}") from exc


def _tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log, indented, for an error message."""
    try:
        text = path.read_bytes()[-16384:].decode(errors="replace")
    except OSError:
        return "    (no log)"
    return "\n".join(f"    {line}" for line in text.splitlines()[-lines:])


@dataclass
class Child:
    """One long-running process, leader of its own process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    output: Written  # set once the log writer has written its last line to `log`

    def exited(self) -> int | None:
        """Its exit code once it has exited, else None."""
        return self.popen.poll()

    def group_alive(self) -> bool:
        """True while any process of its group is left."""
        self.popen.poll()  # reaps the leader
        try:
            os.killpg(self.popen.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def signal(self, signum: int) -> None:
        """Send `signum` to its whole process group."""
        try:
            os.killpg(self.popen.pid, signum)
        except ProcessLookupError:
            pass


class LogTail:
    """Prints the children's lines, each prefixed with the child's name: the log writer's
    lines arrive in LogWriter's thread (put) and wait in a bounded queue for pump() in the
    main thread. Should the terminal fall behind, lines past QUEUE_MAX are dropped and
    counted (the logs keep them): the writer never waits for the view."""

    COLORS = (36, 33, 35, 32, 34)
    QUEUE_MAX = 10000

    def __init__(self) -> None:
        self.lines: queue.Queue[tuple[str, bytes]] = queue.Queue(self.QUEUE_MAX)
        self.prefixes: dict[str, str] = {}
        self.unshown = 0  # lines dropped since the last pump (here or by the writer)
        self.lock = threading.Lock()
        self.color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")

    def add(self, name: str) -> None:
        """Show the lines of the child `name` from now on."""
        prefix = _label(name)
        if self.color:
            color = self.COLORS[len(self.prefixes) % len(self.COLORS)]
            prefix = f"\033[{color}m{prefix}\033[0m"
        self.prefixes[name] = prefix

    def put(self, name: str, line: bytes) -> None:
        """A line of `name` to show (dropped and counted when the queue is full)."""
        try:
            self.lines.put_nowait((name, line))
        except queue.Full:
            self.dropped(1)

    def dropped(self, count: int) -> None:
        """`count` lines will not be shown."""
        with self.lock:
            self.unshown += count

    def pump(self) -> None:
        """Print every line handed over so far but the routine ones."""
        shown = []
        for _ in range(self.QUEUE_MAX):  # no longer than a full queue, however fast they come
            try:
                name, raw = self.lines.get_nowait()
            except queue.Empty:
                break
            line = raw.decode(errors="replace").rstrip("\r\n")
            if not ROUTINE.search(line):
                shown.append(self.prefixes.get(name, _label(name)) + line)
        with self.lock:
            unshown, self.unshown = self.unshown, 0
        if unshown:
            shown.append(f"weir: {unshown} lines not shown (the terminal was behind); "
                         "the logs have them")
        if shown:
            emit("\n".join(shown))


class Supervisor:
    """Starts, watches and stops the appliance's processes."""

    def __init__(self, config: Config, follow: bool,
                 env: dict[str, str] | None = None) -> None:
        self.config = config
        self.env = env  # the children's environment (None: this process's)
        self.children: list[Child] = []  # in start order; redis first when private
        self.tail = LogTail() if follow else None
        self.logs: LogWriter | None = None  # started with the first child
        self.own_log: Path | None = None  # supervisor.log once detached (stdout, stderr)
        self.stopping = False
        self.hurry = False  # a second Ctrl-C: kill what is left now

    # -- start ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start everything; return once web answers /health (else Failed or Stop)."""
        for sub in ("log", "run", "redis"):
            (self.config.var_dir / sub).mkdir(parents=True, exist_ok=True)
        self._ensure_redis()
        self._manage("migrate", "migrate", "--noinput")
        self._manage("admin", "ensure_admin")
        self.start_web()
        python, var = sys.executable, self.config.var_dir
        default_queue, export_queue, kafka_queue = self.config.queues
        self._spawn("worker", self._worker("worker", default_queue, self.config.task_workers))
        self._spawn("exports", self._worker("exports", export_queue, 1))
        self._spawn("kafka", self._worker("kafka", kafka_queue, 1))
        self._spawn("beat", [python, "-m", "celery", "-A", "appliance", "beat",
                             "--loglevel", "INFO",
                             "--schedule", str(var / "celerybeat-schedule")])

    def start_web(self) -> None:
        """Start gunicorn and the front before it; return once /health answers through it."""
        config = self.config
        for sub in ("log", "run"):
            (config.var_dir / sub).mkdir(parents=True, exist_ok=True)
        bind = self._web_bind()
        tcp_proxies = ",".join(p for p in config.trusted_proxies if p != UNIX_PEER)
        self._spawn("web", [sys.executable, "-m", "gunicorn", "appliance.wsgi", "--bind", bind,
                            "--workers", str(config.web_workers),
                            "--threads", str(config.web_threads),
                            "--access-logfile", "-", "--error-logfile", "-",
                            # X-Forwarded-Proto only from the front, as appliance/proxy.py
                            "--forwarded-allow-ips", tcp_proxies,
                            # its own, not the one shared default (~/.gunicorn/gunicorn.ctl)
                            "--control-socket", str(config.var_dir / "run" / "gunicorn.ctl")])
        if config.front == "nginx":
            self._wait_for("gunicorn listens on its socket", HEALTH_TIMEOUT_S,
                           lambda: unix_socket_answers(config.web_socket))
            self._spawn("nginx", [sys.executable, "-m", "appliance.front",
                                  "--listen", config.bind, "--upstream", bind,
                                  "--dir", str(config.var_dir / "front"),
                                  "--access-log", str(config.log("nginx-access")),
                                  "--max-in-flight", str(config.max_in_flight)])
        self._wait_for("Weir answers on /health", HEALTH_TIMEOUT_S,
                       lambda: http_ok(f"{config.url}/health"))

    def _web_bind(self) -> str:
        """Where gunicorn listens: its socket behind nginx, else WEIR_BIND (Failed when
        nginx is asked for but not installed: no silent fallback to no front)."""
        config = self.config
        if config.front != "nginx":
            say(f"WEIR_FRONT={config.front}: gunicorn serves {config.bind} itself — no defence "
                "against slow clients and no per-token limit unless a front of your own "
                "provides them")
            return config.bind
        if front.nginx_binary() is None:
            raise Failed("nginx is not installed: it is the front that keeps slow clients "
                         "from holding gunicorn's threads (scripts/run.sh installs Debian's "
                         "package: apt-get install nginx). WEIR_FRONT=none serves gunicorn "
                         "directly, without that defence.")
        threads = config.web_threads * config.web_workers
        if config.max_in_flight >= threads:
            say(f"note: WEIR_TOKEN_MAX_IN_FLIGHT={config.max_in_flight} lets one token hold "
                f"all {threads} web threads")
        config.web_socket.parent.mkdir(mode=0o700, exist_ok=True)
        config.web_socket.parent.chmod(0o700)  # only this user reaches gunicorn: no bypass
        return f"unix:{config.web_socket}"

    @staticmethod
    def _worker(name: str, queue: str, concurrency: int) -> list[str]:
        """A Celery worker's command line: its own node name (two share a host)."""
        return [sys.executable, "-m", "celery", "-A", "appliance", "worker", "--loglevel",
                "INFO", "-n", f"{name}@%h", "--queues", queue,
                "--concurrency", str(concurrency)]

    def _ensure_redis(self) -> None:
        url = self.config.redis_url
        why = redis_error(url)
        say(f"Redis: {masked(url)}, this appliance's keys under {self._prefix()}: "
            f"(its queues {', '.join(self.config.queues)})")
        if why is None:
            return
        parts = urlsplit(url)
        if parts.scheme != "redis" or parts.hostname not in LOCAL_HOSTS:
            raise Failed(f"no Redis answers at REDIS_URL={masked(url)} ({why}); start it, "
                         "or point "
                         "REDIS_URL at 127.0.0.1 to have a private one started here")
        if parts.password:
            raise Failed(f"no Redis answers at REDIS_URL={masked(url)} ({why}); a private "
                         "one is "
                         "started only for a URL without a password")
        binary = shutil.which("redis-server")
        if binary is None:
            raise Failed(f"no Redis answers at {url} and redis-server is not installed "
                         "(scripts/run.sh installs it: apt-get install redis-server)")
        port = str(parts.port or 6379)
        say(f"no Redis answers at {url}: starting a private redis-server on port {port}")
        self._spawn("redis", [binary, "--port", port, "--bind", "127.0.0.1",
                              "--dir", str(self.config.var_dir / "redis"),
                              "--appendonly", "yes", "--save", ""])
        self._wait_for("redis-server answers PING", REDIS_TIMEOUT_S,
                       lambda: redis_error(url) is None)

    def _manage(self, label: str, *args: str) -> None:
        """Run a manage.py command to its end, showing its output (not logged to a file)."""
        done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT,
                              env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace")
        for line in done.stdout.splitlines():
            emit(f"{_label(label)}{line}")
        if done.returncode != 0:
            raise Failed(f"manage.py {args[0]} failed (exit code {done.returncode}); its "
                         "output is above")

    def _prefix(self) -> str:
        """The appliance's Redis prefix (appliance/env.py: WEIR_REDIS_PREFIX, else the id
        kept in the var dir, made here before any child reads it)."""
        try:
            return redis_prefix(self.config.var_dir)
        except ImproperlyConfigured as exc:
            raise Failed(str(exc)) from exc

    def _spawn(self, name: str, argv: list[str]) -> None:
        """Start a child in a session of its own, its output piped to the log writer, which
        writes its rotated log. The log is opened and handed over first: a child whose
        output has nowhere to go is never started."""
        log = self.config.log(name)
        log_fd = _open_log(log)
        reader, writer = os.pipe()
        try:
            if self.tail is not None:
                self.tail.add(name)
            try:
                output = self._log_writer().add(name, log, reader, log_fd)
            except OSError as exc:
                raise Failed(f"the log writer is gone ({exc}); see "
                             f"{self.config.log('supervisor')}") from exc
            # Spawned from the main thread: PR_SET_PDEATHSIG fires when the thread that
            # forked the child ends, so never from another thread.
            popen = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=writer, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        finally:  # the writer has its own copies; should the child not start, it sees EOF
            for fd in (log_fd, reader, writer):
                os.close(fd)
        self.children.append(Child(name, popen, log, output))

    def _log_writer(self) -> LogWriter:
        """The log writer process (scripts/log_writer.py), started at the first call; its
        own errors go to supervisor.log."""
        if self.logs is None:
            output = _open_log(self.config.log("supervisor"))
            try:
                tail = self.tail
                self.logs = LogWriter(self.config.rotation, output,
                                      tail.put if tail is not None else None,
                                      tail.dropped if tail is not None else None)
            except OSError as exc:
                raise Failed(f"cannot start the log writer: {exc}") from exc
            finally:
                os.close(output)
        return self.logs

    def _wait_for(self, what: str, timeout_s: float, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            self._check_children(f"before {what}")
            if time.monotonic() > deadline:
                raise Failed(f"waited {timeout_s:.0f} s in vain until {what}; "
                             f"see the logs in {self.config.var_dir / 'log'}")
            self._pump()
            time.sleep(0.2)
        self._pump()

    # -- run ------------------------------------------------------------------------------
    def watch(self) -> None:
        """Show the logs (when following) until a stop is asked for or a process exits;
        rotate nginx's access log (written by nginx itself) when it is full."""
        while True:
            self._check_children("")
            self._pump()
            self.rotate_reopened_logs()
            time.sleep(0.2)

    def rotate_reopened_logs(self) -> None:
        """Rotate the full logs whose writers keep them open: nginx's access log and, when
        detached, supervisor.log (the log writer's own rare errors stay in the old file)."""
        nginx = [child for child in self.children if child.name == "nginx"]
        if nginx:  # SIGUSR1: nginx's master reopens its log files (logrotate's postrotate)
            rotate_reopened(self.config.log("nginx-access"), self.config.rotation,
                            lambda: os.kill(nginx[0].popen.pid, signal.SIGUSR1))
        own = self.own_log
        if own is not None:
            rotate_reopened(own, self.config.rotation, lambda: _detach_output(own))

    def _check_children(self, when: str) -> None:
        if self.logs is not None and self.logs.process.poll() is not None:
            raise Failed(f"the log writer exited {when or 'unexpectedly'} (exit code "
                         f"{self.logs.process.returncode}); see {self.config.log('supervisor')}")
        for child in self.children:
            code = child.exited()
            if code is not None:
                child.output.join(OUTPUT_DRAIN_S)
                self._pump()
                message = f"{child.name} exited {when or 'unexpectedly'} (exit code {code})"
                if self.tail is None:
                    message += f"; the end of {child.log}:\n{_tail(child.log)}"
                raise Failed(message)

    def _pump(self) -> None:
        if self.tail is not None:
            self.tail.pump()

    # -- stop -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every process started (redis last): SIGTERM, then SIGKILL after a while."""
        self.stopping = True
        redis_child = [c for c in self.children if c.name == "redis"]
        self._stop_group([c for c in self.children if c.name != "redis"])
        self._stop_group(redis_child)
        deadline = time.monotonic() + OUTPUT_DRAIN_S  # one for all: their last lines
        for child in self.children:
            child.output.join(max(0.0, deadline - time.monotonic()))
        if self.logs is not None:  # it exits once the pipes it has are done
            self.logs.close(max(0.0, deadline - time.monotonic()))
        self._pump()

    def _stop_group(self, children: list[Child]) -> None:
        running = [c for c in children if c.group_alive()]
        if not running:
            return
        say(f"stopping {', '.join(c.name for c in running)}")
        for child in running:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(c.group_alive() for c in running):
            if self.hurry or time.monotonic() > deadline:
                for child in running:
                    if child.group_alive():
                        say(f"{child.name} is still running: killing it (SIGKILL)")
                        child.signal(signal.SIGKILL)
                break
            self._pump()
            time.sleep(0.1)
        for child in running:
            child.popen.wait()

    def on_signal(self, signum: int, frame: Any) -> None:
        """SIGINT/SIGTERM/SIGHUP: stop (a second one while stopping: kill what is left)."""
        if self.stopping:
            self.hurry = True
            return
        self.stopping = True
        raise Stop(signal.Signals(signum).name)


# -- the pid file -------------------------------------------------------------------------
def _lock(path: Path) -> int | None:
    """Take the run lock (the pid file, flocked); None when a running supervisor holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd  # not removed by a supervisor that stopped meanwhile
        except FileNotFoundError:
            pass
        os.close(fd)


def _unlock(path: Path, fd: int) -> None:
    """Remove the pid file (while still holding its lock), then release the lock."""
    try:
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            path.unlink()
    except FileNotFoundError:
        pass
    os.close(fd)


def _remove_stale(path: Path) -> None:
    """Remove a pid file no supervisor holds (one killed with SIGKILL leaves it)."""
    if path.exists():
        fd = _lock(path)
        if fd is not None:
            _unlock(path, fd)


def running_pid(config: Config) -> int | None:
    """The running supervisor's pid, or None when none runs."""
    try:
        fd = os.open(config.pid_file, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: it runs
            for _ in range(50):  # the pid is written just after the lock is taken
                text = os.pread(fd, 32, 0).decode().strip()
                if text.isdigit():
                    return int(text)
                time.sleep(0.01)
            return -1
        return None
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


# -- the commands -------------------------------------------------------------------------
def serve(config: Config, detached: bool) -> int:
    """Start and supervise, in the foreground or as the detached supervisor."""
    config.pid_file.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock(config.pid_file)
    if lock is None:
        say(f"Weir is already running (supervisor pid {running_pid(config)}); "
            "`scripts/run.sh --stop` stops it")
        return 1
    os.ftruncate(lock, 0)
    os.write(lock, f"{os.getpid()}\n".encode())
    supervisor = Supervisor(config, follow=not detached)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, supervisor.on_signal)
    code = 0
    try:
        supervisor.start()
        if detached:
            say(f"Weir is running at {config.url}/ (admin: /admin/, API docs: /api/docs/) "
                f"in the background, supervisor pid {os.getpid()}")
            say(f"logs: {config.var_dir / 'log'}/"
                "{web,nginx,worker,exports,kafka,beat,redis,supervisor}.log; "
                "`scripts/run.sh --stop` stops it")
            emit(READY)
            _detach_output(config.log("supervisor"))
            supervisor.own_log = config.log("supervisor")
            say(f"running (pid {os.getpid()})")
        else:
            say(f"Weir is running at {config.url}/ (admin: /admin/, API docs: /api/docs/) "
                "— Ctrl-C stops it")
            say(f"logs: {config.var_dir / 'log'}; shown below without the scheduler's "
                "routine ticks")
        supervisor.watch()
    except Stop as stop:
        say(f"{stop}: stopping")
    except Failed as failed:
        say(str(failed))
        code = 1
    finally:
        supervisor.stopping = True
        supervisor.stop()
        _unlock(config.pid_file, lock)
        if supervisor.children:
            say("stopped" if code == 0 else "stopped after a failure")
    return code


def _detach_output(log: Path) -> None:
    """From now on the detached supervisor writes to its own log, not its starter's pipe."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def start_background(config: Config) -> int:
    """Start a detached supervisor, show its start-up output, return once it is healthy."""
    pid = running_pid(config)
    if pid is not None:
        say(f"Weir is already running (supervisor pid {pid}); `scripts/run.sh --stop` stops it")
        return 1
    daemon = subprocess.Popen([sys.executable, "-m", "scripts.supervisor", "--detached"],
                              cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    assert daemon.stdout is not None
    try:
        for raw in daemon.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line == READY:
                return 0
            print(line, flush=True)
    except KeyboardInterrupt:
        daemon.terminate()  # it stops what it started, then exits
        for raw in daemon.stdout:
            print(raw.decode(errors="replace").rstrip("\n"), flush=True)
    return daemon.wait() or 1


def stop_running(config: Config) -> int:
    """SIGTERM the running supervisor and wait until it (and so all it started) is gone."""
    pid = running_pid(config)
    if pid is None:
        _remove_stale(config.pid_file)
        say("Weir is not running")
        return 0
    if pid < 0:
        say(f"{config.pid_file} is locked but holds no pid; not stopping anything")
        return 1
    say(f"stopping Weir (supervisor pid {pid})")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 2 * STOP_TIMEOUT_S + 15
    while _alive(pid):
        if time.monotonic() > deadline:
            say(f"supervisor pid {pid} did not stop in time: killing it (its processes get "
                "SIGTERM from the kernel)")
            os.kill(pid, signal.SIGKILL)
            return 1
        time.sleep(0.1)
    _remove_stale(config.pid_file)
    say("Weir stopped")
    return 0


def status(config: Config) -> int:
    """Say whether Weir runs: exit 0 when it does, NOT_RUNNING when not."""
    pid = running_pid(config)
    if pid is None:
        say(f"Weir is not running (var dir {config.var_dir})")
        return NOT_RUNNING
    say(f"Weir is running (supervisor pid {pid}) at {config.url}/; logs in "
        f"{config.var_dir / 'log'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line: scripts/run.sh passes its arguments here."""
    parser = argparse.ArgumentParser(prog="scripts/run.sh", description=(
        "Run the Weir appliance: Redis (when none answers at REDIS_URL), migrations, an "
        "admin user, gunicorn, Celery workers (tasks, exports, Kafka sink) and beat. Without "
        "a flag it runs in the foreground and shows the logs; Ctrl-C stops it."))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--background", action="store_true",
                      help="start in the background; return once healthy")
    mode.add_argument("--stop", action="store_true", help="stop the running appliance")
    mode.add_argument("--status", action="store_true",
                      help="exit 0 when running, 3 when not")
    mode.add_argument("--detached", action="store_true", help=argparse.SUPPRESS)
    mode.add_argument("--missing-packages", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        config = Config.from_env()
    except Failed as exc:
        say(str(exc))
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")
    os.environ["WEIR_VAR_DIR"] = str(config.var_dir)  # every process uses the same one
    if args.missing_packages:
        print(" ".join(missing_packages(config)))
        return 0
    if args.stop:
        return stop_running(config)
    if args.status:
        return status(config)
    if args.background:
        return start_background(config)
    return serve(config, detached=args.detached)


if __name__ == "__main__":
    sys.exit(main())

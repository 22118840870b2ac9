"""Read settings from the environment through small validated helpers.

A bad value fails loudly at start (ImproperlyConfigured) instead of later.
"""
import ipaddress
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_HTTP_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")
_REDIS_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,64}")
# The largest produce request body: Django's own limit and the front's client_max_body_size.
MAX_PRODUCE_BYTES = 64 * 1024 * 1024
FRONTS = ("nginx", "none")
REPO = Path(__file__).resolve().parent.parent
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
UNIX_PEER = "unix"  # in WEIR_TRUSTED_PROXIES: a peer on gunicorn's unix socket


def env_bool(name: str, default: bool) -> bool:
    """Return the environment variable `name` as a boolean."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, not {raw!r}")


def env_list(name: str, default: list[str]) -> list[str]:
    """Return a comma-separated environment variable as a list of strings."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_float(name: str, default: float, low: float, high: float) -> float:
    """Return the environment variable `name` as a number in [low, high]."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, not {raw!r}") from None
    if not low <= value <= high:
        raise ImproperlyConfigured(f"{name} must be between {low} and {high}, not {raw!r}")
    return value


def env_int(name: str, default: int, low: int, high: int) -> int:
    """Return the environment variable `name` as a whole number in [low, high]."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    if not raw.strip().isdigit() or not low <= int(raw) <= high:
        raise ImproperlyConfigured(f"{name} must be a whole number between {low} and {high}, "
                                   f"not {raw!r}")
    return int(raw)


def env_path(name: str, default: Path) -> Path:
    """Return the environment variable `name` as an absolute path."""
    raw = os.environ.get(name)
    path = Path(raw) if raw else default
    if not path.is_absolute():
        raise ImproperlyConfigured(f"{name} must be an absolute path, not {raw!r}")
    return path


def var_dir() -> Path:
    """WEIR_VAR_DIR: the appliance's data, logs, keys and database (default: var/ in the
    repo); the one default scripts/run.sh, its supervisor and every process share."""
    return env_path("WEIR_VAR_DIR", REPO / "var")


def redis_url() -> str:
    """REDIS_URL: Celery's broker and the shared cache (default: a Redis on this host)."""
    return os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL


def env_http_url(name: str) -> str:
    """Return the environment variable `name` as an http(s):// URL without a trailing
    slash (a base URL: no query or fragment); "" when unset or empty."""
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return ""
    if not _HTTP_URL.fullmatch(raw):
        raise ImproperlyConfigured(f"{name} must be an http:// or https:// base URL such as "
                                   f"http://appliance.example:8000, not {raw!r}")
    return raw.rstrip("/")


def secret_key(var_dir: Path) -> str:
    """Return SECRET_KEY from the environment, else one generated once and kept in var_dir."""
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    return kept_in(var_dir, "secret_key", lambda: secrets.token_urlsafe(50))


def redis_prefix(var_dir: Path) -> str:
    """WEIR_REDIS_PREFIX: what every key this appliance keeps in Redis starts with.

    The one description of the prefix (settings.py, the supervisor, docker-compose.yml and
    the README point here). Default weir-<appliance id>, the id made once and kept in
    var_dir/appliance_id; every process of one appliance shares its var dir (docker-compose:
    the weir-var volume, made by migrate, which runs first), so its id. Under it: Celery's
    queues and bindings (kombu's global_keyprefix; the queue names stay what
    WEIR_CELERY_QUEUE and the others say), Celery's results, and the cache (KEY_PREFIX, with
    WEIR_CACHE_PREFIX nested under it: cache_prefix), so every raw key made with
    cache.make_key: task locks, due keys, throttle counters. Two
    appliances on one Redis database (each its own var dir) then never share a queue or a
    key, even with the same queue names. Not under it: kombu 5.7 sends EXISTS unprefixed,
    so a passive queue declare (queue_declare(passive=True)) looks for the bare queue name
    (the appliance makes none; a tool that does sees no queue, or an old one left behind);
    the lengths it reports (LLEN) are prefixed. README's "Upgrading to the prefix" says what
    an upgrade leaves behind."""
    raw = (os.environ.get("WEIR_REDIS_PREFIX") or "").strip()
    if not raw:
        return "weir-" + kept_in(var_dir, "appliance_id", lambda: secrets.token_hex(6))
    if not _REDIS_PREFIX.fullmatch(raw):
        raise ImproperlyConfigured(f"WEIR_REDIS_PREFIX must be 1 to 64 letters, digits, "
                                   f"'.', '_' or '-', not {raw!r}")
    return raw


def cache_prefix(appliance_prefix: str) -> str:
    """The cache's KEY_PREFIX: the appliance's prefix, with WEIR_CACHE_PREFIX (where set)
    nested under it, never in its place: locks, due keys and throttle counters are cache
    keys (cache.make_key) and must stay under the appliance's prefix."""
    extra = (os.environ.get("WEIR_CACHE_PREFIX") or "").strip()
    return f"{appliance_prefix}:{extra}" if extra else appliance_prefix


def kept_in(var_dir: Path, name: str, make: Callable[[], str]) -> str:
    """The text of var_dir/name, written once with make() when the file is missing."""
    kept = var_dir / name
    if not kept.exists():
        var_dir.mkdir(parents=True, exist_ok=True)
        # Written whole under a name of its own, then linked in: of processes starting
        # at once on a new var dir (parallel test workers, gunicorn's), the first link wins
        # and none reads a half-written file.
        mine = var_dir / f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, make().encode())
        finally:
            os.close(fd)
        try:
            os.link(mine, kept)
        except FileExistsError:
            pass
        finally:
            mine.unlink()
    return kept.read_text().strip()


def private_dir(name: str, path: Path) -> Path:
    """The directory `path` (setting `name`), created 0700 when missing; ImproperlyConfigured
    when it is not a directory of this user closed to group and others."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ImproperlyConfigured(f"{name} {path}: cannot be created "
                                   f"({exc.strerror or exc})") from exc
    problem = private_dir_problem(path)
    if problem:
        raise ImproperlyConfigured(f"{name} {path}: {problem}")
    return path


def private_dir_problem(path: Path) -> str | None:
    """Why `path` is not a private directory of this process's user (None: it is one)."""
    try:
        info = path.stat()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.geteuid():
        return (f"is owned by uid {info.st_uid}, not by the appliance's user "
                f"(uid {os.geteuid()})")
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return (f"group or others may access it (mode {stat.S_IMODE(info.st_mode):04o}; "
                "chmod 700)")
    return None


def env_paths(name: str, default: list[Path]) -> list[Path]:
    """Return a comma-separated environment variable of absolute paths."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    paths = [Path(item.strip()) for item in raw.split(",") if item.strip()]
    for path in paths:
        if not path.is_absolute():
            raise ImproperlyConfigured(f"{name} must list absolute paths, not {str(path)!r}")
    if not paths:
        raise ImproperlyConfigured(f"{name} must list at least one absolute path")
    return paths


def celery_queues() -> tuple[str, str, str]:
    """The Celery queues (default, exports, Kafka sink): WEIR_CELERY_QUEUE (weir),
    WEIR_EXPORT_QUEUE (<default>-export) and WEIR_KAFKA_QUEUE (<default>-kafka), which must
    all differ: a flush never waits behind an export or a Kafka run, nor a Kafka run
    behind an export."""
    default = (os.environ.get("WEIR_CELERY_QUEUE") or "weir").strip()
    export = (os.environ.get("WEIR_EXPORT_QUEUE") or f"{default}-export").strip()
    kafka = (os.environ.get("WEIR_KAFKA_QUEUE") or f"{default}-kafka").strip()
    if export == default:
        raise ImproperlyConfigured(f"WEIR_EXPORT_QUEUE must differ from WEIR_CELERY_QUEUE "
                                   f"({default!r}): exports get a worker of their own")
    if kafka in (default, export):
        raise ImproperlyConfigured(f"WEIR_KAFKA_QUEUE ({kafka!r}) must differ from "
                                   "WEIR_CELERY_QUEUE and WEIR_EXPORT_QUEUE: the Kafka sink "
                                   "gets a worker of its own")
    return default, export, kafka


def database(var_dir: Path) -> dict[str, object]:
    """DATABASES["default"]: DATABASE_URL (PostgreSQL), else SQLite in the var dir."""
    raw = os.environ.get("DATABASE_URL")
    if not raw:
        # WAL lets the web workers read while a Celery worker writes; IMMEDIATE takes the
        # write lock at BEGIN so a writer waits out `timeout` instead of failing on upgrade.
        # Tests use a file too: Django's in-memory test database is a shared-cache one,
        # where a worker thread's write fails at once with "table is locked".
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": var_dir / "weir.sqlite3",
                "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE",
                            "init_command": "PRAGMA journal_mode=WAL"},
                "TEST": {"NAME": var_dir / f"test-weir-{os.getpid()}.sqlite3"}}
    try:
        config = dict(dj_database_url.parse(raw, conn_max_age=60, conn_health_checks=True))
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a database URL Django knows: "
                                   f"{exc}") from exc
    if config.get("ENGINE") not in ("django.db.backends.postgresql",
                                    "django.db.backends.sqlite3"):
        raise ImproperlyConfigured(f"DATABASE_URL must be postgresql:// or sqlite://, "
                                   f"not {raw.split(':', 1)[0]}://")
    return config


def front() -> str:
    """WEIR_FRONT: what stands in front of gunicorn in scripts/run.sh — "nginx" (the
    default, appliance/front.py) or "none" (gunicorn serves WEIR_BIND itself: for a
    deployment that brings its own buffering front)."""
    value = (os.environ.get("WEIR_FRONT") or "nginx").strip().lower()
    if value not in FRONTS:
        raise ImproperlyConfigured(f"WEIR_FRONT must be one of {', '.join(FRONTS)}, "
                                   f"not {value!r}")
    return value


def token_max_in_flight() -> int:
    """WEIR_TOKEN_MAX_IN_FLIGHT: requests one API token may have in flight at once (the
    front answers more with 429); 0 turns the limit off."""
    return env_int("WEIR_TOKEN_MAX_IN_FLIGHT", 4, 0, 100_000)


def trusted_proxies() -> list[str]:
    """WEIR_TRUSTED_PROXIES: the peers whose X-Forwarded-For and X-Forwarded-Proto are
    believed — "unix" (a peer on gunicorn's unix socket: the front), IP addresses and
    networks. Default: "unix"."""
    entries = env_list("WEIR_TRUSTED_PROXIES", [UNIX_PEER])
    for entry in entries:
        if entry != UNIX_PEER:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ImproperlyConfigured(
                    f"WEIR_TRUSTED_PROXIES must list \"unix\", IP addresses or networks, "
                    f"not {entry!r}") from None
    return entries

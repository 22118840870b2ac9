"""The production docker-compose.yml, checked statically: Docker is not run here.

Checks that the file parses; every service names an image or a build; web, the two workers
and beat run the agreed commands; the workers consume the settings' two queues, one each
(exports never share a worker with flushes); the long-running services have health checks;
every `${VAR}` the file interpolates is listed (with a comment) in .env.example; web, the
workers and beat get every variable the settings need in production, and set none the
settings do not read (typos); DATABASE_URL and REDIS_URL point at the postgres and redis
services; web and both workers mount the same named volumes at the WEIR_DATA_ROOT paths,
which the image creates owned by its user; nginx (the front) is the only service clients
reach: web publishes no port and listens on a unix socket in a volume only nginx shares,
which nginx proxies to. The settings' variables are found by parsing appliance/settings.py
and appliance/env.py with `ast`.
"""
from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from django.test import override_settings

from scripts.supervisor import WEB_THREADS, WEB_WORKERS

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "Dockerfile"
SETTINGS_SOURCES = [ROOT / "appliance" / "settings.py", ROOT / "appliance" / "env.py"]

APPLIANCE = ("web", "worker", "export-worker", "beat")
WORKERS = ("worker", "export-worker")
COMMANDS = {
    # the shape scripts/run.sh runs by default (its WEIR_WEB_WORKERS, WEIR_WEB_THREADS)
    "web": f"gunicorn appliance.wsgi --bind unix:/run/weir/web.sock --workers {WEB_WORKERS}"
           f" --threads {WEB_THREADS} --access-logfile - --error-logfile -",
    "worker": "celery -A appliance worker --loglevel INFO --queues weir --concurrency 2",
    "export-worker": "celery -A appliance worker --loglevel INFO --queues weir-export"
                     " --concurrency 1",
    "beat": "celery -A appliance beat --loglevel INFO --schedule /var/lib/weir/celerybeat-schedule",
}
# Every long-running service; `migrate` is a one-shot that exits, so it has none.
NEEDS_HEALTHCHECK = ("redis", "postgres", "namenode", "datanode", "nginx", "web", "worker",
                     "export-worker", "kafka-worker", "beat")
# Read by the settings, with defaults that do not suit production: compose must set them.
REQUIRED_IN_PRODUCTION = {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS",
                          "WEIR_DATA_ROOT", "WEIR_VAR_DIR"}
# Read by the settings, with defaults that suit production. A variable the settings start
# reading must join one of these two sets: the test below fails until someone decides.
HAS_PRODUCTION_DEFAULT = {"DEBUG", "WEIR_API_RATE", "WEIR_CACHE_PREFIX", "WEIR_CELERY_QUEUE",
                          "WEIR_EXPORT_QUEUE", "WEIR_KAFKA_QUEUE",
                          # the export worker's warm Spark driver, on, idle for 15 minutes,
                          # replaced after 1000 exports
                          "WEIR_EXPORT_DRIVER", "WEIR_EXPORT_DRIVER_IDLE_S",
                          "WEIR_EXPORT_DRIVER_MAX_JOBS",
                          # empty: no Kafka sink unless a channel names its brokers
                          "WEIR_KAFKA_BOOTSTRAP", "WEIR_KAFKA_OFFSETS_TOPIC",
                          "WEIR_SCHEDULER_TICK_S", "WEIR_SAMPLE_INTERVAL_S",
                          "WEIR_TASK_RUNS_KEEP_HOURS", "WEIR_TASK_LOCK_WAIT_S",
                          "WEIR_EXPORT_URI", "WEIR_SPARK_MASTER", "WEIR_UI_REFRESH_S",
                          # <WEIR_VAR_DIR>/keys: on the weir-var volume, made 0700 at start
                          "WEIR_KEY_DIR",
                          # empty: executors read the shared disks, as compose's local Spark does
                          "WEIR_EXPORT_READ_URL",
                          # nginx before web (scripts/run.sh; compose runs its own nginx
                          # service), 4 per token, and "unix": the socket nginx reaches web on
                          "WEIR_FRONT", "WEIR_TOKEN_MAX_IN_FLIGHT", "WEIR_TRUSTED_PROXIES",
                          # the channel watcher's tick, Redis's request-path timeout and its
                          # breaker (appliance/shared_redis.py): tuned for any deployment
                          "WEIR_CHANNEL_WATCH_S", "WEIR_REDIS_TIMEOUT_S", "WEIR_REDIS_RETRY_S",
                          # weir-<the appliance id in WEIR_VAR_DIR>: the weir-var volume
                          # gives every service the same one
                          "WEIR_REDIS_PREFIX"}
# Set in the compose file although the settings do not read them (none now).
EXPORTER_VARS: set[str] = set()
ENV_HELPERS = {"env_bool", "env_list", "env_path", "env_paths", "env_float", "env_http_url",
               "env_int"}
HELPER_READS = {"secret_key": "SECRET_KEY", "database": "DATABASE_URL"}
INTERPOLATION = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


def settings_env_vars() -> set[str]:
    """Variables the settings read: os.environ.get("X"), os.environ["X"], env_*("X", ...),
    secret_key() and database()."""
    names = set()
    for source in SETTINGS_SOURCES:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                first = node.args[0] if node.args else None
                literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
                if literal and (func in ENV_HELPERS or func == "os.environ.get"):
                    names.add(first.value)
                if func in HELPER_READS:
                    names.add(HELPER_READS[func])
            elif (isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ"
                  and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
                names.add(node.slice.value)
    return names


def strings(node: object):
    """Every string value in the parsed file (compose interpolates values, not keys)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def interpolated(text: str) -> set[str]:
    return set(INTERPOLATION.findall(text.replace("$$", "")))  # $$ is a literal $


def resolve(text: str) -> str:
    """`${X:-default}` -> default, any other `${X...}` -> X (good enough to parse a URL)."""
    return re.sub(r"\$\{(\w+)(?::?-([^}]*)|:?\?[^}]*)?\}",
                  lambda m: m.group(2) if m.group(2) is not None else m.group(1), text)


def env_example() -> dict[str, int]:
    """Variable -> line number of each NAME=value line in .env.example."""
    lines = ENV_EXAMPLE.read_text().splitlines()
    return {m.group(1): n for n, line in enumerate(lines)
            if (m := re.match(r"([A-Za-z_][A-Za-z0-9_]*)=", line))}


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: str(value) for key, value in env.items()}


def mounts(service: dict) -> dict[str, str]:
    """Mount target -> source of a service's volumes (short or long syntax)."""
    result = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            result[volume["target"]] = volume.get("source", "")
        else:
            source, target = volume.split(":")[:2]
            result[target] = source
    return result


def data_roots(service: dict) -> list[str]:
    return [root.strip() for root in environment(service).get("WEIR_DATA_ROOT", "").split(",")
            if root.strip()]


def command(service: dict) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]


def test_every_service_names_an_image_or_a_build(services):
    assert set(NEEDS_HEALTHCHECK) <= set(services), (
        f"docker-compose.yml lacks services {sorted(set(NEEDS_HEALTHCHECK) - set(services))}")
    missing = [name for name, service in services.items()
               if not service.get("image") and not service.get("build")]
    assert not missing, f"services with neither image nor build: {missing}"


@pytest.mark.parametrize("name", APPLIANCE)
def test_appliance_commands(services, name):
    assert command(services[name]) == shlex.split(COMMANDS[name]), (
        f"{name} runs {command(services[name])}, not `{COMMANDS[name]}`")


@pytest.mark.parametrize("name", NEEDS_HEALTHCHECK)
def test_healthcheck(services, name):
    check = services[name].get("healthcheck") or {}
    test = check.get("test")
    assert test and not check.get("disable") and test != ["NONE"], (
        f"{name} has no health check (healthcheck.test is {test!r})")


def test_interpolated_variables_are_in_env_example(compose):
    used = set().union(*(interpolated(text) for text in strings(compose)))
    listed = env_example()
    assert used <= set(listed), (
        f".env.example does not list {sorted(used - set(listed))}, which docker-compose.yml "
        f"interpolates")
    assert set(listed) <= used, (
        f".env.example lists {sorted(set(listed) - used)}, which docker-compose.yml never uses")


def test_env_example_comments_every_variable():
    lines = ENV_EXAMPLE.read_text().splitlines()
    bare = [name for name, n in env_example().items()
            if n == 0 or not lines[n - 1].lstrip().startswith("#")]
    assert not bare, f".env.example has no comment line above {bare}"


def test_the_scan_knows_every_env_helper():
    tree = ast.parse((ROOT / "appliance" / "env.py").read_text())
    helpers = {node.name for node in tree.body
               if isinstance(node, ast.FunctionDef) and node.name.startswith("env_")}
    assert helpers <= ENV_HELPERS, (
        f"appliance/env.py defines {sorted(helpers - ENV_HELPERS)}: add them to ENV_HELPERS, "
        f"or the variables they read go unclassified")


def test_every_settings_variable_is_classified():
    read = settings_env_vars()
    missing = REQUIRED_IN_PRODUCTION - read
    assert not missing, (
        f"appliance settings no longer read {sorted(missing)}: the ast scan or "
        f"REQUIRED_IN_PRODUCTION is out of date")
    new = read - REQUIRED_IN_PRODUCTION - HAS_PRODUCTION_DEFAULT
    assert not new, (
        f"appliance settings read {sorted(new)}: add each to REQUIRED_IN_PRODUCTION (and set "
        f"it in docker-compose.yml) or, if its default suits production, to "
        f"HAS_PRODUCTION_DEFAULT")


@pytest.mark.parametrize("name", APPLIANCE)
def test_appliance_environment(services, name):
    env = environment(services[name])
    missing = REQUIRED_IN_PRODUCTION - set(env)
    assert not missing, f"{name} does not set {sorted(missing)} (no production default)"
    unknown = set(env) - settings_env_vars() - EXPORTER_VARS
    assert not unknown, (
        f"{name} sets {sorted(unknown)}, which appliance/settings.py never reads (a typo?)")


@pytest.mark.parametrize("name", APPLIANCE)
def test_urls_point_at_the_compose_services(services, name):
    env = environment(services[name])
    database = urlsplit(resolve(env["DATABASE_URL"]))
    assert database.scheme.startswith("postgres") and database.hostname == "postgres", (
        f"{name}'s DATABASE_URL {env['DATABASE_URL']!r} is not postgresql://...@postgres")
    redis = urlsplit(resolve(env["REDIS_URL"]))
    assert redis.scheme == "redis" and redis.hostname == "redis", (
        f"{name}'s REDIS_URL {env['REDIS_URL']!r} is not redis://redis...")


@pytest.mark.parametrize("name", ("migrate", *APPLIANCE, "kafka-worker"))
def test_every_appliance_service_shares_the_var_volume_so_one_redis_prefix(services, name):
    env = environment(services[name])
    assert "WEIR_REDIS_PREFIX" not in env  # the default: the id kept in the var dir
    assert mounts(services[name]).get(env["WEIR_VAR_DIR"]) == "weir-var", (
        f"{name} does not mount weir-var at WEIR_VAR_DIR: its Redis prefix would differ")


def queues(service: dict) -> set[str]:
    """The queues a worker's command consumes (--queues / -Q, comma-separated)."""
    argv = command(service)
    found: set[str] = set()
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag in ("--queues", "-Q"):
            found.update(value.split(","))
    return found


def test_each_worker_consumes_one_of_the_settings_queues(services, monkeypatch):
    from appliance.celery import app, route_task
    from appliance.env import celery_queues

    for name in ("WEIR_CELERY_QUEUE", "WEIR_EXPORT_QUEUE", "WEIR_KAFKA_QUEUE"):
        monkeypatch.delenv(name, raising=False)  # compose sets none: the defaults hold
    default, export, kafka = celery_queues()
    assert queues(services["worker"]) == {default}, f"worker must consume only {default!r}"
    assert queues(services["export-worker"]) == {export}, (
        f"export-worker must consume only {export!r}")
    assert queues(services["kafka-worker"]) == {kafka}, (
        f"kafka-worker must consume only {kafka!r}")
    with override_settings(WEIR_EXPORT_QUEUE=export, WEIR_KAFKA_QUEUE=kafka):
        routed = {(route_task(task, (), {}, {}) or {}).get("queue", default)
                  for task in app.tasks if task.startswith("weir.")}
    assert routed == {default, export, kafka}, f"tasks are routed to {routed}"


@pytest.mark.parametrize("worker", WORKERS)
def test_web_and_the_workers_share_the_data_volumes(compose, services, worker):
    roots = data_roots(services["web"])
    assert roots and data_roots(services[worker]) == roots, (
        f"web's WEIR_DATA_ROOT {roots} differs from {worker}'s {data_roots(services[worker])}")
    assert services["web"].get("user") == services[worker].get("user"), (
        f"web and {worker} run as different users: the channel owner socket accepts only "
        "its uid")
    named = set(compose.get("volumes") or {})
    for name in ("web", worker):
        data = {target: source for target, source in mounts(services[name]).items()
                if target in roots}
        assert sorted(data) == sorted(roots), (
            f"{name} mounts {sorted(data)} of the WEIR_DATA_ROOT entries {roots}")
        assert set(data.values()) <= named, (
            f"{name} mounts {sorted(set(data.values()) - named)} at a data root: not a named "
            f"volume declared under `volumes:`")
    web = {target: mounts(services["web"])[target] for target in roots}
    theirs = {target: mounts(services[worker])[target] for target in roots}
    assert web == theirs, f"web mounts {web} but {worker} mounts {theirs}"


@pytest.mark.parametrize("name", ("nginx", "web", *WORKERS))
def test_image_owns_the_mount_points(services, name):
    # A fresh named volume takes the owner of the image's directory; were it missing, the
    # volume would be root's and the image's non-root user could not write to it.
    chowned = " ".join(line for line in DOCKERFILE.read_text().splitlines() if "chown" in line)
    missing = [target for target in mounts(services[name]) if target not in chowned.split()]
    assert not missing, f"the Dockerfile does not create and chown {name}'s mounts {missing}"


def test_nginx_is_the_only_way_in_to_web(compose, services):
    """Clients reach nginx alone: web publishes nothing and listens on a unix socket whose
    volume only nginx shares; nginx runs appliance/front.py's config against that socket."""
    web, nginx = services["web"], services["nginx"]
    assert not web.get("ports") and not web.get("network_mode"), (
        "web must not publish a port: clients would bypass the front")
    bind = command(web)[command(web).index("--bind") + 1]
    assert bind.startswith("unix:"), f"web binds {bind}, not a unix socket"
    argv = command(nginx)
    assert argv[:3] == ["python", "-m", "appliance.front"], argv
    assert argv[argv.index("--upstream") + 1] == bind
    listen = argv[argv.index("--listen") + 1]
    published = [str(port).rsplit(":", 1)[-1] for port in nginx.get("ports") or []]
    assert published == [listen.rsplit(":", 1)[-1]], (nginx.get("ports"), listen)
    socket_dir = bind.removeprefix("unix:").rsplit("/", 1)[0]
    volume = mounts(web).get(socket_dir)
    assert volume and volume in (compose.get("volumes") or {}), (
        f"web's socket directory {socket_dir} is not a named volume")
    assert mounts(nginx).get(socket_dir) == volume
    sharing = sorted(name for name, service in services.items()
                     if volume in mounts(service).values())
    assert sharing == ["nginx", "web"], f"{volume} is mounted by {sharing}"
    assert nginx["depends_on"]["web"]["condition"] == "service_healthy"
    assert set(environment(nginx)) <= settings_env_vars(), (
        f"nginx sets {sorted(set(environment(nginx)) - settings_env_vars())}, which the "
        "settings never read (a typo?)")

"""Two appliances on one Redis database never mix: each keeps its keys under a prefix of
its own (WEIR_REDIS_PREFIX, else weir-<the id kept in its var dir>), so a task one sends
runs only on its own workers, even on queues of the same name, and no key of one is a key
of the other. Checked with real Celery workers (processes of their own, one per appliance,
both consuming the queue `weir`) on a Redis database no other test uses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from polling import wait_for

from appliance.celery import app
from appliance.env import redis_prefix

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent  # whoami_app: the appliance's app and a probe task
TEST_REDIS_URL = str(app.conf.broker_url).rsplit("/", 1)[0]  # conftest: the server, db 0
# The Redis databases this file may take: the other tests use 0 and 15. One is claimed
# (a key set NX) in an empty database, so that a pytest process running beside this one
# (scripts/test.sh's PostgreSQL pass) takes another: the key scan must see only its own.
FREE_DBS = range(1, 15)
CLAIM = "weir-test-redis-prefix-claim"
PINGS = 20  # sent by each appliance: with one shared queue, about half would cross over
SENDER = """
import json, django
django.setup()
from django.conf import settings
from django.core.cache import cache
from appliance import task_runs
from appliance.celery import app
from appliance.shared_redis import shared_redis
sent = [app.send_task("weir-test.whoami") for _ in range({pings})]
ran_in = sorted({{result.get(timeout=60) for result in sent}})
cache.set("probe", 1, 300)
lock = task_runs.lock_key("weir.flush_channel", "orders")
assert shared_redis().lock(lock, timeout=300).acquire()
replies = app.control.ping(timeout=5)
print(json.dumps({{"prefix": settings.WEIR_REDIS_PREFIX, "ids": [r.id for r in sent],
                  "ran_in": ran_in,
                  "pinged": sorted(name for reply in replies for name in reply)}}))
"""


def appliance_env(var: Path, db: int = 0, **extra: str) -> dict[str, str]:
    """An appliance's environment: its var dir, the shared Redis database, no prefix,
    queue or cache prefix of the test run's own (the defaults are what is tested)."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("WEIR_CACHE_PREFIX", "WEIR_REDIS_PREFIX", "WEIR_CELERY_QUEUE")}
    path = os.pathsep.join(filter(None, (str(HERE), str(ROOT), env.get("PYTHONPATH"))))
    return {**env, "PYTHONPATH": path, "WEIR_VAR_DIR": str(var),
            "REDIS_URL": f"{TEST_REDIS_URL}/{db}", "WEIR_CHANNEL_WATCH_S": "0",
            "DJANGO_SETTINGS_MODULE": "appliance.settings", **extra}


@pytest.fixture(scope="module")
def shared_db() -> Iterator[redis.Redis]:
    """The Redis database both appliances use: one of FREE_DBS, empty but for the claim,
    emptied at the end."""
    for db in FREE_DBS:
        client = redis.Redis.from_url(f"{TEST_REDIS_URL}/{db}")
        if client.set(CLAIM, os.getpid(), nx=True, ex=900):
            if client.dbsize() == 1:
                break
            client.delete(CLAIM)  # ours, in a database something else uses
        client.close()
    else:
        pytest.fail(f"no empty Redis database among {list(FREE_DBS)} at {TEST_REDIS_URL}")
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory,
                shared_db: redis.Redis) -> Iterator[dict[str, Path]]:
    """A Celery worker of appliance a and one of appliance b, both on the queue `weir`;
    each appliance's var dir by name."""
    tmp = tmp_path_factory.mktemp("appliances")
    dirs = {name: tmp / name for name in ("a", "b")}
    db = db_of(shared_db)
    workers = []
    for name, var in dirs.items():
        var.mkdir()
        log = (var / "worker.log").open("wb")
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "whoami_app", "worker", "-n", f"{name}@%h",
             "--queues", "weir", "--pool", "threads", "--concurrency", "2",
             "--loglevel", "INFO"],
            cwd=HERE, env=appliance_env(var, db), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT))
        log.close()
    try:
        for var in dirs.values():
            wait_for(lambda var=var: b" ready." in (var / "worker.log").read_bytes(), 120,
                     f"the worker of {var.name} ready")
        yield dirs
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def db_of(client: redis.Redis) -> int:
    """The database number a client uses."""
    return int(client.connection_pool.connection_kwargs["db"])


@pytest.fixture(scope="module")
def sent(two_workers: dict[str, Path], shared_db: redis.Redis) -> dict[str, dict[str, object]]:
    """What each appliance sent, in turn, and what came back."""
    return {name: send_from(var, db_of(shared_db)) for name, var in two_workers.items()}


def send_from(var: Path, db: int) -> dict[str, object]:
    """Run the sender in appliance `var`'s environment: its pings' ids, its prefix, the
    workers that answered its broadcast ping."""
    done = subprocess.run([sys.executable, "-c", SENDER.format(pings=PINGS)], cwd=ROOT,
                          env=appliance_env(var, db), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_it_runs_each_appliances_tasks_on_its_own_workers_only(
        two_workers: dict[str, Path], sent: dict[str, dict[str, object]]) -> None:
    logs = {name: (var / "worker.log").read_text() for name, var in two_workers.items()}
    assert sent["a"]["prefix"] != sent["b"]["prefix"]
    for name, other in (("a", "b"), ("b", "a")):
        ids = sent[name]["ids"]
        assert isinstance(ids, list) and len(ids) == PINGS
        assert sent[name]["ran_in"] == [str(two_workers[name])]
        assert all(f"[{task_id}] received" in logs[name] for task_id in ids), name
        assert not any(task_id in logs[other] for task_id in ids), (name, other)
        [pinged] = sent[name]["pinged"]  # type: ignore[misc]
        assert pinged.startswith(f"{name}@"), sent[name]["pinged"]


def test_every_key_of_each_appliance_is_under_its_own_prefix(
        sent: dict[str, dict[str, object]], shared_db: redis.Redis) -> None:
    keys = sorted(key.decode() for key in shared_db.scan_iter(count=1000) if key != CLAIM.encode())
    mine = {name: [key for key in keys if key.startswith(f"{info['prefix']}:")]
            for name, info in sent.items()}
    assert sorted(mine["a"] + mine["b"]) == keys  # no key outside both prefixes
    for name, info in sent.items():
        prefix = info["prefix"]
        assert {f"{prefix}:celery-task-meta-{task_id}"
                for task_id in info["ids"]} <= set(mine[name])  # type: ignore[attr-defined]
        assert f"{prefix}:1:probe" in mine[name]  # the cache
        assert f"{prefix}:_kombu.binding.weir" in mine[name]  # the broker's queue binding
        assert f"{prefix}:1:task-lock:weir.flush_channel:orders" in mine[name]  # a raw key


def test_the_prefix_is_made_once_per_var_dir_and_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WEIR_REDIS_PREFIX", raising=False)
    first = redis_prefix(tmp_path / "a")
    assert first.startswith("weir-") and redis_prefix(tmp_path / "a") == first
    assert (tmp_path / "a" / "appliance_id").read_text() == first.removeprefix("weir-")
    assert redis_prefix(tmp_path / "b") != first
    monkeypatch.setenv("WEIR_REDIS_PREFIX", "site-a")
    assert redis_prefix(tmp_path / "a") == "site-a"
    for bad in ("two words", "a" * 65, "x:y"):
        monkeypatch.setenv("WEIR_REDIS_PREFIX", bad)
        with pytest.raises(ImproperlyConfigured, match="WEIR_REDIS_PREFIX"):
            redis_prefix(tmp_path / "a")


SHOW_SETTINGS = """
import json
from django.conf import settings
print(json.dumps({"prefix": settings.WEIR_REDIS_PREFIX,
                  "cache": settings.CACHES["default"]["KEY_PREFIX"],
                  "queue": settings.CELERY_TASK_DEFAULT_QUEUE,
                  "broker": settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"],
                  "results": settings.CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS["global_keyprefix"]}))
"""


def settings_of(env: dict[str, str]) -> dict[str, str]:
    """The Redis-related settings an appliance process with `env` reads."""
    done = subprocess.run([sys.executable, "-c", SHOW_SETTINGS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def test_the_settings_put_everything_under_the_prefix_even_an_operators_cache_prefix(
        tmp_path: Path) -> None:
    default = settings_of(appliance_env(tmp_path))
    prefix = "weir-" + (tmp_path / "appliance_id").read_text()
    assert default == {"prefix": prefix, "cache": prefix, "queue": "weir",
                       "broker": f"{prefix}:", "results": f"{prefix}:"}
    chosen = settings_of(appliance_env(tmp_path, WEIR_REDIS_PREFIX="site-a",
                                       WEIR_CELERY_QUEUE="site-a-q", WEIR_CACHE_PREFIX="old"))
    assert chosen == {"prefix": "site-a", "cache": "site-a:old", "queue": "site-a-q",
                      "broker": "site-a:", "results": "site-a:"}

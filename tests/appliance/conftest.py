"""Appliance tests use the Redis at WEIR_TEST_REDIS_URL (default: REDIS_URL's server; the
test command starts a private one when none answers) with their own cache database and
key prefix, and Celery's broker and results there too."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from celery.contrib.testing.worker import start_worker
from django.conf import settings as django_settings
from django.test import override_settings

from appliance import channels, export_driver, shared_redis
from appliance.celery import app
from appliance.env import cache_prefix


def _server(url: str) -> str:
    """The URL without its database path."""
    return urlunsplit(urlsplit(url)._replace(path="", query="")).rstrip("/")


TEST_REDIS_URL = _server(os.environ.get("WEIR_TEST_REDIS_URL") or django_settings.REDIS_URL)
# Set before any test connects: the settings read REDIS_URL once, when they load.
app.conf.broker_url = app.conf.result_backend = f"{TEST_REDIS_URL}/0"


@pytest.fixture(scope="session", autouse=True)
def _test_redis_answers() -> None:
    try:
        with redis.Redis.from_url(TEST_REDIS_URL, socket_connect_timeout=2) as client:
            client.ping()
    except (redis.RedisError, OSError) as exc:
        pytest.exit(f"no Redis answers at {TEST_REDIS_URL} ({exc}): scripts/test.sh starts "
                    "one, or set WEIR_TEST_REDIS_URL", returncode=2)


@pytest.fixture(autouse=True)
def _test_cache(settings: Any) -> None:
    # No channel watcher in this process: its thread would not see the rows a test writes
    # inside its transaction (tests of it run the appliance in processes of its own).
    settings.WEIR_CHANNEL_WATCH_S = 0
    shared_redis.reset()  # a test that made Redis fail leaves no open breaker behind
    settings.CACHES = {"default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": f"{TEST_REDIS_URL}/15",
        "KEY_PREFIX": cache_prefix(django_settings.WEIR_REDIS_PREFIX),  # as its children
    }}


@pytest.fixture(scope="module")
def worker(request: pytest.FixtureRequest) -> Iterator[None]:
    """A real Celery worker (threads) on the real broker, consuming a queue of this test
    module and process only, which every task the module sends goes to."""
    queue = f"weir-test-{request.module.__name__}-{os.getpid()}"
    app.conf.task_default_queue = queue
    with start_worker(app, pool="threads", concurrency=2, queues=[queue],
                      perform_ping_check=False, shutdown_timeout=30):
        yield
    app.conf.task_default_queue = django_settings.CELERY_TASK_DEFAULT_QUEUE


@pytest.fixture(autouse=True)
def _exports_on_the_test_queue(settings: Any) -> None:
    # Each test module's worker consumes one private queue (app.conf.task_default_queue,
    # set by its module-scoped fixture, which runs first); exports go there too instead
    # of the appliance's export queue, and so do Kafka sink runs. test_task_routing.py
    # checks the real routing.
    settings.WEIR_EXPORT_QUEUE = app.conf.task_default_queue
    settings.WEIR_KAFKA_QUEUE = app.conf.task_default_queue


@pytest.fixture()
def root(tmp_path: Path) -> Iterator[Path]:
    """A data root (WEIR_DATA_ROOTS) for the test's channels; their handles closed after."""
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        yield tmp_path
    channels.close_all()
    export_driver.stop()  # a task's warm Spark driver (a JVM) ends with its test

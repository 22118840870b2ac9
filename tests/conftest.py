"""What every test shares, whether the run is serial or spread over pytest-xdist workers
(scripts/test.sh runs the main pass with `-n 2`, and the appliance tests' PostgreSQL
pass beside it, in a pytest process of its own).

One real Kafka broker for the whole run (`kafka_broker`), the same way: WEIR_TEST_KAFKA_BOOTSTRAP
when set (scripts/test.sh starts one), else scripts/kafka.sh the first time a test asks.

One real HDFS for the whole run (`hdfs_url`): WEIR_TEST_HDFS_URL when set (scripts/test.sh
starts one for all its pytest processes; or an outside cluster, hdfs://host:port[/dir]),
else a MiniDFSCluster started by scripts/hdfs.sh the first time a test of this process
asks for it (state under pytest's temp dir) and stopped when the process ends. A failure
to start it fails the tests that need it, with the script's message; it is never skipped
silently. (The Spark cluster, `spark_master`, works the same way: tests/spark.)

Scheduling under xdist (`-n N` with --dist load, the default, loadfile or loadgroup):
work goes out in units, and a unit runs whole on one worker. A unit is a test file, so
that a module-scoped fixture (a Celery worker, a Kafka broker, Kafka's three dump runs,
a recorded power-loss workload) starts once per run, not once per worker; the export
job's own files (SPLIT_BY_TEST: long tests, no shared module fixture) go out test by
test. Session-scoped services (HDFS, the Spark cluster) come from scripts/test.sh
through the environment, so they start once whichever worker asks; each worker that runs
Spark tests has a SparkSession of its own (tests/spark/spark_sessions.py: local[2], or on
the cluster for a test on HDFS). Units go out longest first (LONGEST_FIRST,
measured; then by number of tests), so that no long unit starts last while the other
worker sits idle; and a worker gets a Spark unit (HEAVY: JVMs busy on both cores) only
while no other worker runs one, else the next other unit (mostly waiting: on servers,
browsers, timers), until one kind runs out: two Spark units at once left the CPU saturated
in the first half of a run and 20-30% idle in the second. This is done here, not with
xdist_group marks: pytest-xdist 3.8's loadgroup puts the group in the test's node id,
which pytest 9.2 no longer lets a plugin change (the marks are silently ignored:
pytest-dev/pytest-xdist#1386).

Redis: the processes sharing the test Redis — the xdist workers, the PostgreSQL pass,
and the gunicorn, Celery and manage.py processes their tests start — must never see each
other's throttle counters, task locks or row-cache generation. Each pytest process takes
a cache key prefix of its own (`weir-test-<pid>`, nested under the appliance prefix as
appliance/env.py cache_prefix does): its children inherit it through WEIR_CACHE_PREFIX,
and its own Django settings use it (tests/appliance/conftest.py puts
its tests on a Redis database of their own, with the same prefix).
"""
from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from services import started_service

from appliance import frozen_heap
from appliance.env import cache_prefix

# The units that took longest in a run of scripts/test.sh (November 2026), longest
# first: handed out before the rest. A hint only: a stale one costs balance.
LONGEST_FIRST = ("tests/spark/test_export.py", "tests/spark/test_export_hdfs_faults.py",
                 "tests/spark/test_export_cluster.py", "tests/spark/test_export_command.py",
                 "tests/spark/test_export_driver.py")
SCHEDULED_DISTS = ("load", "loadfile", "loadgroup")
HEAVY = "tests/spark/"  # units run one at a time while other units wait (see above)

ROOT = Path(__file__).resolve().parents[1]
CACHE_PREFIX = f"weir-test-{os.getpid()}"

# A pytest process is no appliance process: an in-process Celery worker's start
# (worker_init) or importing appliance.wsgi would freeze its heap mid-session
# (appliance/frozen_heap.py), keeping for good whatever earlier tests left and every
# cycle through it. The freezes are checked in processes of their own
# (tests/appliance/test_frozen_heap.py); the processes tests start freeze as usual.
frozen_heap.freeze_startup_objects = lambda: None
# Every process a test starts (gunicorn, Celery, manage.py) inherits it.
os.environ["WEIR_CACHE_PREFIX"] = CACHE_PREFIX


# Files whose every test is a unit of its own: each test runs an export job in JVMs of its
# own and no module-scoped fixture is shared, so a long file's tests spread over both
# workers (on 2 cores the run is CPU-bound: this evens the end of the run, no more).
SPLIT_BY_TEST = ("tests/spark/test_export.py", "tests/spark/test_export_cluster.py",
                 "tests/spark/test_export_command.py", "tests/spark/test_export_driver.py")


def file_of(nodeid: str) -> str:
    """The file a node id names."""
    return nodeid.split("::", 1)[0]


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its file, or the test itself in SPLIT_BY_TEST."""
    return nodeid if file_of(nodeid) in SPLIT_BY_TEST else file_of(nodeid)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, absent with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") not in SCHEDULED_DISTS:
        return None  # each, loadscope, worksteal: as asked
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """xdist's loadscope with the file as the scope, LONGEST_FIRST first, and
        tests sharing a node id all run."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            for file in reversed(LONGEST_FIRST):  # a split file's tests in their order
                for unit in [u for u in self.workqueue if file_of(u) == file][::-1]:
                    self.workqueue.move_to_end(unit, last=False)
            scope = self._next_unit(node)
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            # Every index of a node id, not only its first: tests that share one (each
            # of schemathesis's parametrized cases) would otherwise run once in all.
            node.send_runtest_some([index for index, nodeid
                                    in enumerate(self.registered_collections[node])
                                    if nodeid in work_unit and not work_unit[nodeid]])

        def _next_unit(self, node: Any) -> str:
            """The first waiting unit of the kind this node should run now: a Spark one
            unless another worker has one unfinished; either kind when one runs out."""
            other_runs_heavy = any(
                is_heavy(scope) and not all(done.values())
                for other, units in self.assigned_work.items() if other is not node
                for scope, done in units.items())
            for scope in self.workqueue:
                if is_heavy(scope) != other_runs_heavy:
                    return str(scope)
            return str(next(iter(self.workqueue)))

    return FileScheduling(config, log)


def is_heavy(unit: str) -> bool:
    """A unit that keeps both cores busy by itself: an export job's JVMs and workers."""
    return file_of(unit).startswith(HEAVY)


@pytest.fixture(scope="session", autouse=True)
def _cache_prefix_of_this_process() -> Iterator[None]:
    # The settings were read before this file (pytest-django loads them first).
    caches = copy.deepcopy(django_settings.CACHES)
    caches["default"]["KEY_PREFIX"] = cache_prefix(django_settings.WEIR_REDIS_PREFIX)
    with override_settings(CACHES=caches):
        yield


@dataclass(frozen=True)
class KafkaBroker:
    """The run's Kafka broker (scripts/kafka.sh): its PLAINTEXT, SASL/PLAIN and TLS
    addresses, and the directory of its TLS material (scripts/kafka_tls.py)."""

    bootstrap: str
    sasl_bootstrap: str  # users admin/admin-secret (super user) and alice/alice-secret
    ssl_bootstrap: str
    tls_dir: Path | None  # ca.pem, client.pem, client.key, other-ca.pem


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The run's Kafka broker: WEIR_TEST_KAFKA_BOOTSTRAP (and _SASL_BOOTSTRAP,
    _SSL_BOOTSTRAP, _TLS_DIR) when set
    (scripts/test.sh starts one for all its pytest processes), else one started by
    scripts/kafka.sh for this process. Each test uses topics of its own."""
    given = os.environ.get("WEIR_TEST_KAFKA_BOOTSTRAP")
    if given:
        tls = os.environ.get("WEIR_TEST_KAFKA_TLS_DIR")
        yield KafkaBroker(given, os.environ.get("WEIR_TEST_KAFKA_SASL_BOOTSTRAP", ""),
                          os.environ.get("WEIR_TEST_KAFKA_SSL_BOOTSTRAP", ""),
                          Path(tls) if tls else None)
        return
    state = tmp_path_factory.mktemp("kafka")
    with started_service("kafka.sh", {**os.environ, "WEIR_KAFKA_DIR": str(state)}) as address:
        yield KafkaBroker(address, (state / "sasl_bootstrap").read_text().strip(),
                          (state / "ssl_bootstrap").read_text().strip(), state / "tls")


@pytest.fixture(scope="session")
def hdfs_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """hdfs://host:port of the run's HDFS (each test makes a directory of its own)."""
    given = os.environ.get("WEIR_TEST_HDFS_URL")
    if given:
        yield given.rstrip("/")
        return
    env = {**os.environ, "WEIR_HDFS_DIR": str(tmp_path_factory.mktemp("hdfs"))}
    with started_service("hdfs.sh", env) as url:
        yield url

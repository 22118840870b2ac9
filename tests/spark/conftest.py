"""The tests' SparkSession, one per pytest process (a JVM holds one SparkContext at a time),
with the "weir" source registered. A test on HDFS (marked `hdfs`) gets a session on the
run's Spark standalone cluster (`spark_master`, spark_cluster.py), whose executors are
JVMs of their own with their own Python workers that import channel_engine only from the
zip the session ships (export.package_zip, as the export job does): the export suite runs
against HDFS with separate executors, as on a real cluster. Every other test gets
local[2], the faster place for the file:// run. A process switches kinds by stopping its
session and starting the other (seconds); tests are ordered, within each file, local kind
first (pytest_collection_modifyitems below), so that a worker switches seldom.
WEIR_TEST_SPARK_SESSION=cluster puts every test on the cluster, =local every test on
local[2]. A cluster session takes SESSION_CORES of the worker's cores while it lives.
The `output` fixture gives a test a fresh output directory, once on file:// and once on
the run's HDFS (`hdfs_url`, tests/conftest.py). Tests on HDFS are marked `hdfs`: the
default run includes them, `-m hdfs` runs them alone, `-m "not hdfs"` leaves them out."""
from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_cluster import spark_master  # noqa: F401 -- a cluster of separate JVMs
from spark_sessions import KINDS, SparkSessions, session_kind

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Within each file of Spark tests, the local kind first (a stable sort)."""
    def key(index_item: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        index, item = index_item
        spark_test = "spark" in getattr(item, "fixturenames", ())
        kind = session_kind(item) if spark_test else "local"
        return first_of[item.path], KINDS.index(kind), index

    first_of: dict[Path, int] = {}
    for index, item in enumerate(items):
        first_of.setdefault(item.path, index)
    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[SparkSessions]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)  # the venv's interpreter, not PATH's
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        # local[2]'s Python workers (children of this process's JVM) unpickle WeirSource
        # with it; a cluster's executors are the worker daemon's children and never see it
        env.setenv("PYTHONPATH", str(ROOT), prepend=os.pathsep)
        sessions = SparkSessions()
        try:
            yield sessions
        finally:
            sessions.stop()


@pytest.fixture
def spark(spark_sessions: SparkSessions, request: pytest.FixtureRequest) -> Any:
    """The test's SparkSession: on the run's cluster for a test on HDFS, else local[2]."""
    return spark_sessions.get(session_kind(request.node),
                              lambda: request.getfixturevalue("spark_master").url)


FILESYSTEMS = ["file", pytest.param("hdfs", marks=pytest.mark.hdfs)]


def new_output(filesystem: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh output directory URI on `filesystem` ("file" or "hdfs")."""
    if filesystem == "hdfs":
        return f"{request.getfixturevalue('hdfs_url')}/{uuid.uuid4().hex}"
    return (tmp_path / "out").as_uri()


@pytest.fixture(params=FILESYSTEMS)
def output(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh output directory URI, on file:// or on HDFS (the `hdfs` variant)."""
    return new_output(request.param, request, tmp_path)

"""One SparkSession per pytest process, with the "weir" source registered: local[2] by
default, or with WEIR_TEST_SPARK_SESSION=cluster on the run's Spark standalone cluster
(`spark_master`, spark_cluster.py), whose executors are JVMs of their own with their own
Python workers that import channel_engine only from the zip the session ships
(export.package_zip, as the export job does), so the whole export and source suite runs
as on a real cluster; it takes SESSION_CORES of the worker's cores for its life. Not the
default: the export suite takes about twice as long there (issue 14's note); the default
run puts the export job itself on the cluster in test_export_cluster.py.
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

ROOT = Path(__file__).resolve().parents[2]
SESSION_CORES = 2


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    on_cluster = os.environ.get("WEIR_TEST_SPARK_SESSION", "local") == "cluster"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)  # the venv's interpreter, not PATH's
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        if not on_cluster:  # local workers inherit this; unpickling WeirSource needs it
            env.setenv("PYTHONPATH", str(ROOT), prepend=os.pathsep)
        from pyspark.sql import SparkSession

        from channel_engine.spark import register
        from channel_engine.spark.export import HDFS_CLIENT_RETRY, package_zip

        builder = SparkSession.builder
        for key, value in HDFS_CLIENT_RETRY.items():  # as the job's own session has them
            builder = builder.config(f"spark.hadoop.{key}", value)
        if on_cluster:
            builder = (builder.master(request.getfixturevalue("spark_master").url)
                       .config("spark.cores.max", str(SESSION_CORES))
                       .config("spark.executor.memory", "768m")
                       .config("spark.executor.extraJavaOptions",
                               os.environ.get("WEIR_SPARK_JAVA_OPTS", "")))
        else:
            builder = builder.master("local[2]")
        session = (builder.appName("weir-tests")
                   .config("spark.ui.enabled", "false")
                   .config("spark.sql.shuffle.partitions", "2")
                   .config("spark.ui.showConsoleProgress", "false")
                   .getOrCreate())
        session.sparkContext.setLogLevel("ERROR")  # failing-job tests log stack traces
        if on_cluster:
            session.sparkContext.addPyFile(package_zip())  # no repo on executors' paths
        register(session)
        try:
            yield session
        finally:
            session.stop()


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

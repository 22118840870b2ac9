"""One local SparkSession for the whole test run, with the "weir" source registered.
The `output` fixture gives a test a fresh output directory, once on file:// and once on
the run's HDFS (`hdfs_url`, tests/conftest.py). Tests on HDFS are marked `hdfs`: the
default run includes them, `-m hdfs` runs them alone, `-m "not hdfs"` leaves them out.
`spark_master` (spark_cluster.py): a Spark standalone cluster of separate JVMs."""
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


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as env:
        # Set before the JVM starts: its Python workers inherit this environment.
        env.setenv("PYSPARK_PYTHON", sys.executable)  # the venv's interpreter, not PATH's
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        # Workers unpickle WeirSource by reference, so they must import channel_engine.
        env.setenv("PYTHONPATH", str(ROOT), prepend=os.pathsep)
        from pyspark.sql import SparkSession

        from channel_engine.spark import register
        from channel_engine.spark.export import HDFS_CLIENT_RETRY

        builder = SparkSession.builder
        for key, value in HDFS_CLIENT_RETRY.items():  # as the job's own session has them
            builder = builder.config(f"spark.hadoop.{key}", value)
        session = (builder.master("local[2]").appName("weir-tests")
                   .config("spark.ui.enabled", "false")
                   .config("spark.sql.shuffle.partitions", "2")
                   .config("spark.ui.showConsoleProgress", "false")
                   .getOrCreate())
        session.sparkContext.setLogLevel("ERROR")  # failing-job tests log stack traces
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

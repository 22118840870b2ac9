"""The tests' SparkSessions (conftest.py's `spark` fixture): which kind a test gets, and
the one session of a pytest process, started on local[2] or on the run's Spark cluster,
switched by stopping one and starting the other (a JVM holds one SparkContext at a time)."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

SESSION_CORES = 2  # of the cluster's worker, while a cluster session lives
KINDS = ("local", "cluster")


def session_kind(item: pytest.Item) -> str:
    """Where a test's SparkSession runs: "cluster" (separate executors) or "local"."""
    chosen = os.environ.get("WEIR_TEST_SPARK_SESSION", "")
    if chosen in KINDS:
        return chosen
    return "cluster" if item.get_closest_marker("hdfs") else "local"


class SparkSessions:
    """This process's one SparkSession, of the kind last asked for."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.session: Any = None

    def get(self, kind: str, master: Callable[[], str]) -> Any:
        """A session of `kind`; a session of the other kind is stopped first."""
        if self.kind != kind:
            self.stop()
            self.session = start_session(master() if kind == "cluster" else None)
            self.kind = kind
        return self.session

    def stop(self) -> None:
        """Stop the session, if any."""
        if self.session is not None:
            self.session.stop()
        self.kind = self.session = None


def start_session(cluster_url: str | None) -> Any:
    """A SparkSession on local[2], or on the cluster at `cluster_url`."""
    from pyspark.sql import SparkSession

    from channel_engine.spark import register
    from channel_engine.spark.export import HDFS_CLIENT_RETRY, package_zip

    builder = SparkSession.builder
    for key, value in HDFS_CLIENT_RETRY.items():  # as the job's own session has them
        builder = builder.config(f"spark.hadoop.{key}", value)
    if cluster_url:
        builder = (builder.master(cluster_url)
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
    if cluster_url:
        session.sparkContext.addPyFile(package_zip())  # no repo on executors' paths
    register(session)
    return session

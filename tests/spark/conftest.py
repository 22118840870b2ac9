"""One local SparkSession for the whole test run, with the "weir" source registered;
and one real HDFS for the run (`hdfs_url`): WEIR_TEST_HDFS_URL when set (an outside
cluster, hdfs://host:port[/dir]), else a MiniDFSCluster started once through
scripts/hdfs.sh (state under pytest's temp dir) and stopped when the run ends. A
failure to start it fails the tests that need it, with the script's message; it is
never skipped silently. The `output` fixture gives a test a fresh output directory,
once on file:// and once on HDFS. Tests on HDFS are marked `hdfs`, which the default run
leaves out: `-m hdfs` runs them alone, `-m "not slow"` with the file:// ones.
`spark_master` (spark_cluster.py): a Spark standalone cluster of separate JVMs."""
from __future__ import annotations

import os
import subprocess
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

        session = (SparkSession.builder.master("local[2]").appName("weir-tests")
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


@pytest.fixture(scope="session")
def hdfs_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("WEIR_TEST_HDFS_URL")
    if given:
        yield given.rstrip("/")
        return
    env = {**os.environ, "WEIR_HDFS_DIR": str(tmp_path_factory.mktemp("hdfs"))}
    script = str(ROOT / "scripts" / "hdfs.sh")
    try:
        started = subprocess.run([script, "start"], capture_output=True, text=True,
                                 env=env, timeout=600, check=False)
    except subprocess.TimeoutExpired as timeout:
        subprocess.run([script, "stop"], env=env, timeout=120, check=False)
        pytest.fail(f"scripts/hdfs.sh start hung: {timeout}")
    if started.returncode != 0:
        pytest.fail(f"scripts/hdfs.sh start failed ({started.returncode}):\n"
                    f"{started.stderr[-3000:]}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([script, "stop"], capture_output=True, env=env, timeout=120,
                       check=False)


def new_output(filesystem: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh output directory URI on `filesystem` ("file" or "hdfs")."""
    if filesystem == "hdfs":
        return f"{request.getfixturevalue('hdfs_url')}/{uuid.uuid4().hex}"
    return (tmp_path / "out").as_uri()


@pytest.fixture(params=FILESYSTEMS)
def output(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh output directory URI, on file:// or on HDFS (the `hdfs` variant)."""
    return new_output(request.param, request, tmp_path)

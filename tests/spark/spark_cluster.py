"""The `spark_master` session fixture: a Spark cluster whose executors are JVMs of their
own, with their own Python workers. WEIR_TEST_SPARK_MASTER when set (an outside cluster,
spark://host:port; WEIR_TEST_SPARK_DIR names its scripts/spark_cluster.sh state dir when
it runs on this host, as scripts/test.sh's does), else a standalone master and worker
started once per run through scripts/spark_cluster.sh (state and executor logs under
pytest's temp dir) and stopped when the run ends. A failure to start it fails the tests
that need it, with the script's message; it is never skipped silently. Imported by conftest.py."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from services import started_service

# as scripts/common.sh's use_test_jvm_services: room for the sessions and jobs of a run
START = ["--cores", "8", "--memory", "6g"]


@dataclass(frozen=True)
class SparkCluster:
    """A cluster's master URL; work_dir (the worker's, one directory per application and
    executor) only when this run started it, so its executors run on this host."""

    url: str
    work_dir: Path | None
    start_s: float = 0.0


@pytest.fixture(scope="session")
def spark_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    given = os.environ.get("WEIR_TEST_SPARK_MASTER")
    if given:  # WEIR_TEST_SPARK_DIR: its state dir, when it runs here (scripts/test.sh)
        state_dir = os.environ.get("WEIR_TEST_SPARK_DIR")
        yield SparkCluster(given, Path(state_dir) / "work" if state_dir else None)
        return
    state = tmp_path_factory.mktemp("spark-cluster")
    env = {**os.environ, "WEIR_SPARK_DIR": str(state), "WEIR_PYTHON": sys.executable}
    began = time.monotonic()
    with started_service("spark_cluster.sh", env, *START) as url:
        yield SparkCluster(url, state / "work", round(time.monotonic() - began, 1))


"""The `spark_master` session fixture: a Spark cluster whose executors are JVMs of their
own, with their own Python workers. WEIR_TEST_SPARK_MASTER when set (an outside cluster,
spark://host:port; WEIR_TEST_SPARK_DIR names its scripts/spark_cluster.sh state dir when
it runs on this host, as scripts/test.sh's does), else a standalone master and worker
started once per run through scripts/spark_cluster.sh (state and executor logs under
pytest's temp dir) and stopped when the run ends. A failure to start it fails the tests
that need it, with the script's message; it is never skipped silently. Imported by conftest.py."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "spark_cluster.sh")


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
    try:
        started = subprocess.run([SCRIPT, "start"], capture_output=True, text=True, env=env,
                                 timeout=300, check=False)
    except subprocess.TimeoutExpired as timeout:
        subprocess.run([SCRIPT, "stop"], env=env, timeout=120, check=False)
        pytest.fail(f"scripts/spark_cluster.sh start hung: {timeout}")
    if started.returncode != 0:
        pytest.fail(f"scripts/spark_cluster.sh start failed ({started.returncode}):\n"
                    f"{started.stderr[-3000:]}")
    try:
        yield SparkCluster(started.stdout.strip().splitlines()[-1], state / "work",
                           round(time.monotonic() - began, 1))
    finally:
        subprocess.run([SCRIPT, "stop"], capture_output=True, env=env, timeout=120,
                       check=False)


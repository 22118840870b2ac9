"""Fixtures every test directory may use: one real HDFS for the whole run (`hdfs_url`).

It is WEIR_TEST_HDFS_URL when set (an outside cluster, hdfs://host:port[/dir]), else a
MiniDFSCluster started by scripts/hdfs.sh the first time a test asks for it (state
under pytest's temp dir) and stopped when the run ends: one cluster per run, shared by
tests/spark and tests/appliance. A failure to start it fails the tests that need it,
with the script's message; it is never skipped silently."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def hdfs_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """hdfs://host:port of the run's HDFS (each test makes a directory of its own)."""
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
        subprocess.run([script, "stop"], capture_output=True, env=env, timeout=120,
                       check=False)
        pytest.fail(f"scripts/hdfs.sh start failed ({started.returncode}):\n"
                    f"{started.stderr[-3000:]}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([script, "stop"], capture_output=True, env=env, timeout=120,
                       check=False)

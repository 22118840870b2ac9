"""scripts/jvm_deps.py: a valid cache is used without Maven or network; a cached jar whose
sha256 is not the pinned one is never used; a set it cannot fetch is a clear failure."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "jvm_deps.py"


def run(cache: Path, *args: str) -> subprocess.CompletedProcess:
    """The script with its cache at `cache` and no `mvn` on PATH (so: no fetching)."""
    env = {**os.environ, "WEIR_JVM_CACHE": str(cache), "PATH": "/nonexistent"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def fetched() -> Path:
    result = subprocess.run([sys.executable, str(SCRIPT), "kafka-tools"], capture_output=True,
                            text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.split()[-1])


def test_it_uses_a_valid_cache_without_maven(tmp_path, fetched):
    shutil.copytree(fetched, tmp_path / "kafka-tools" / "lib")
    result = run(tmp_path, "kafka-tools")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "kafka-tools" / "lib")


def test_it_refuses_a_cached_jar_that_is_not_the_pinned_one(tmp_path, fetched):
    lib = tmp_path / "kafka-tools" / "lib"
    shutil.copytree(fetched, lib)
    jar = lib / "kafka-clients-4.1.1.jar"
    jar.write_bytes(jar.read_bytes() + b"\0")
    result = run(tmp_path, "kafka-tools")
    assert result.returncode == 1
    assert "cannot fetch set 'kafka-tools' (org.apache.kafka:kafka_2.13:4.1.1" in result.stderr
    assert "`mvn` is not installed" in result.stderr


def test_it_names_the_known_sets_for_an_unknown_one(tmp_path):
    result = run(tmp_path, "no-such-set")
    assert result.returncode == 1
    assert "no JVM artifact set 'no-such-set' (known: " in result.stderr
    assert "kafka-tools" in result.stderr and "hdfs" in result.stderr

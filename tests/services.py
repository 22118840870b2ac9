"""The repo's service scripts started for tests (scripts/hdfs.sh, scripts/spark_cluster.sh):
started_service() runs `SCRIPT start ARGS`, gives the URL it prints as its last line while
the block runs, and runs `SCRIPT stop` after. A start that fails or hangs fails the test
with the script's message (and stops what it left): never a silent skip."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@contextmanager
def started_service(script: str, env: dict[str, str], *args: str) -> Iterator[str]:
    """`scripts/SCRIPT start ARGS` with `env` (naming its state dir); its URL; stopped after."""
    command = str(SCRIPTS / script)
    try:
        started = subprocess.run([command, "start", *args], capture_output=True, text=True,
                                 env=env, timeout=600, check=False)
    except subprocess.TimeoutExpired as timeout:
        _stop(command, env)
        pytest.fail(f"scripts/{script} start hung: {timeout}")
    if started.returncode != 0:
        _stop(command, env)
        pytest.fail(f"scripts/{script} start failed ({started.returncode}):\n"
                    f"{started.stderr[-3000:]}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        _stop(command, env)


def _stop(command: str, env: dict[str, str]) -> None:
    subprocess.run([command, "stop"], capture_output=True, env=env, timeout=120, check=False)

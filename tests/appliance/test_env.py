"""appliance/env.py's secret_key(): processes starting at once on a new var dir (parallel
test workers, gunicorn's workers) all get one key, never a half-written one (threads
here, which race the same way on the file and cost no interpreter starts)."""
from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.env import secret_key

TRIALS, AT_ONCE = 50, 8


@pytest.fixture()
def switch_often() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave between any two bytecodes
    yield
    sys.setswitchinterval(interval)


def test_it_gives_everyone_asking_at_once_on_a_new_var_dir_one_secret_key(
        tmp_path: Path, switch_often: None) -> None:
    for trial in range(TRIALS):
        var = tmp_path / f"var{trial}"
        start, keys = threading.Barrier(AT_ONCE), []

        def ask(var: Path = var, start: threading.Barrier = start,
                keys: list[str] = keys) -> None:
            start.wait()
            keys.append(secret_key(var))

        threads = [threading.Thread(target=ask) for _ in range(AT_ONCE)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(keys) == AT_ONCE and len(set(keys)) == 1 and keys[0], (trial, keys)
        assert (var / "secret_key").stat().st_mode & 0o777 == 0o600
        assert [p.name for p in var.iterdir()] == ["secret_key"]  # no temp file left

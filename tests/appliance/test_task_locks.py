"""A single-flight lock held by a worker that died (kill -9, so it never released it)
stops other runs of that task on that channel until the lock's timeout, and not after:
the next run goes ahead as soon as it lapses."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row
from django.conf import settings as django_settings
from django.test import override_settings

from appliance import task_runs, tasks
from appliance.models import TaskRun
from appliance.shared_redis import shared_redis

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
TASK = "weir.checkpoint_channel"
# A worker: takes the lock through task_runs.single_flight, says so, then hangs.
WORKER = """
import sys, time, django
django.setup()
from appliance.task_runs import single_flight
with single_flight(sys.argv[1], sys.argv[2], float(sys.argv[3]), 0) as held:
    print("held" if held else "busy", flush=True)
    time.sleep(600)
"""


def start_worker(tmp_path: Path, hold_s: float) -> subprocess.Popen[str]:
    """A process that holds the task's lock on channel orders, as a worker running it."""
    cache = django_settings.CACHES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "appliance.settings",
           # the cache's prefix as this process's: its WEIR_CACHE_PREFIX (conftest) under
           # this appliance prefix, not the one of the child's own var dir
           "REDIS_URL": cache["LOCATION"], "WEIR_REDIS_PREFIX": django_settings.WEIR_REDIS_PREFIX,
           "WEIR_VAR_DIR": str(tmp_path / "var")}
    child = subprocess.Popen([sys.executable, "-c", WORKER, TASK, "orders", str(hold_s)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    return child


def checkpoint(wait_s: float) -> Any:
    with override_settings(WEIR_TASK_LOCK_WAIT_S=wait_s):
        return tasks.checkpoint_channel.apply(("orders",), {"force": True}).get()


def test_a_lock_held_by_a_dead_worker_expires_after_its_timeout(
        root: Path, tmp_path: Path) -> None:
    channel_row(root)
    with override_settings(WEIR_TASK_LOCK_GRACE_S=1.0):
        hold_s = task_runs.lock_hold_s(2.0)  # a run with a 2 s hard time limit
    assert hold_s == 3.0
    child = start_worker(tmp_path, hold_s)
    try:
        assert checkpoint(0) == TaskRun.BUSY  # held by a live worker
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        child.kill()
        child.wait()
    killed = time.monotonic()
    left_s = shared_redis().pttl(task_runs.lock_key(TASK, "orders")) / 1000
    assert 0 < left_s <= hold_s  # its worker is dead, the lock is not
    assert checkpoint(0) == TaskRun.BUSY  # not before the timeout
    assert checkpoint(hold_s + 5) == TaskRun.OK  # waits for it to lapse, then runs
    lapsed_after = time.monotonic() - killed
    assert left_s <= lapsed_after <= left_s + 1.0, (left_s, lapsed_after)
    outcomes = [r.outcome for r in TaskRun.objects.order_by("started_at")]
    assert outcomes == [TaskRun.BUSY, TaskRun.BUSY, TaskRun.OK]

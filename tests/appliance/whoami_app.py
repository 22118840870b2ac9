"""The appliance's Celery app (appliance.celery.app, its settings unchanged) with two more
tasks: weir-test.whoami, which answers the var dir of the worker that ran it (which
appliance a message reached, without a database: tests/appliance/test_redis_prefix.py),
and weir-test.frozen, how many objects the process that ran it has frozen
(tests/appliance/test_frozen_heap.py). `celery -A whoami_app worker` from
tests/appliance."""
from __future__ import annotations

import gc
import os

from appliance.celery import app

__all__ = ["app", "frozen", "whoami"]


@app.task(name="weir-test.whoami")
def whoami() -> str:
    """The WEIR_VAR_DIR of the worker running this task."""
    return os.environ["WEIR_VAR_DIR"]


@app.task(name="weir-test.frozen")
def frozen() -> int:
    """gc.get_freeze_count() in the process running this task."""
    return gc.get_freeze_count()

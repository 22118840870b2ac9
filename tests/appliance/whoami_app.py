"""The appliance's Celery app (appliance.celery.app, its settings unchanged) with one more
task, weir-test.whoami, which answers the var dir of the worker that ran it: which
appliance a message reached, without a database. `celery -A whoami_app worker` from
tests/appliance (tests/appliance/test_redis_prefix.py)."""
from __future__ import annotations

import os

from appliance.celery import app

__all__ = ["app", "whoami"]


@app.task(name="weir-test.whoami")
def whoami() -> str:
    """The WEIR_VAR_DIR of the worker running this task."""
    return os.environ["WEIR_VAR_DIR"]

"""wait_for: poll a condition until it holds, for tests in every directory (the spark
tests load no Django, so this lives apart from tests/appliance/appliance_helpers.py)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(check: Callable[[], Any], deadline_s: float, what: str = "",
             interval_s: float = 0.05) -> Any:
    """Poll `check` until it is truthy and return its value; AssertionError naming `what`
    after deadline_s."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"not within {deadline_s} s: {what}")

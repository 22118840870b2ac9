"""Processes under /proc and polling, shared by test_export_driver.py and
bench/export_small.py (a driver's JVM, its memory)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def children_by_parent() -> dict[int, list[int]]:
    """Every live process's pid, under its parent's pid."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return children


def children(pid: int) -> list[int]:
    """The pids of the processes whose parent is `pid`."""
    return children_by_parent().get(pid, [])


def comm(pid: int) -> str:
    """Process `pid`'s command name; "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def wait_until(check: Any, what: str, deadline_s: float = 90) -> Any:
    """Poll `check` until it is truthy; its value. AssertionError naming `what`."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {deadline_s} s: {what}")

"""Processes under /proc, shared by test_export_driver.py and
bench/export_small.py (a driver's JVM, its memory)."""
from __future__ import annotations

from pathlib import Path


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

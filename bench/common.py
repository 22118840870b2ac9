"""What the benchmarks share: their inputs and the device's flush counter."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def make_bodies(count: int, size: int) -> list[bytes]:
    """Return `count` distinct random bodies of `size` bytes."""
    blob = os.urandom(count * size)
    return [blob[i:i + size] for i in range(0, len(blob), size)]


def chunk(items: Sequence[Any], size: int) -> list[list[Any]]:
    """Split items into lists of `size` (the last may be shorter)."""
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def flush_stat_path(directory: Path) -> Path | None:
    """The sysfs stat file of the block device holding `directory`, if there is one."""
    dev = os.stat(directory).st_dev
    path = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return path if path.exists() else None


def read_flushes(path: Path | None) -> int | None:
    """Flush requests completed by the device so far (field 16 of its stat), or None."""
    if path is None:
        return None
    fields = path.read_text().split()
    return int(fields[15]) if len(fields) >= 16 else None

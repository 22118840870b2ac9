"""Checkpointing: what one checkpoint wrote (CheckpointResult)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CheckpointResult:
    """What one checkpoint wrote and how long it held the channel."""

    sequence: int
    written_at_ms: int
    duration_ms: float
    lock_held_ms: float
    backup: str  # "written", "off" or "failed: <why>"
    segments_deleted: int
    journals_removed: int

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for status output."""
        return self.__dict__.copy()

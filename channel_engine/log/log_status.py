"""LogStatus: what a partition log says about itself: stats() and a SegmentInfo per segment.

For the stat tool (tools/cli_stat.py), the channel's status and the UI. Reads the
shared PartitionState (partition_state.py): offsets, segments, what the open found
(last_recovery) and the damage reads met (read_damage); and which segments
retention may delete now, by the retention part's rule (handed in:
LogRetention.candidates). Writes nothing; owns no bytes.

Concurrency: takes no lock: it reads a snapshot of the segment list and plain
counters, so a figure may be a moment old, as any status of a live log.

Failures: none of its own.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from channel_engine.log.partition_state import PartitionState
from channel_engine.log.segment import LogSegment


@dataclass(frozen=True)
class SegmentInfo:
    """What an operator wants to know about one segment (the stat tool and the UI)."""

    base_offset: int
    next_offset: int
    records: int
    size: int
    file_size: int
    first_batch_timestamp: int | None
    max_timestamp: int
    index_entries: int
    time_index_entries: int
    preallocated: bool
    flushed: bool
    active: bool
    deletable: str | None


class LogStatus:
    """A partition log's status (see the module doc)."""

    def __init__(self, state: PartitionState,
                 candidates: Callable[[int, int], list[tuple[LogSegment, str]]]) -> None:
        self.state = state
        self.candidates = candidates  # retention's rule (LogRetention.candidates)

    def segment_infos(self) -> list[SegmentInfo]:
        """One SegmentInfo per live segment, oldest first."""
        state = self.state
        segments = state.segments
        if not segments:  # a reader of a directory whose segments are all unusable
            return []
        deletable = dict((id(seg), why) for seg, why in
                         self.candidates(state.now_ms(), state.high_watermark))
        return [
            SegmentInfo(
                base_offset=seg.base_offset, next_offset=seg.next_offset,
                records=seg.next_offset - seg.base_offset, size=seg.size,
                file_size=seg.file_size, first_batch_timestamp=seg.first_batch_timestamp,
                max_timestamp=seg.max_timestamp, index_entries=len(seg.offset_index),
                time_index_entries=len(seg.time_index),
                preallocated=seg.file_size > seg.size,
                flushed=seg.next_offset <= state.recovery_point and not seg.dirty,
                active=seg is segments[-1], deletable=deletable.get(id(seg)))
            for seg in segments
        ]

    def stats(self) -> dict[str, Any]:
        """Plain JSON-serialisable facts about the log."""
        state = self.state
        return {
            "directory": str(state.directory),
            "partition": state.partition,
            "durability": state.config.durability,
            "log_start_offset": state.log_start_offset,
            "log_end_offset": state.log_end_offset,
            "high_watermark": state.high_watermark,
            "recovery_point": state.recovery_point,
            "unflushed_events": state.unflushed_events,
            "size_bytes": state.size_bytes,
            "preallocated_bytes": state.preallocated_bytes,
            "segments": len(state.segments),
            "last_flush_ms": state.last_flush_ms,
            "offline": str(state.offline) if state.offline else None,
            "index_rebuilds": state.index_rebuilds_dropped + sum(
                s.index_rebuilds for s in state.segments),
            "last_recovery": state.last_recovery.to_dict(),
            "read_damage": self.read_damage_stats(),
        }

    def read_damage_stats(self) -> dict[str, int]:
        """Damaged batches reads met since open: places and the offsets they lost."""
        losses = list(self.state.read_damage.values())
        return {"places": len(losses), "offsets_lost": sum(r.offsets for r in losses)}

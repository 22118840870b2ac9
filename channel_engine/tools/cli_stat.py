"""`python -m channel_engine stat PATH`: a channel's status, or a partition's segments table.

Opens the channel or the partition log read-only (no lock, nothing written) and
prints its stats and SegmentInfo rows (text or --json).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from channel_engine.channel import Channel
from channel_engine.incarnations import ORIGINAL
from channel_engine.log.partition_log import PartitionLog
from channel_engine.tools.cli_paths import is_home, require_dir


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Print the status of a channel or the segments of a partition."""
    require_dir(args.path)
    if is_home(args.path, args):
        return _stat_channel(args.path, args.json, out)
    with PartitionLog.open(args.path, read_only=True) as log:
        stats = log.stats()
        infos = log.segment_infos()
        stats["incarnation"] = log.incarnation.id
        stats["incarnation_start_offset"] = log.incarnation.start_offset
        stats["incarnation_pending"] = log.incarnation.pending
    if args.json:
        stats["segment_table"] = [vars(info) for info in infos]
        print(json.dumps(stats, indent=2), file=out)
        return 0
    print(f"{args.path}: log start {stats['log_start_offset']}, log end "
          f"{stats['log_end_offset']}, recovery point {stats['recovery_point']}, "
          f"{stats['size_bytes']} bytes in {stats['segments']} segments"
          f"{_recreated(stats)}", file=out)
    columns = ("base_offset", "next_offset", "records", "size", "file_size", "index_entries",
               "time_index_entries", "max_timestamp", "flushed", "active", "deletable")
    rows = [[str(getattr(info, c)) for c in columns] for info in infos]
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    for row in [list(columns), *rows]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)), file=out)
    return 0


def _stat_channel(home: Path, as_json: bool, out: TextIO) -> int:
    with Channel.open(home, read_only=True) as channel:
        status = channel.status(segments=as_json)
    if as_json:
        print(json.dumps(status, indent=2), file=out)
        return 0
    checkpoint = status["checkpoint"]
    print(f"channel {status['name']!r}: {status['events_untaken']} events untaken of capacity "
          f"{status['capacity']} ({status['fill_percent']}%), {status['bytes_on_disk']} bytes "
          f"on disk ({status['bytes_preallocated']} of them preallocated), checkpoint "
          f"sequence {checkpoint['sequence']}; health {status['health']} "
          f"({status['health_reason']})", file=out)
    for part in status["partitions"]:  # the queue figures: the slowest subscription's
        print(f"partition {part['partition']}: {part['directory']}: log start "
              f"{part['log_start_offset']}, log end {part['log_end_offset']}, taken through "
              f"{part['taken_through']}, {part['events_untaken']} untaken, "
              f"{part['segments']} segments{_recreated(part)}", file=out)
    for name, sub in status["subscriptions"].items():
        heads = ", ".join(f"p{q['partition']} {q['taken_through']}" for q in sub["partitions"])
        print(f"subscription {name!r}: {sub['events_untaken']} untaken (lag), "
              f"{sub['events_in_flight']} in flight; taken through {heads}", file=out)
    return 0


def _recreated(part: dict[str, Any]) -> str:
    """What the UI's partitions table says of a recreated partition (log/incarnation.py)."""
    if part.get("incarnation", ORIGINAL) == ORIGINAL:
        return ""
    if part.get("incarnation_pending"):  # its start offset is no fact yet
        return (f"; recreated storage (id {part['incarnation']}), start not recorded: "
                "recreate cut short")
    return (f"; recreated storage (id {part['incarnation']}), from offset "
            f"{part['incarnation_start_offset']}")

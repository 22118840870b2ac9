"""Offset ranges of a channel partition, as the export plans, records and reports them.

A Range is (start, end) with end exclusive, like Python's range and Kafka's log end
offset. The commit records (commit_records.py) hold lists of them per partition; a run
writes what it reserved less what they hold (Exporter._plan).
"""
from __future__ import annotations

Range = tuple[int, int]  # [start, end): end exclusive


def merge(ranges: list[Range]) -> list[Range]:
    """The ranges sorted, with touching or overlapping ones joined."""
    merged: list[Range] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def subtract(wanted: Range, done: list[Range]) -> list[Range]:
    """The parts of `wanted` no range in `done` covers."""
    pieces = [wanted]
    for start, end in done:
        pieces = [piece for s, e in pieces
                  for piece in ((s, min(e, start)), (max(s, end), e)) if piece[0] < piece[1]]
    return pieces

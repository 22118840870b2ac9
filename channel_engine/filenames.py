"""File-name rules of a partition directory, in one place.

Segments are named by their base offset zero-padded to 20 digits, so that
`ls` sorts them numerically (Kafka's LogFileUtils.filenamePrefixFromOffset).
"""
from __future__ import annotations

import re
from pathlib import Path

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
TMP_SUFFIX = ".tmp"

LOCK_FILE = ".lock"
LOG_STATE_FILE = "log.state"

_SEGMENT_FILE = re.compile(r"^(\d{20})(\.log|\.index|\.timeindex)$")


def offset_prefix(offset: int) -> str:
    """Return the 20-digit zero-padded file-name prefix of a base offset."""
    return f"{offset:020d}"


def segment_file(directory: Path, base_offset: int, suffix: str) -> Path:
    """Return the path of one file of the segment with this base offset."""
    return directory / (offset_prefix(base_offset) + suffix)


def parse_segment_file(name: str) -> tuple[int, str] | None:
    """Return (base offset, suffix) for a segment file name, or None for any other name."""
    match = _SEGMENT_FILE.match(name)
    if match is None:
        return None
    return int(match.group(1)), match.group(2)

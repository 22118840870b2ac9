"""File-name rules of a partition directory, in one place.

Segments are named by their base offset zero-padded to 20 digits, so that
`ls` sorts them numerically (Kafka's LogFileUtils.filenamePrefixFromOffset).

Names the engine writes besides segments: `log.state`, `incarnation`, `.lock`, `*.tmp` and
`*.deleted` (its own leftovers, deleted by the next writable open), `<base>.repair`
(a read met damage there), and files it keeps and never deletes or loads:
`<base>.log.damaged-<position>` (damaged bytes cut out of a segment) and
`<name>.stray` (a file it did not write, moved aside). Any other name is a stray.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
TMP_SUFFIX = ".tmp"
DAMAGED_SUFFIX = ".damaged"    # a damaged original kept: <name>.damaged, or
                               # <name>.damaged-<tag> (<base>.log.damaged-<position>)
STRAY_SUFFIX = ".stray"        # a file the engine did not write, moved aside, kept
REPAIR_SUFFIX = ".repair"      # <base>.repair: CRC-walk that segment at the next writable open

LOCK_FILE = ".lock"
SOCKET_NAME = "owner.sock"  # the owner's Unix socket in the channel home (owner/)
LOG_STATE_FILE = "log.state"
INCARNATION_FILE = "incarnation"  # a recreated partition's (log/incarnation.py)

_SEGMENT_FILE = re.compile(r"^(\d{20})(\.log|\.index|\.timeindex)$")
_REPAIR_FILE = re.compile(r"^(\d{20})\.repair$")


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


def is_kept_aside(name: str) -> bool:
    """True for the names of files the engine keeps but never loads (damaged bytes, strays)."""
    return name.endswith((DAMAGED_SUFFIX, STRAY_SUFFIX)) or f"{DAMAGED_SUFFIX}-" in name


def aside_path(path: Path, suffix: str) -> Path:
    """A free name beside `path` ending in `suffix` (never an earlier kept file's)."""
    target = path.with_name(path.name + suffix)
    n = 1
    while os.path.lexists(target):
        target, n = path.with_name(f"{path.name}.{n}{suffix}"), n + 1
    return target


def recreate_temp_dir(partition_dir: Path) -> Path:
    """The temp name a recreated partition directory is made under before its rename into
    place (log/partition_log.py): `<name>-<i>.tmp` beside it. A crash before the rename
    leaves it: the next recreate uses it, verify lists it, a delete removes it."""
    return partition_dir.with_name(partition_dir.name + TMP_SUFFIX)


def parse_repair_marker(name: str) -> int | None:
    """Base offset named by a `<20 digits>.repair` marker, or None for any other name."""
    match = _REPAIR_FILE.match(name)
    return int(match.group(1)) if match else None

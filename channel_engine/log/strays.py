"""Strays in a partition directory: entries the engine did not write, its own leftovers.

Steps 1, 3 and 4 of the load sequence (loader.py), and verify's view of the same
rules (tools/verify.py):
  * a stray entry (stray_reason): a name the engine never uses, a directory or a
    symlink where a file belongs, a `.lock` or `log.state` that is not a regular file (an
    `incarnation` that is not is damage instead: log/incarnation.py). A writer renames
    it `<name>.stray` (atomic_file.move_aside: never over another file), never deletes
    it, and reports STRAY_MOVED; a reader ignores it;
  * the engine's own leftovers (delete_leftovers): `*.deleted`, `*.tmp`, and index
    files with no `.log`, deleted and reported (STRAY_FILE_DELETED);
  * a stray segment: a `.log` whose first two batches are intact and name other
    offsets than its file name, a non-empty `.log` at or past a clean log's end
    (segment_stray_reason), an empty (all-zero) `.log` that is not the last, or the
    last one outside [previous segment's end .. max(that end, known end, log start)]
    (empty_last_reason): moved aside with its indexes deleted (they are derived from
    a file not ours).

Owns no bytes: reads batch headers (record_batch.py) to tell a segment's first
offsets. Concurrency: called by the loader while it opens the directory, before
any other thread uses it. Failures: OSError of a rename or unlink propagates (the
open fails, nothing is lost: the next open sorts the directory out again).
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

from channel_engine.atomic_file import move_aside
from channel_engine.errors import InvalidBatch
from channel_engine.filenames import (
    DELETED_SUFFIX,
    INCARNATION_FILE,
    INDEX_SUFFIX,
    LOCK_FILE,
    LOG_STATE_FILE,
    LOG_SUFFIX,
    STRAY_SUFFIX,
    TIME_INDEX_SUFFIX,
    TMP_SUFFIX,
    is_kept_aside,
    parse_repair_marker,
    parse_segment_file,
    segment_file,
)
from channel_engine.log.record_batch import HEADER_SIZE, check_batch, is_zero
from channel_engine.log.recovery import (
    STRAY_FILE_DELETED,
    STRAY_MOVED,
    RecoveryAction,
    RecoveryReport,
)


def segment_files(directory: Path) -> list[tuple[int, str]]:
    found = []
    for name in os.listdir(directory):
        parsed = parse_segment_file(name)
        if parsed is not None and os.path.isfile(directory / name):
            found.append(parsed)
    return found


def stray_reason(directory: Path, name: str) -> str | None:
    """Why a directory entry is a file the engine did not write, or None if it is one of
    the engine's own (a segment file, log.state, .lock, a leftover, a file kept aside)."""
    path = directory / name
    if name == INCARNATION_FILE:  # anything under it is damage, never moved aside:
        return None  # the partition would count as its original storage (log/incarnation.py)
    if name in (LOCK_FILE, LOG_STATE_FILE):
        return None if path.is_file() else "not a regular file"
    if name.endswith((DELETED_SUFFIX, TMP_SUFFIX)) or is_kept_aside(name):
        return None
    if parse_segment_file(name) is None and parse_repair_marker(name) is None:
        return "a name the engine does not write"
    return None if path.is_file() and not path.is_symlink() else "not a regular file"


def move_strays(directory: Path, report: RecoveryReport) -> None:
    for name in sorted(os.listdir(directory)):
        why = stray_reason(directory, name)
        if why is not None and name != LOCK_FILE:
            _move_aside(directory / name, why, True, report)


def _move_aside(path: Path, why: str, writable: bool, report: RecoveryReport) -> None:
    """Rename a stray to `<name>.stray` (never over another file), or just report it."""
    if not writable:
        report.add(RecoveryAction(STRAY_MOVED, str(path), f"{why}; ignored (read-only open)"))
        return
    target = move_aside(path, STRAY_SUFFIX)
    report.add(RecoveryAction(STRAY_MOVED, str(path), f"{why}; moved to {target.name}"))


def delete_leftovers(directory: Path, report: RecoveryReport) -> None:
    files = segment_files(directory)
    logs = {base for base, suffix in files if suffix == LOG_SUFFIX}
    stray = [directory / name for name in os.listdir(directory)
             if name.endswith((DELETED_SUFFIX, TMP_SUFFIX))]
    stray += [segment_file(directory, base, suffix) for base, suffix in files if base not in logs]
    for path in stray:
        path.unlink(missing_ok=True)
        report.add(RecoveryAction(STRAY_FILE_DELETED, str(path), "left over from an earlier run"))


def segment_stray_reason(path: Path, base: int, clean_end: int | None) -> str | None:
    """Why a non-empty .log is not one of this log's segments (its first two batches are
    intact and name other offsets, or it lies at or past a clean log's end), else None."""
    size = path.stat().st_size
    if size == 0:
        return None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as buf:
        if is_zero(buf, 0, min(size, HEADER_SIZE)) and is_zero(buf, 0, size):
            return None  # empty: decided by stray_empty_last
        try:
            first = check_batch(buf, 0, size, None, verify_crc=True)
            second = check_batch(buf, first.size, size, first.next_offset, verify_crc=True)
        except InvalidBatch:
            second = None  # one batch, or damage after it: a damaged base field, or worse
    if second is not None and first.base_offset != base:
        # two intact batches that agree with each other and not with the name: not a
        # segment whose base offset field was damaged (the second would follow the name)
        return f"its batches start at offset {first.base_offset}, its name says {base}"
    if clean_end is not None and base >= clean_end:
        return f"base offset {base} is at or past the log end {clean_end} of a clean log"
    return None


def is_empty_segment(path: Path) -> bool:
    """True if a .log holds no byte but zeros (a new or preallocated empty segment)."""
    size = path.stat().st_size
    if size == 0:
        return True
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as buf:
        return is_zero(buf, 0, min(size, HEADER_SIZE)) and is_zero(buf, 0, size)


def sort_out_stray_segments(directory: Path, bases: list[int], clean_end: int | None,
                             writable: bool, report: RecoveryReport) -> list[int]:
    """The bases of real segments; strays among the .log files are moved aside (writable)
    and reported: foreign ones, and empty ones that are not the last."""
    kept = []
    for base in bases:
        path = segment_file(directory, base, LOG_SUFFIX)
        why = segment_stray_reason(path, base, clean_end)
        if why is not None:
            _move_segment_aside(path, why, writable, report)
        else:
            kept.append(base)
    real = []
    for i, base in enumerate(kept):
        path = segment_file(directory, base, LOG_SUFFIX)
        if i + 1 < len(kept) and is_empty_segment(path):
            _move_segment_aside(path, "an empty segment that is not the last", writable,
                                report)
        else:
            real.append(base)
    return real


def stray_empty_last(directory: Path, base: int, floor: int | None, log_start: int,
                     known_end: int | None, writable: bool, report: RecoveryReport) -> bool:
    """Move aside an empty last segment that is not the log's active one; `floor` is the end
    of the segment before it (None if none)."""
    path = segment_file(directory, base, LOG_SUFFIX)
    if not is_empty_segment(path):
        return False
    why = empty_last_reason(base, floor, log_start, known_end)
    if why is not None:
        _move_segment_aside(path, why, writable, report)
    return why is not None


def empty_last_reason(base: int, floor: int | None, log_start: int,
                      known_end: int | None) -> str | None:
    """Why an empty last segment is a stray, or None when it is the active one a roll made
    (at `floor`, the previous segment's end) or the loader made (at the known end after a
    hole, or at the log start); its base may lie between those."""
    if floor is None and known_end is None:
        return None  # no log.state and nothing before it: a new log
    ceiling = max(floor or 0, known_end or 0, log_start)
    if (floor is None or floor <= base) and base <= ceiling:
        return None
    return (f"an empty segment at offset {base}, outside "
            f"{floor if floor is not None else log_start}..{ceiling}")


def _move_segment_aside(path: Path, why: str, writable: bool, report: RecoveryReport) -> None:
    _move_aside(path, why, writable, report)
    if writable:
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            path.with_suffix(suffix).unlink(missing_ok=True)  # derived from a file not ours

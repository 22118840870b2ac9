"""Open a partition directory: clean up, load or recover each segment, report (Kafka's LogLoader).

Load sequence:
  1. Read log.state. A writer rewrites it with the clean flag clear before anything
     else, so a crash while loading counts as unclean.
  2. A writer deletes leftovers: *.deleted, *.tmp, and index files with no .log.
  3. Open segments in base-offset order:
     - after a clean shutdown: trust lengths, check the indexes against the log
       (rebuild them when wrong) and the last segment's end against log.state
       (recover that segment when they disagree);
     - after an unclean shutdown: segments wholly below the recovery point are
       checked like clean ones; the one holding the recovery point and every
       later one are recovered: every batch walked, CRC-checked from the
       recovery point on, indexes rebuilt, the file cut at the first invalid
       or partial batch (a preallocated zero tail is cut and reported as such);
     - without a readable log.state: every segment is recovered with full CRC.
  4. A writer deletes segments wholly below the log start offset (a retention that
     crashed after raising it), and empty segments that are not the last.
  5. Later segments are kept after a truncation (Kafka deletes them): their
     batches were committed, and the missing offsets are reported as a gap.
  6. At least one segment exists; after recovery everything is fsynced and the
     recovery point is the log end. If the log now ends below what log.state knew
     was on disk (in policy durability: below the log end it recorded, since appends
     there return before their fsync), the loss is reported and the log continues
     after the hole: an offset once committed is never handed out again.
A reader (writable=False) never writes and takes no lock: it gets a snapshot of the
valid prefix of each segment as the files hold it at open time, including batches whose
writer has not returned from fsync yet (what kafka-dump-log shows). Live readers in other
processes that must see committed events only are bounded by offsets the writer hands
them (the channel's shared state), not by this snapshot.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from channel_engine import log_state
from channel_engine.atomic_file import fsync_directory
from channel_engine.config import LogConfig
from channel_engine.errors import CorruptStateError
from channel_engine.filenames import (
    DELETED_SUFFIX,
    LOG_STATE_FILE,
    LOG_SUFFIX,
    TMP_SUFFIX,
    parse_segment_file,
    segment_file,
)
from channel_engine.log_state import LogState
from channel_engine.recovery import (
    GAP,
    INDEX_REBUILT,
    LOG_END_MISMATCH,
    SEGMENT_DELETED,
    STRAY_FILE_DELETED,
    TRUNCATED,
    ZERO_TAIL_CUT,
    RecoveryAction,
    RecoveryReport,
)
from channel_engine.segment import LogSegment

logger = logging.getLogger(__name__)


@dataclass
class LoadedLog:
    """The segments of an opened directory and what the loader decided."""

    segments: list[LogSegment]
    log_start_offset: int
    recovery_point: int
    report: RecoveryReport


def load(
    directory: Path, config: LogConfig, writable: bool, force_recovery: bool = False
) -> LoadedLog:
    """Open every segment of `directory`, recovering what needs it; see the module doc.

    force_recovery: CRC-check every batch from the log start offset, as after a crash
    with no recovery point (an operator's repair of damage below the recovery point)."""
    started = time.monotonic()
    report = RecoveryReport(str(directory))
    state_path = directory / LOG_STATE_FILE
    try:
        state = log_state.read(state_path)
        if state is None:
            report.state_problem = "log.state is missing"
    except CorruptStateError as exc:
        state, report.state_problem = None, str(exc)
    if state is not None and force_recovery:
        state = state.with_(clean_shutdown=False, recovery_point=state.log_start_offset)
    clean = bool(state and state.clean_shutdown)
    report.clean_shutdown = clean
    if writable and state is not None and (clean or force_recovery):
        log_state.write(state_path, state.with_(clean_shutdown=False))
    if writable:
        _delete_strays(directory, report)

    bases = log_bases(directory)
    log_start = state.log_start_offset if state else (bases[0] if bases else 0)
    recovery_point = state.recovery_point if state and not clean else None
    segments = []
    for i, base in enumerate(bases):
        seg = LogSegment.open(directory, base, index_max_bytes=config.segment_index_bytes,
                              index_interval_bytes=config.index_interval_bytes, writable=writable)
        next_base = bases[i + 1] if i + 1 < len(bases) else None
        if state is None:
            _recover(seg, 0, report)
        elif clean or (next_base is not None and next_base <= (recovery_point or 0)):
            _load_trusted(seg, report, expected_end=state.log_end_offset if clean and
                          next_base is None else None)
        else:
            _recover(seg, recovery_point or 0, report)
        segments.append(seg)
    report.segments = len(segments)

    if writable:
        segments = _drop_unneeded(segments, log_start, report)
    _report_gaps(segments, report, log_start)
    if writable and not segments:
        segments.append(LogSegment.create(
            directory, log_start, index_max_bytes=config.segment_index_bytes,
            index_interval_bytes=config.index_interval_bytes,
            preallocate_bytes=config.segment_bytes if config.preallocate else 0))
    log_end = segments[-1].next_offset if segments else log_start
    known_end = _report_lost_end(directory, state, clean or config.durability == "policy",
                                 log_end, report)
    if writable and known_end > log_end:
        # never hand out again an offset that was committed once: start after the hole
        if segments[-1].size == 0:
            segments.pop().delete_files()
        segments.append(LogSegment.create(
            directory, known_end, index_max_bytes=config.segment_index_bytes,
            index_interval_bytes=config.index_interval_bytes))
        log_end = known_end

    if writable:
        for seg in segments[:-1]:
            seg.on_become_inactive()
        for seg in segments:
            seg.flush()
        fsync_directory(directory)
        recovery_point = log_end
        log_state.write(state_path, LogState(log_start, recovery_point, log_end))
    else:
        recovery_point = log_end  # a reader's snapshot: every complete batch on disk
    report.recovery_point = recovery_point
    report.duration_ms = (time.monotonic() - started) * 1000
    if report.actions or not clean:
        level = logging.WARNING if report.lost_data else logging.INFO
        logger.log(level, "%s", report.summary())
    return LoadedLog(segments, log_start, recovery_point, report)


def log_bases(directory: Path) -> list[int]:
    """Base offsets of the .log files in a partition directory, ascending."""
    return sorted({base for base, suffix in _segment_files(directory) if suffix == LOG_SUFFIX})


def _segment_files(directory: Path) -> list[tuple[int, str]]:
    found = []
    for name in os.listdir(directory):
        parsed = parse_segment_file(name)
        if parsed is not None:
            found.append(parsed)
    return found


def _delete_strays(directory: Path, report: RecoveryReport) -> None:
    files = _segment_files(directory)
    logs = {base for base, suffix in files if suffix == LOG_SUFFIX}
    stray = [directory / name for name in os.listdir(directory)
             if name.endswith((DELETED_SUFFIX, TMP_SUFFIX))]
    stray += [segment_file(directory, base, suffix) for base, suffix in files if base not in logs]
    for path in stray:
        path.unlink(missing_ok=True)
        report.add(RecoveryAction(STRAY_FILE_DELETED, str(path), "left over from an earlier run"))


def _load_trusted(seg: LogSegment, report: RecoveryReport, expected_end: int | None) -> None:
    problem = seg.load_clean()
    if problem is not None and problem[0] == "index":
        report.add(RecoveryAction(INDEX_REBUILT, str(seg.offset_index.path), problem[1]))
        scan = seg.rebuild_indexes()
        problem = None if scan.problem is None else ("log", scan.problem.reason)
    if problem is None and expected_end is not None and seg.next_offset != expected_end:
        problem = ("end", f"log ends at offset {seg.next_offset}, log.state says {expected_end}")
    if problem is None:
        return
    report.add(RecoveryAction(LOG_END_MISMATCH, str(seg.log_path), problem[1]))
    _recover(seg, seg.base_offset, report)


def _recover(seg: LogSegment, verify_from: int, report: RecoveryReport) -> None:
    file_size = seg.file_size
    result = seg.recover(verify_from)
    report.segments_scanned += 1
    report.bytes_scanned += result.valid_bytes
    report.batches_scanned += result.batches
    problem = result.problem
    if problem is None:
        return
    dropped = file_size - result.valid_bytes
    if problem.kind == "zero_tail":
        report.add(RecoveryAction(ZERO_TAIL_CUT, str(seg.log_path), problem.reason,
                                  result.valid_bytes, dropped))
        return
    report.add(RecoveryAction(TRUNCATED, str(seg.log_path), f"{problem.kind}: {problem.reason}",
                              result.valid_bytes, dropped, first_offset_lost=seg.next_offset))


def _drop_unneeded(
    segments: list[LogSegment], log_start: int, report: RecoveryReport
) -> list[LogSegment]:
    kept = []
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        below_start = seg.next_offset <= log_start and not (last and seg.next_offset == log_start
                                                              and seg.size == 0)
        if below_start or (seg.size == 0 and not last):
            why = "wholly below the log start offset" if below_start else "empty, not the last"
            report.add(RecoveryAction(SEGMENT_DELETED, str(seg.log_path), why))
            seg.delete_files()
        else:
            kept.append(seg)
    return kept


def _report_gaps(segments: list[LogSegment], report: RecoveryReport, log_start: int) -> None:
    if segments and segments[0].base_offset > log_start:
        first = segments[0]
        report.add(RecoveryAction(
            GAP, str(first.log_path),
            f"offsets {log_start}..{first.base_offset - 1} after the log start are missing",
            first_offset_lost=log_start, next_offset_kept=first.base_offset))
    for seg, nxt in zip(segments, segments[1:], strict=False):
        if seg.next_offset != nxt.base_offset:
            report.add(RecoveryAction(
                GAP, str(nxt.log_path),
                f"offsets {seg.next_offset}..{nxt.base_offset - 1} are missing",
                first_offset_lost=seg.next_offset, next_offset_kept=nxt.base_offset))


def _report_lost_end(directory: Path, state: LogState | None, trust_end: bool, log_end: int,
                     report: RecoveryReport) -> int:
    """Report a log that ends below what log.state knew was on disk (a damaged or lost
    segment file), or, with trust_end (a clean shutdown, or policy durability, where an
    append returns before its fsync), below the end it knew was handed out; return that
    end offset."""
    if state is None:
        return log_end
    known = state.log_end_offset if trust_end else state.recovery_point
    if log_end < known:
        report.add(RecoveryAction(
            GAP, str(directory),
            f"the log ends at offset {log_end}, but offsets up to {known - 1} were on disk; "
            f"the next offset is {known}", first_offset_lost=log_end, next_offset_kept=known))
    return known

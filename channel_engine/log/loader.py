"""Open a partition directory: clean up, load or recover each segment, report (Kafka's LogLoader).

Load sequence (steps 1, 3 and 4: strays.py; step 2: known_end.py):
  1. A writer moves strays aside first: entries the engine did not write (names it
     never uses, directories, symlinks) are renamed `<name>.stray`, never deleted,
     and reported (STRAY_MOVED).
  2. Read log.state. A writer rewrites it with the clean flag clear before anything
     else, so a crash while loading counts as unclean. What it knew was committed
     (known_committed_end: a clean log's end; after an unclean shutdown the largest of
     its committed-end record, which the writer rewrites in place at every commit
     (state.py), its recovery point and, in policy durability, where an append
     returns before its fsync, the end it recorded) is remembered as the known end,
     even by force_recovery: no offset below it is handed out again. After an unclean
     shutdown (or without log.state) the known end is raised to one past the largest
     offset the last segment's offset index names (index_evidence_end, read before
     any file changes, also when that .log is gone): an entry is written after its
     batch, and a kill keeps both. So an active segment destroyed after a kill
     (deleted, cut to zero, replaced by a directory) is counted lost up to the known
     end, though the first batch of a segment is never indexed; and its empty or
     missing file is told from a roll's clean empty segment by that end: a roll's new
     segment starts at the known end, a destroyed one below it.
  3. A writer deletes the engine's own leftovers: *.deleted, *.tmp, and index files
     with no .log.
  4. Stray segments are moved aside (or, read-only, ignored): a .log whose first two
     batches are intact and name other offsets than its file name; a non-empty .log
     at or past a clean log's end; an empty (all-zero) .log that is not the last, or
     that is the last but lies outside [previous segment's end .. max(that end, known
     end, log start)] (a roll makes the active segment at the previous end, the
     loader after a hole at the known end, retention at the log start).
  5. Open segments in base-offset order:
     - after a clean shutdown: trust lengths, check the indexes against the log
       (rebuild them when wrong), every batch's CRC (config.verify_on_open: damage
       is counted at open, before events_untaken promises its events; about 0.2 s
       of CPU per GB), the last segment's end against log.state, and every
       segment's end against the next one's base (recover when any disagrees);
     - after an unclean shutdown: segments wholly below the recovery point are
       checked like clean ones; the one holding the recovery point and every
       later one are recovered: every batch walked and CRC-checked (from the
       recovery point on only when verify_on_open is off), indexes rebuilt;
     - without a readable log.state, for a segment split off in this open, or one a
       read found damaged (a `<base>.repair` marker): every batch CRC-checked.
     A zero tail after the last batch is cut and reported as no data (ZERO_TAIL_CUT).
     A trusted segment whose batches end at the next segment's base with only zeros
     after them is a roll a crash stopped before its trim (preallocated, or fsync
     durability's zeros ahead): ZERO_TAIL_CUT alone, not LOG_END_MISMATCH.
     A batch whose base offset field alone is damaged is rewritten in place
     (BASE_OFFSET_REPAIRED, nothing lost; a reader's view counts it lost).
     Damage (an invalid batch that is not a zero tail) never cuts intact batches:
     damage.find_next_batch looks for the next intact batch whose base offset is
     above the offset expected next and below the segment's bound (the next
     segment's base, or a clean log's end). If there is one, the segment is split
     (LogSegment.repair_damage: damaged bytes kept in `<.log>.damaged-<position>`,
     the intact rest becomes a new segment, loaded next): DAMAGE_SPLIT, the lost
     offsets [expected, next intact base). If there is none, the file is cut at
     the damage (TRUNCATED): counted as lost offsets up to the bound that was known
     durable (the next segment's base, or the known end) with the damaged bytes
     kept aside. Past the known end of the last segment, the bytes decide
     (LogSegment.damaged_tail_end): complete batches (the length fits, or the CRC
     holds over the bytes up to the data's end) with no all-zero sector piece were
     written whole (a kill tears a write only at a page boundary, leaving such a
     piece): damage, their offsets counted lost
     and never handed out again; anything else is a torn tail (a write whose commit
     never returned), cut without counting. A batch at or past the next segment's base
     after damage is a copy a crashed repair left: the damaged region is kept aside
     and the copies cut.
  6. A writer deletes segments wholly below the log start offset (a retention that
     crashed after raising it), and segments that a repair emptied, if not the last.
  7. Later segments are kept after a truncation (Kafka deletes them): their
     batches were committed, and the missing offsets are reported as a gap (one
     action per lost range: a gap a repair already reported is not reported twice
     in one open; a later open reports the hole again, as a GAP).
  8. At least one segment exists; after recovery everything is fsynced and the
     recovery point is the log end. If the log now ends below the known end, the
     loss is reported and the log continues after the hole: an offset once
     committed is never handed out again. `.repair` markers are removed last.
A reader (writable=False) never writes and takes no lock: it gets a snapshot of the
valid prefix of each segment as the files hold it at open time, including batches whose
writer has not returned from fsync yet (what kafka-dump-log shows); it ignores strays
and splits nothing: its view of a damaged segment goes on after the damage
(LogSegment.view_past_damage), and its reads skip the damaged bytes. Live readers in
other processes that must see committed events only are bounded by offsets the writer
hands them (the channel's shared state), not by this snapshot.
Limits: in an unclean log a non-empty segment past the recovery point cannot be told
from one rolled after the last log.state write, so it is loaded; after a damaged region,
an intact batch whose own base offset field is also damaged and that no batch follows is
taken at its word (offsets skipped, none reused). An active segment destroyed after a
kill together with log.state (damaged or lost too) is counted only as far as its index
entries name offsets: the batches after the last entry (the first batch of a segment
is never indexed) are neither counted nor kept from reuse. A damaged batch holding a
whole sector of zeros is taken for a torn write (uncounted). Power loss may keep an
index entry without its batch: its offsets are then counted lost though never committed
(a false alarm, never a reuse); in policy durability it may keep the committed-end
record without the batches it names, appends that were acknowledged: counted lost.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import CorruptStateError
from channel_engine.filenames import (
    LOG_STATE_FILE,
    LOG_SUFFIX,
    REPAIR_SUFFIX,
    offset_prefix,
    parse_repair_marker,
)
from channel_engine.log import state as log_state
from channel_engine.log.config import LogConfig
from channel_engine.log.known_end import end_of_losses, known_committed_end, report_lost_end
from channel_engine.log.recovery import (
    BASE_OFFSET_REPAIRED,
    DAMAGE_SPLIT,
    GAP,
    INDEX_REBUILT,
    LOG_END_MISMATCH,
    SEGMENT_DELETED,
    TRUNCATED,
    ZERO_TAIL_CUT,
    RecoveryAction,
    RecoveryReport,
)
from channel_engine.log.segment import LogSegment, ScanResult, SegmentConfig
from channel_engine.log.state import LogState
from channel_engine.log.strays import (
    delete_leftovers,
    move_strays,
    segment_files,
    sort_out_stray_segments,
    stray_empty_last,
)

logger = logging.getLogger(__name__)


@dataclass
class LoadedLog:
    """The segments of an opened directory and what the loader decided."""

    segments: list[LogSegment]
    log_start_offset: int
    recovery_point: int
    report: RecoveryReport


@dataclass(frozen=True)
class _Limits:
    """What bounds one segment: `bound`, the offset its batches stay below (the next
    segment's base, or a clean log's end; None when unknown); `durable_end`, the offset
    below which its offsets were known to be on disk (damage there is counted as lost)."""

    bound: int | None
    durable_end: int | None


@dataclass(frozen=True)
class _Known:
    """What log.state told the loader (see load)."""

    has_state: bool
    clean: bool
    recovery_point: int | None  # None after a clean shutdown
    clean_end: int | None
    known_end: int | None
    log_start: int


def load(
    directory: Path, config: LogConfig, writable: bool, force_recovery: bool = False
) -> LoadedLog:
    """Open every segment of `directory`, recovering what needs it; see the module doc.

    force_recovery: CRC-check every batch from the log start offset, as after a crash
    with no recovery point (an operator's repair of damage below the recovery point)."""
    started = time.monotonic()
    report = RecoveryReport(str(directory))
    state_path = directory / LOG_STATE_FILE
    if writable:
        move_strays(directory, report)
    try:
        state = log_state.read(state_path)
        if state is None:
            report.state_problem = "log.state is missing"
    except CorruptStateError as exc:
        state, report.state_problem = None, str(exc)
    except IsADirectoryError:  # a read-only open moves no stray aside
        state, report.state_problem = None, f"{state_path} is a directory"
    # what log.state knew was on disk: never forgotten, not even by force_recovery
    clean_end = state.log_end_offset if state and state.clean_shutdown else None
    known_end = known_committed_end(directory, state, config.durability)
    if writable and state is not None and (state.clean_shutdown or force_recovery):
        log_state.write(state_path, state.with_(clean_shutdown=False))
    if state is not None and force_recovery:
        state = state.with_(clean_shutdown=False, recovery_point=state.log_start_offset)
    clean = bool(state and state.clean_shutdown)
    report.clean_shutdown = clean
    if writable:
        delete_leftovers(directory, report)

    log_start = state.log_start_offset if state else 0
    bases = sort_out_stray_segments(directory, log_bases(directory), clean_end, writable,
                                     report)
    if state is None:
        log_start = bases[0] if bases else 0
    recovery_point = state.recovery_point if state and not clean else None
    known = _Known(state is not None, clean, recovery_point, clean_end, known_end, log_start)
    segments = _open_segments(directory, config, bases, known, writable, report)
    report.segments = len(segments)

    if writable:
        segments = _drop_unneeded(segments, log_start, report)
    _report_gaps(segments, report, log_start)
    if writable and not segments:
        segments.append(LogSegment.create(directory, log_start, SegmentConfig.of(config)))
    log_end = segments[-1].next_offset if segments else log_start
    known_end = report_lost_end(directory, end_of_losses(known_end, report), log_end,
                                 report)
    if writable and known_end > log_end:
        # never hand out again an offset that was committed once: start after the hole
        if segments[-1].size == 0:
            segments.pop().delete_files()
        segments.append(LogSegment.create(  # not preallocated: it may stay empty for long
            directory, known_end, replace(SegmentConfig.of(config), preallocate_bytes=0)))
        log_end = known_end

    if writable:
        _make_durable(directory, segments, LogState(log_start, log_end, log_end,
                                                    committed_end=log_end))
    report.recovery_point = recovery_point = log_end  # a reader's: every complete batch
    report.duration_ms = (time.monotonic() - started) * 1000
    if report.actions or not clean:
        level = logging.WARNING if report.lost_data else logging.INFO
        logger.log(level, "%s", report.summary())
    return LoadedLog(segments, log_start, recovery_point, report)


def _make_durable(directory: Path, segments: list[LogSegment], state: LogState) -> None:
    """Seal all but the last segment, fsync every file and the directory, then write
    log.state (recovery point = log end) and remove the .repair markers now served."""
    for seg in segments[:-1]:
        seg.on_become_inactive()
    for seg in segments:
        seg.flush()
    fsync_directory(directory)
    log_state.write(directory / LOG_STATE_FILE, state)
    _clear_repair_markers(directory, repair_markers(directory))


def _open_segments(directory: Path, config: LogConfig, bases: list[int], known: _Known,
                   writable: bool, report: RecoveryReport) -> list[LogSegment]:
    """Load or recover each segment in base-offset order (step 5 of the module doc)."""
    repairs = repair_markers(directory)
    segments: list[LogSegment] = []
    fresh: set[int] = set()  # split off by a repair in this open: CRC-walked whole
    i = 0
    while i < len(bases):
        base = bases[i]
        next_base = bases[i + 1] if i + 1 < len(bases) else None
        i += 1
        floor = segments[-1].next_offset if segments else None  # where a roll starts one
        if next_base is None and stray_empty_last(directory, base, floor, known.log_start,
                                                   known.known_end, writable, report):
            continue
        seg = LogSegment.open(directory, base, SegmentConfig.of(config), writable=writable)
        limits = _Limits(next_base if next_base is not None else known.clean_end,
                         next_base if next_base is not None else known.known_end)
        if not known.has_state or base in repairs or base in fresh:
            split = _recover(seg, 0, limits, report)
        elif known.clean or (next_base is not None and next_base <= (known.recovery_point or 0)):
            split = _load_trusted(seg, report, limits, config.verify_on_open,
                                  expected_end=known.clean_end if next_base is None else None)
        else:
            split = _recover(seg, 0 if config.verify_on_open else known.recovery_point or 0,
                             limits, report)
        segments.append(seg)
        if split is not None and writable:
            bases.insert(i, split)
            fresh.add(split)
    return segments


def log_bases(directory: Path) -> list[int]:
    """Base offsets of the .log files in a partition directory, ascending."""
    return sorted({base for base, suffix in segment_files(directory) if suffix == LOG_SUFFIX})


def repair_markers(directory: Path) -> set[int]:
    """Base offsets named by `.repair` markers: segments a read found damaged."""
    return {base for base in map(parse_repair_marker, os.listdir(directory))
            if base is not None}


def mark_for_repair(directory: Path, base_offset: int) -> None:
    """Durably ask the next writable open to CRC-walk (and so repair) this segment."""
    marker = directory / f"{offset_prefix(base_offset)}{REPAIR_SUFFIX}"
    if not marker.exists():
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT, 0o644))
        fsync_directory(directory)


def _clear_repair_markers(directory: Path, repairs: set[int]) -> None:
    for base in repairs:
        (directory / f"{offset_prefix(base)}{REPAIR_SUFFIX}").unlink(missing_ok=True)
    if repairs:
        fsync_directory(directory)


def _load_trusted(seg: LogSegment, report: RecoveryReport, limits: _Limits, check_crcs: bool,
                  expected_end: int | None) -> int | None:
    problem = seg.load_clean()
    if problem is not None and problem[0] == "index":
        report.add(RecoveryAction(INDEX_REBUILT, str(seg.offset_index.path), problem[1]))
        scan = seg.rebuild_indexes()
        problem = None if scan.problem is None else ("log", scan.problem.reason)
    if problem is None and check_crcs and seg.check_crcs() is not None:
        # lengths are trusted, bytes are not: damage in a sealed segment is found here,
        # not by the take that would meet it after events_untaken promised its events
        return _recover(seg, seg.base_offset, limits, report)
    if problem is None and expected_end is not None and seg.next_offset != expected_end:
        problem = ("end", f"log ends at offset {seg.next_offset}, log.state says {expected_end}")
    if problem is None and limits.bound is not None and seg.next_offset > limits.bound:
        problem = ("end", f"log ends at offset {seg.next_offset}, past {limits.bound}")
    if problem is None:
        return None
    before = len(report.actions)
    split = _recover(seg, seg.base_offset, limits, report)
    found = [action.kind for action in report.actions[before:]]
    if (problem[0] == "log" and split is None and found == [ZERO_TAIL_CUT]
            and seg.next_offset == limits.bound):
        return None  # a roll's trim that a crash came before: the zeros of preallocation
    report.actions.insert(before, RecoveryAction(LOG_END_MISMATCH, str(seg.log_path),
                                                 problem[1]))
    return split


def _recover(seg: LogSegment, verify_from: int, limits: _Limits,
             report: RecoveryReport) -> int | None:
    """CRC-walk a segment and repair what it finds; return the base offset of a segment
    split off after damage (intact batches kept), else None."""
    file_size = seg.file_size
    result = seg.recover(verify_from)
    report.segments_scanned += 1
    for position, was, now in result.base_offsets_fixed:
        report.add(RecoveryAction(
            BASE_OFFSET_REPAIRED, str(seg.log_path),
            f"the batch at byte {position} said base offset {was} where offset {now} "
            "belongs (its CRC-32C holds; the field lies outside it): rewritten", position))
    while True:
        report.bytes_scanned += result.valid_bytes
        report.batches_scanned += result.batches
        found = result.resume_header
        if result.problem is None or found is None or result.resume_at is None or (
                limits.bound is not None and found.base_offset >= limits.bound):
            _cut_tail(seg, result, file_size, limits, report)
            return None
        if seg.writable:
            kept = seg.repair_damage(result.resume_at, result.data_end, True,
                                     found.base_offset)
            _report_split(seg, result, found.base_offset, kept[0].name, report)
            return found.base_offset
        _report_split(seg, result, found.base_offset, None, report)
        result = seg.view_past_damage(result)  # a reader: skip the damage in its view


def _cut_tail(seg: LogSegment, result: ScanResult, file_size: int, limits: _Limits,
              report: RecoveryReport) -> None:
    """The end of a walk with no intact batch after it (or only copies a later segment
    holds, left by a repair that crashed after writing that segment): cut, and count the
    offsets lost when they were known durable."""
    problem = result.problem
    if problem is None:
        return
    if problem.kind == "zero_tail":
        report.add(RecoveryAction(ZERO_TAIL_CUT, str(seg.log_path), problem.reason,
                                  result.valid_bytes, file_size - result.valid_bytes))
        return
    found, expected = result.resume_header, seg.next_offset
    damaged_end = result.resume_at if result.resume_at is not None else result.data_end
    durable = limits.durable_end
    if limits.bound is None and result.resume_at is None:
        # complete batches past the known end that are damaged, not torn, were written
        # whole (a kill tears only at a page boundary), so they were committed (lost)
        evidence = seg.damaged_tail_end(result.data_end)
        if evidence is not None and (durable is None or evidence > durable):
            durable = evidence
    counted = durable is not None and expected < durable
    kept = seg.repair_damage(damaged_end, result.data_end, counted, None) if seg.writable \
        else []
    why = f"{problem.kind}: {problem.reason}"
    if result.resume_at is not None:
        why += (f"; the batches from byte {result.resume_at} (offset "
                f"{found.base_offset if found else '?'}) on are held by the next segment")
    why += f"; damaged bytes kept in {kept[0].name}" if kept else ""
    report.add(RecoveryAction(TRUNCATED, str(seg.log_path), why, result.valid_bytes,
                              file_size - result.valid_bytes, first_offset_lost=expected,
                              next_offset_kept=durable if counted else None))


def _report_split(seg: LogSegment, result: ScanResult, resume_base: int, kept: str | None,
                  report: RecoveryReport) -> None:
    assert result.problem is not None and result.resume_at is not None
    where = (f"moved to {offset_prefix(resume_base)}{LOG_SUFFIX}, damaged bytes kept in "
             f"{kept}" if kept is not None
             else "read-only: skipped in this view, repaired by the next writable open")
    report.add(RecoveryAction(
        DAMAGE_SPLIT, str(seg.log_path),
        f"{result.problem.kind}: {result.problem.reason}; intact batches resume at byte "
        f"{result.resume_at} (offset {resume_base}): {where}",
        result.valid_bytes, result.resume_at - result.valid_bytes,
        first_offset_lost=seg.next_offset, next_offset_kept=resume_base))


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
    if segments and segments[0].base_offset > log_start \
            and not report.reports_loss_from(log_start):
        first = segments[0]
        report.add(RecoveryAction(
            GAP, str(first.log_path),
            f"offsets {log_start}..{first.base_offset - 1} after the log start are missing",
            first_offset_lost=log_start, next_offset_kept=first.base_offset))
    for seg, nxt in zip(segments, segments[1:], strict=False):
        if seg.next_offset != nxt.base_offset and not report.reports_loss_from(seg.next_offset):
            report.add(RecoveryAction(
                GAP, str(nxt.log_path),
                f"offsets {seg.next_offset}..{nxt.base_offset - 1} are missing",
                first_offset_lost=seg.next_offset, next_offset_kept=nxt.base_offset))



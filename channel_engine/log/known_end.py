"""The known committed end: the offset below which a partition's offsets were handed out.

Step 2 of the load sequence (loader.py), used by verify too. Read before any file
changes. A clean log's end; after an unclean shutdown the largest of log.state's
committed-end record (rewritten in place at every commit, state.py), its recovery
point, in policy durability its log end (an append returns before its fsync), and
the index evidence: one past the largest offset the last segment's offset index
names (index_evidence_end; an entry is written after its batch, and a kill keeps
both, so it proves offsets a damaged, cut or deleted active `.log` no longer
shows; power loss may keep an entry without its batch: a false alarm, never a
reuse). The loader never hands out again an offset below it, and reports a log
that now ends below it as a GAP (report_lost_end).

Owns no bytes: reads offset index entries as offset_index.py writes them (8 bytes:
relative offset, position). Concurrency: called by the loader and verify, before
any other thread uses the directory. Failures: an index file that cannot be read
is no evidence (None), never an error.
"""
from __future__ import annotations

from pathlib import Path

from channel_engine.filenames import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    segment_file,
)
from channel_engine.log import strays
from channel_engine.log.offset_index import ENTRY as OFFSET_ENTRY
from channel_engine.log.recovery import (
    GAP,
    RecoveryAction,
    RecoveryReport,
)
from channel_engine.log.state import LogState


def known_committed_end(directory: Path, state: LogState | None,
                        durability: str | None) -> int | None:
    """The end below which offsets were committed, as far as the files outside the
    segments tell (step 2 of the module doc; verify uses it too): a clean log's end; else
    the largest of log.state's committed-end record, its recovery point, in policy
    durability its log end, and the last segment's index evidence. Read before any file
    changes. durability None: unknown (verify of a lone partition directory)."""
    if state is not None and state.clean_shutdown:
        return state.log_end_offset
    ends = [] if state is None else [state.recovery_point]
    if state is not None and state.committed_end is not None:
        ends.append(state.committed_end)
    if state is not None and durability == "policy":
        # an append returns before its fsync: the end a version 1 file recorded was
        # handed out even after an unclean stop (a version 2 file's record says as much)
        ends.append(state.log_end_offset)
    # the active segment's index entries were written after their batches: a kill keeps
    # them, so they prove offsets a damaged or cut tail no longer shows
    evidence = index_evidence_end(directory)
    if evidence is not None:
        ends.append(evidence)
    return max(ends, default=None)


def index_evidence_end(directory: Path) -> int | None:
    """One past the largest offset the last segment's offset index names (entries that
    pass the index's own rules and name no more offsets than bytes before them), else
    None. Read at an unclean open, before any file is changed: also the index of an
    active .log that is gone. An entry is written after its batch, so a kill keeps no
    entry without its batch; power loss may (a false alarm, never a reuse)."""
    files = strays.segment_files(directory)
    logs = [base for base, suffix in files if suffix == LOG_SUFFIX]
    floor = max(logs, default=0)
    best = None
    for base, suffix in files:
        if suffix != INDEX_SUFFIX or base < floor:
            continue
        last = _last_plausible_entry(segment_file(directory, base, INDEX_SUFFIX))
        if last is not None and (best is None or base + last + 1 > best):
            best = base + last + 1
    return best


def _last_plausible_entry(path: Path) -> int | None:
    """The relative offset of the last entry of the longest plausible prefix of an
    offset index (both columns strictly increasing, offset <= position), else None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    last: tuple[int, int] | None = None
    for relative, position in OFFSET_ENTRY.iter_unpack(data[:len(data) - len(data) % 8]):
        if relative < 0 or relative > position or (
                last is not None and (relative <= last[0] or position <= last[1])):
            break
        last = (relative, position)
    return None if last is None else last[0]


def report_lost_end(directory: Path, known: int | None, log_end: int,
                     report: RecoveryReport) -> int:
    """Report a log that ends below what log.state knew was on disk (a damaged or lost
    segment file); return the end offset log.state knew of."""
    if known is None:
        return log_end
    if log_end < known and not report.reports_loss_from(log_end):
        report.add(RecoveryAction(
            GAP, str(directory),
            f"the log ends at offset {log_end}, but offsets up to {known - 1} were on disk; "
            f"the next offset is {known}", first_offset_lost=log_end, next_offset_kept=known))
    return max(known, log_end)


def end_of_losses(known: int | None, report: RecoveryReport) -> int | None:
    """The known end raised to the end of every reported lost range: those offsets
    existed once, so none of them is handed out again."""
    ends = [a.next_offset_kept for a in report.actions if a.next_offset_kept is not None]
    return max([*ends, *([known] if known is not None else [])], default=None)

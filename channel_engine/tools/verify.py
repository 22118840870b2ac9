"""Deep verification of a partition directory (kafka-dump-log's --deep-iteration,
--verify-index-only and --index-sanity-check in one pass). Read-only: it never
repairs; `python -m channel_engine recover` does.

Checks, each reported with the file and the byte position:
  * incarnation (a recreated partition's only: log/incarnation.py): a regular file,
    magic, version, CRC, and no older engine's `incarnation.stray` without it; its id
    and start offset are a note;
  * log.state: present, magic, version, both CRCs; after a clean shutdown, its log end
    offset equals the log's; after an unclean one, the log reaches the end the loader
    knows was committed (known_end.known_committed_end: the committed-end record, the
    recovery point, in policy durability the recorded log end, the active segment's
    index entries), else those offsets are lost (a destroyed or cut active segment);
  * every batch of every .log: length, magic, CRC-32C, record count, offsets
    contiguous from the file's base offset and across segments, every record
    decodes with the right offset and a timestamp <= the batch max timestamp;
  * a batch whose base offset field alone is wrong (its CRC holds; the field
    lies outside it): reported, the walk goes on (recovery rewrites the field);
  * damage inside a .log: each damaged region is reported with the offsets it
    loses, and the walk goes on at the next intact batch (damage.find_next_batch,
    the rule recovery uses: the intact batches after it are kept by the next
    writable open or `recover`); batches at or past the next segment's base after
    a damaged region are copies a crashed repair left (cut, nothing lost);
  * the tail: bytes after the last valid batch are damage, except the zero tail
    of the active segment of a preallocated log that is still open or crashed
    (recovery cuts it);
  * strays (log/strays.py's rules): names the engine does not write, directories,
    a .log whose first batch names another offset, lies past a clean log's end,
    or is empty and not the active segment: damage (moved aside to `.stray` by
    the next writable open). Files kept aside (`.stray`, `.damaged-*`) and
    `.repair` markers are notes;
  * .index: present, whole entries, increasing, each entry pointing at the start
    of a batch that ends at the entry's offset;
  * .timeindex: present, whole entries, increasing, each (T, o) naming the last
    offset of a batch whose max timestamp is T and T the largest so far.

The walk of one .log is log_scan.py's. A channel's home (verify_channel; the checks
are verify_home.py's) adds, never failing on what it finds:
  * channel.json: present, JSON, every setting valid, naming this home (when the
    caller supplies the config, from the appliance's database say, the file is
    still checked and the supplied config used);
  * the checkpoint and, with dual checkpoints, its backup: present and valid;
  * every commit journal: header, then every record up to the file's end; a torn
    tail (commit_journal's rule) and damage in the middle are both reported at
    the byte where the valid records end;
  * the key file, with encryption: it loads (JSON, mode 600, each key matching its
    check value) and opens the newest sealed batch of each partition;
  * the newest valid checkpoint's own journal (`commits-<S>.journal`, S its
    sequence): missing, not a regular file or without a whole header is damage
    (its header is synced before the checkpoint is written: commit_journal's
    rule); older checkpoints' journals (the backup's, say) may be gone;
  * `.lock`: anything but a regular file there is damage (open and recover move it
    aside);
  * strays: files in the home the engine (or the appliance) did not write, which
    `recover` moves aside as `<name>.stray`. Files kept aside by an earlier
    recover (`.damaged`, `.stray`) and temp files of an interrupted atomic write
    are notes; so are directories that are not a partition or the backup dir
    (another channel's partitions may share the directory): they are left alone;
  * then every partition directory, as above; one missing (gone, found empty where a
    checkpoint says the partition existed, or of a recreate cut short:
    tools/missing_storage.py) is reported as such with the operator's way out (mount
    the volume, or recreate; recreate again with the same next offsets), never as a
    partition's damaged files: recover refuses it.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from channel_engine.errors import (
    CorruptStateError,
    InvalidBatch,
    describe_os_error,
)
from channel_engine.filenames import (
    INDEX_SUFFIX,
    LOG_STATE_FILE,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    is_kept_aside,
    parse_repair_marker,
    recreate_temp_dir,
    segment_file,
)
from channel_engine.incarnations import ORIGINAL
from channel_engine.log import incarnation as incarnation_file
from channel_engine.log import record_batch
from channel_engine.log import state as log_state
from channel_engine.log.known_end import known_committed_end
from channel_engine.log.offset_index import ENTRY as OFFSET_ENTRY
from channel_engine.log.record_batch import BatchHeader
from channel_engine.log.strays import (
    empty_last_reason,
    is_empty_segment,
    segment_stray_reason,
    stray_reason,
)
from channel_engine.log.time_index import ENTRY as TIME_ENTRY
from channel_engine.queue.channel_config import ChannelConfig
from channel_engine.tools.log_scan import (
    Damage,
    LogFileScan,
    read_batch,
    scan_log_file,
    segment_files,
)
from channel_engine.tools.missing_storage import missing_partitions, why_missing
from channel_engine.tools.verify_home import HomeReport, check_config_file, verify_home


@dataclass
class VerifyReport:
    """The outcome of verifying one partition directory."""

    directory: str
    segments: int = 0
    batches: int = 0
    records: int = 0
    bytes: int = 0
    damages: list[Damage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is damaged."""
        return not self.damages

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable form."""
        out = asdict(self)
        out["ok"] = self.ok
        return out


def verify_partition(directory: Path, durability: str | None = None) -> VerifyReport:
    """Check every file of a partition directory; see the module doc. durability: the
    channel's, when known (the committed end of a version 1 log.state depends on it)."""
    report = VerifyReport(str(directory))
    state = _verify_state(directory, report)
    _verify_incarnation(directory, report)
    clean_end = state.log_end_offset if state and state.clean_shutdown else None
    known_end = known_committed_end(directory, state, durability)
    log_start = state.log_start_offset if state else 0
    bases = _verify_names(directory, clean_end, report)
    expected: int | None = None
    if state is not None and bases and bases[0] > log_start:
        report.damages.append(Damage(str(segment_file(directory, bases[0], LOG_SUFFIX)), 0,
                                     f"offsets {log_start}..{bases[0] - 1} after the log "
                                     "start are missing (gap)"))
    for i, base in enumerate(bases):
        last = i == len(bases) - 1
        path = segment_file(directory, base, LOG_SUFFIX)
        if last and is_empty_segment(path):
            why = empty_last_reason(base, expected, log_start, known_end)
            if why is not None:
                report.damages.append(Damage(str(path), 0, f"stray: {why} (moved aside at the "
                                                            "next writable open)"))
                continue
        if expected is not None and base != expected:
            report.damages.append(Damage(str(path), 0,
                                         f"offsets {expected}..{base - 1} are missing (gap)"))
        bound = bases[i + 1] if not last else clean_end
        expected = _verify_segment(directory, base, last, state, bound, report)
        report.segments += 1
    for base, suffix in segment_files(directory):
        if base not in bases and suffix != LOG_SUFFIX:
            report.notes.append(f"{segment_file(directory, base, suffix)}: index without a .log")
    if state is not None and state.clean_shutdown and expected is not None \
            and expected != state.log_end_offset:
        report.damages.append(Damage(str(directory / LOG_STATE_FILE), 24,
                                     f"log end offset {state.log_end_offset} but the log "
                                     f"ends at {expected}"))
    elif clean_end is None and known_end is not None and \
            (end := expected if expected is not None else log_start) < known_end:
        report.damages.append(Damage(
            str(directory / LOG_STATE_FILE), log_state.COMMITTED_END_AT,
            f"the log ends at offset {end}, but offsets up to {known_end - 1} were committed "
            f"(log.state's committed end, recovery point or the active index): offsets "
            f"{end}..{known_end - 1} lost (a destroyed or cut active segment)"))
    return report


def _verify_names(directory: Path, clean_end: int | None, report: VerifyReport) -> list[int]:
    """Report strays and kept-aside files; return the bases of the real segments."""
    for name in sorted(os.listdir(directory)):
        why = stray_reason(directory, name)
        if why is not None:
            report.damages.append(Damage(str(directory / name), 0,
                                         f"stray: {why} (moved aside at the next writable "
                                         "open)"))
        elif is_kept_aside(name):
            report.notes.append(f"{directory / name}: kept aside (never loaded)")
        elif parse_repair_marker(name) is not None:
            report.notes.append(f"{directory / name}: a read met damage in this segment "
                                "(repaired at the next writable open)")
    logs = sorted(base for base, suffix in segment_files(directory) if suffix == LOG_SUFFIX)
    foreign = {base: segment_stray_reason(segment_file(directory, base, LOG_SUFFIX), base,
                                          clean_end) for base in logs}
    ours = [base for base in logs if foreign[base] is None]
    for base in logs:
        path = segment_file(directory, base, LOG_SUFFIX)
        why = foreign[base]
        if why is None and base != ours[-1] and is_empty_segment(path):
            why = "an empty segment that is not the last"
            ours.remove(base)
        if why is not None:
            report.damages.append(Damage(str(path), 0, f"stray: {why} (moved aside at the "
                                                       "next writable open)"))
    return ours


def verify_channel(config: ChannelConfig | str | Path) -> dict[str, Any]:
    """Verify a whole channel (its home's files, then every partition); never raises for
    damage. Give the home, or a config (supplied, say, from a database)."""
    home = Path(config.home if isinstance(config, ChannelConfig) else config)
    supplied = config if isinstance(config, ChannelConfig) else None
    report = HomeReport(str(home))
    loaded = check_config_file(home, report)
    used = supplied or loaded
    verify_home(home, used, report)
    problems = [str(damage) for damage in report.damages]
    if used is None:
        report.notes.append("partitions not checked: no valid channel.json (supply the "
                            "settings: --config FILE)")
    partitions: list[dict[str, Any] | None] = []
    missing = dict(missing_partitions(used)) if used else {}
    for i in range(used.partitions if used else 0):
        directory = used.partition_dir(i) if used else home
        left = recreate_temp_dir(directory)
        if left.is_dir() and not left.is_symlink():
            report.notes.append(f"partition {i}: {left}: left by a recreate cut short before "
                                "its rename into place (the next recreate uses it, a "
                                "delete of the channel removes it)")
        if i in missing and used is not None:
            why = why_missing(used, directory)
            report.damages.append(Damage(str(directory), 0, f"partition {i}: {why}"))
            problems.append(f"partition {i}: {directory}: {why}")
            if not incarnation_file.cut_short(directory):  # nothing there to verify
                partitions.append(None)
                continue
        found = verify_partition(directory, used.durability if used else None)
        partitions.append(found.to_dict())
        report.damages += found.damages
        problems += [f"partition {i}: {damage}" for damage in found.damages]
    return {"channel": used.name if used else None, "home": str(home), "ok": not problems,
            "problems": problems, "damages": [asdict(d) for d in report.damages],
            "notes": report.notes, "strays": report.strays,
            "checkpoint_source": report.checkpoint_source, "partitions": partitions}


def _verify_state(directory: Path, report: VerifyReport) -> log_state.LogState | None:
    path = directory / LOG_STATE_FILE
    try:
        state = log_state.read(path)
    except CorruptStateError as exc:
        report.damages.append(Damage(str(path), 0, exc.reason))
        return None
    except IsADirectoryError:
        return None  # reported as a stray
    if state is None:
        report.damages.append(Damage(str(path), 0, "missing"))
    return state


def _verify_incarnation(directory: Path, report: VerifyReport) -> None:
    """A recreated partition's incarnation file reads (log/incarnation.py): the owner's
    open fails on a damaged one; absent is the original storage, no note."""
    try:
        found = incarnation_file.read(directory)
    except CorruptStateError as exc:
        report.damages.append(Damage(exc.path, exc.position, exc.reason))
        return
    if found.id != ORIGINAL:
        report.notes.append(f"{directory}: recreated storage, incarnation {found.id} "
                            f"starting at offset {found.start_offset}"
                            + (" (start not yet recorded)" if found.pending else ""))


def _verify_segment(directory: Path, base: int, last: bool, state: log_state.LogState | None,
                    bound: int | None, report: VerifyReport) -> int:
    path = segment_file(directory, base, LOG_SUFFIX)
    scan = scan_log_file(path, base, resync=True, bound=bound)
    fixable = {position for position, _, _ in scan.base_offsets_fixable}
    for position, header in scan.batches:
        if position not in fixable:  # its records decode from the damaged field
            _verify_records(path, position, header, report)
    for position, was, now in scan.base_offsets_fixable:
        report.records += next(h.record_count for p, h in scan.batches if p == position)
        report.damages.append(Damage(
            str(path), position, f"base offset field says {was} where offset {now} belongs "
            "(the CRC-32C holds): rewritten in place by the next writable open; no offset "
            "is lost"))
    report.batches += len(scan.batches)
    report.bytes += sum(header.size for _, header in scan.batches)
    for region in scan.damaged:
        report.damages.append(Damage(
            str(path), region.position,
            f"{region.problem.kind}: {region.problem.reason}; offsets {region.first_offset}.."
            f"{region.resume_offset - 1} lost; intact batches resume at byte {region.end} "
            "(kept by the next writable open or recover)"))
    problem = scan.problem
    if problem is not None:
        live = last and not (state and state.clean_shutdown)
        next_offset = scan.batches[-1][1].next_offset if scan.batches else base
        if problem.kind == "zero_tail" and live:
            report.notes.append(f"{path}: {problem.reason} after byte {scan.valid_bytes} "
                                "(preallocated active segment; cut at the next recovery)")
        elif problem.kind == "zero_tail" and not last and next_offset == bound:
            # as the loader takes it: a roll a kill stopped between the next segment's
            # create and this one's trim; nothing lost
            report.notes.append(f"{path}: {problem.reason} after byte {scan.valid_bytes}, "
                                f"its batches ending at the next segment's base {bound} "
                                "(a roll stopped before its trim; cut at the next open)")
        else:
            copies = (f"; the batches from byte {scan.superseded_at} on are copies the next "
                      "segment holds" if scan.superseded_at is not None else "")
            report.damages.append(Damage(str(path), scan.valid_bytes,
                                         f"{problem.kind}: {problem.reason}; "
                                         f"{scan.file_size - scan.valid_bytes} bytes after the "
                                         f"last valid batch{copies}"))
    _verify_offset_index(directory, base, scan, report)
    _verify_time_index(directory, base, scan, report)
    return scan.batches[-1][1].next_offset if scan.batches else base


def _verify_records(path: Path, position: int, header: BatchHeader, report: VerifyReport) -> None:
    if header.attributes & record_batch.ENCRYPTED_MASK:
        report.records += header.record_count  # sealed: CRC-checked, records need the key
        return
    try:
        offsets = []
        for offset, timestamp, *_ in record_batch.records(read_batch(path, position, header)):
            if timestamp > header.max_timestamp:
                raise InvalidBatch("corrupt", f"record {offset} timestamp {timestamp} > batch "
                                              f"max timestamp {header.max_timestamp}")
            offsets.append(offset)
        if offsets != list(range(header.base_offset, header.next_offset)):
            raise InvalidBatch("corrupt", f"record offsets {offsets[:3]}... do not run "
                                          f"{header.base_offset}..{header.last_offset}")
    except InvalidBatch as exc:
        report.damages.append(Damage(str(path), position, exc.reason))
        return
    report.records += len(offsets)


def _read_index(path: Path, entry_size: int, report: VerifyReport) -> bytes | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        report.damages.append(Damage(str(path), 0, "missing (rebuilt at the next open)"))
        return None
    except OSError as exc:  # not a regular file: the stray check reports it
        if path.is_file():
            report.damages.append(Damage(str(path), 0, f"cannot be read: "
                                                       f"{describe_os_error(exc)}"))
        return None
    if len(data) % entry_size:
        report.damages.append(Damage(str(path), len(data) - len(data) % entry_size,
                                     f"size {len(data)} is not a multiple of {entry_size}"))
    return data[: len(data) - len(data) % entry_size]


def _verify_offset_index(directory: Path, base: int, scan: LogFileScan,
                         report: VerifyReport) -> None:
    path = segment_file(directory, base, INDEX_SUFFIX)
    data = _read_index(path, OFFSET_ENTRY.size, report)
    if data is None:
        return
    starts = {position: header.last_offset for position, header in scan.batches}
    previous = (-1, -1)
    for i, (relative, position) in enumerate(OFFSET_ENTRY.iter_unpack(data)):
        where = i * OFFSET_ENTRY.size
        if relative <= previous[0] or position <= previous[1]:
            report.damages.append(Damage(str(path), where, f"entry {i} ({base + relative}, "
                                                           f"{position}) does not increase"))
        elif starts.get(position) != base + relative:
            found = starts.get(position)
            what = f"a batch ending at {found}" if found is not None else "no batch start"
            report.damages.append(Damage(str(path), where,
                                         f"entry {i}: offset {base + relative} -> byte "
                                         f"{position}, where the log has {what}"))
        previous = (relative, position)


def _verify_time_index(directory: Path, base: int, scan: LogFileScan,
                       report: VerifyReport) -> None:
    path = segment_file(directory, base, TIME_INDEX_SUFFIX)
    data = _read_index(path, TIME_ENTRY.size, report)
    if data is None:
        return
    running_max: dict[int, tuple[int, int]] = {}
    so_far = -1
    for _, header in scan.batches:
        so_far = max(so_far, header.max_timestamp)
        running_max[header.last_offset] = (header.max_timestamp, so_far)
    previous = (-(2**63), -1)
    for i, (timestamp, relative) in enumerate(TIME_ENTRY.iter_unpack(data)):
        where, offset = i * TIME_ENTRY.size, base + relative
        found = running_max.get(offset)
        if timestamp <= previous[0] or relative < previous[1]:
            reason = f"entry {i} ({timestamp}, {offset}) does not increase"
        elif found is None:
            reason = f"entry {i}: offset {offset} is not the last offset of a batch"
        elif found != (timestamp, timestamp):
            reason = (f"entry {i}: ({timestamp}, {offset}) but the batch max timestamp is "
                      f"{found[0]} and the max so far {found[1]}")
        else:
            reason = ""
        if reason:
            report.damages.append(Damage(str(path), where, reason))
        previous = (timestamp, relative)

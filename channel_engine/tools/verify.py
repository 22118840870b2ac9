"""Deep verification of a partition directory (kafka-dump-log's --deep-iteration,
--verify-index-only and --index-sanity-check in one pass). Read-only: it never
repairs; `python -m channel_engine recover` does.

Checks, each reported with the file and the byte position:
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
    loses, and the walk goes on at the next intact batch (segment.find_next_batch,
    the rule recovery uses: the intact batches after it are kept by the next
    writable open or `recover`); batches at or past the next segment's base after
    a damaged region are copies a crashed repair left (cut, nothing lost);
  * the tail: bytes after the last valid batch are damage, except the zero tail
    of the active segment of a preallocated log that is still open or crashed
    (recovery cuts it);
  * strays (log_loader's rules): names the engine does not write, directories,
    a .log whose first batch names another offset, lies past a clean log's end,
    or is empty and not the active segment: damage (moved aside to `.stray` by
    the next writable open). Files kept aside (`.stray`, `.damaged-*`) and
    `.repair` markers are notes;
  * .index: present, whole entries, increasing, each entry pointing at the start
    of a batch that ends at the entry's offset;
  * .timeindex: present, whole entries, increasing, each (T, o) naming the last
    offset of a batch whose max timestamp is T and T the largest so far.

A channel's home (verify_channel) adds, never failing on what it finds:
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
  * then every partition directory, as above.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from channel_engine.encryption import BatchSealer, KeyRing
from channel_engine.errors import (
    ChannelEngineError,
    CorruptStateError,
    DecryptionError,
    InvalidBatch,
    describe_os_error,
)
from channel_engine.filenames import (
    INDEX_SUFFIX,
    LOCK_FILE,
    LOG_STATE_FILE,
    LOG_SUFFIX,
    STRAY_SUFFIX,
    TIME_INDEX_SUFFIX,
    is_kept_aside,
    parse_repair_marker,
    parse_segment_file,
    segment_file,
)
from channel_engine.log import record_batch
from channel_engine.log import state as log_state
from channel_engine.log.damage import find_next_batch, fixable_base_offset
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
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal, home_files
from channel_engine.queue.channel_config import CONFIG_FILE, ChannelConfig
from channel_engine.queue.loss_ledger import LossLedger


@dataclass(frozen=True)
class Damage:
    """One thing wrong with one file."""

    path: str
    position: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: byte {self.position}: {self.reason}"


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


@dataclass(frozen=True)
class DamagedRegion:
    """Bytes [position, end) of a .log that hold no intact batch, followed by intact ones."""

    position: int
    end: int
    problem: InvalidBatch
    first_offset: int   # the offset expected at `position`
    resume_offset: int  # base offset of the intact batch at `end`


@dataclass
class LogFileScan:
    """The valid batches of one .log file and what follows them. With resync, damaged
    regions followed by intact batches are listed and the walk goes on after them;
    `problem` and `valid_bytes` then describe the end of the last walk."""

    path: Path
    batches: list[tuple[int, BatchHeader]]
    valid_bytes: int
    file_size: int
    problem: InvalidBatch | None
    damaged: list[DamagedRegion] = field(default_factory=list)
    superseded_at: int | None = None  # intact copies of a later segment's batches from here
    base_offsets_fixable: list[tuple[int, int, int]] = field(default_factory=list)


def scan_log_file(path: Path, expected_base: int | None, verify_crc: bool = True,
                  resync: bool = False, bound: int | None = None) -> LogFileScan:
    """Walk a .log file batch by batch until the end or the first invalid batch (with
    resync: to the end, over damaged regions followed by intact batches below `bound`)."""
    size = os.path.getsize(path)
    scan = LogFileScan(path, [], 0, size, None)
    if size:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as buf:
            position = 0
            while True:
                position, expected_base = _walk(buf, scan, position, expected_base,
                                                verify_crc)
                problem = scan.problem
                if not resync or problem is None or problem.kind == "zero_tail" \
                        or expected_base is None:
                    break
                was = fixable_base_offset(buf, position, size, expected_base)
                if was is not None:  # only the base offset field is wrong: go on past it
                    header = record_batch.read_header(buf, position)._replace(
                        base_offset=expected_base)
                    scan.batches.append((position, header))
                    scan.base_offsets_fixable.append((position, was, expected_base))
                    position, expected_base = position + header.size, header.next_offset
                    scan.problem = None
                    continue
                found = find_next_batch(buf, position + 1, size, expected_base)
                if found is None:
                    break
                if bound is not None and found[1].base_offset >= bound:
                    scan.superseded_at = found[0]
                    break
                scan.damaged.append(DamagedRegion(position, found[0], problem, expected_base,
                                                  found[1].base_offset))
                position, expected_base, scan.problem = found[0], found[1].base_offset, None
    return scan


def _walk(buf: mmap.mmap, scan: LogFileScan, position: int, expected_base: int | None,
          verify_crc: bool) -> tuple[int, int | None]:
    size = scan.file_size
    while position < size:
        try:
            header = record_batch.check_batch(buf, position, size, expected_base, verify_crc)
        except InvalidBatch as exc:
            scan.problem = InvalidBatch(exc.kind, exc.reason)
            break
        scan.batches.append((position, header))
        position += header.size
        expected_base = header.next_offset
    scan.valid_bytes = position
    return position, expected_base


def read_batch(path: Path, position: int, header: BatchHeader) -> bytes:
    """Read one batch's bytes."""
    with open(path, "rb") as f:
        f.seek(position)
        return f.read(header.size)


def verify_partition(directory: Path, durability: str | None = None) -> VerifyReport:
    """Check every file of a partition directory; see the module doc. durability: the
    channel's, when known (the committed end of a version 1 log.state depends on it)."""
    report = VerifyReport(str(directory))
    state = _verify_state(directory, report)
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
    for base, suffix in _files(directory):
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
    logs = sorted(base for base, suffix in _files(directory) if suffix == LOG_SUFFIX)
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


@dataclass
class HomeReport:
    """What is wrong with the files of a channel's home (not its partitions)."""

    home: str
    damages: list[Damage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    strays: list[str] = field(default_factory=list)  # paths recover moves aside
    checkpoint_source: str | None = None
    checkpoint_sequence: int = 0


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
    for i in range(used.partitions if used else 0):
        directory = used.partition_dir(i) if used else home
        if not directory.is_dir():
            partitions.append(None)
            report.damages.append(Damage(str(directory), 0, f"partition {i}: missing"))
            problems.append(f"partition {i}: {directory} is missing")
            continue
        found = verify_partition(directory, used.durability if used else None)
        partitions.append(found.to_dict())
        report.damages += found.damages
        problems += [f"partition {i}: {damage}" for damage in found.damages]
    return {"channel": used.name if used else None, "home": str(home), "ok": not problems,
            "problems": problems, "damages": [asdict(d) for d in report.damages],
            "notes": report.notes, "strays": report.strays,
            "checkpoint_source": report.checkpoint_source, "partitions": partitions}


def check_config_file(home: Path, report: HomeReport) -> ChannelConfig | None:
    """channel.json of a home: its config, or None with the damage reported."""
    path = home / CONFIG_FILE
    try:
        config = ChannelConfig.load(path)
    except ChannelEngineError as exc:
        report.damages.append(Damage(str(path), _json_byte(str(exc)), _config_reason(exc)))
        return None
    if Path(config.checkpoint_dir).resolve() != home.resolve():
        report.damages.append(Damage(str(path), 0, f"checkpoint_dir {config.checkpoint_dir} "
                                                   f"is not this home"))
        return None
    return config


def _json_byte(message: str) -> int:
    marker = message.rfind("(byte ")
    digits = message[marker + 6:].split(":")[0].split(" ")[0] if marker >= 0 else ""
    return int(digits) if digits.isdigit() else 0


def _config_reason(exc: ChannelEngineError) -> str:
    reason = str(getattr(exc, "reason", exc))
    path_end = reason.find(": ")
    return reason[path_end + 2:] if reason.startswith("/") and path_end > 0 else reason


def verify_home(home: Path, config: ChannelConfig | None, report: HomeReport) -> None:
    """Check the checkpoints, commit journals and strays of a home into `report`."""
    backup = (Path(config.backup_checkpoint_dir) if config and config.use_dual_checkpoints
              and config.backup_checkpoint_dir else None)
    for directory in (home, backup):
        if directory is not None:
            _verify_checkpoint(directory / checkpoint_file.FILE_NAME, report)
    found = checkpoint_file.read_newest(home, backup)
    report.checkpoint_source = found.source
    report.checkpoint_sequence = found.checkpoint.sequence if found.checkpoint else 0
    sequence, why = report.checkpoint_sequence, None
    if sequence > 0:
        why = commit_journal.checkpoint_journal_problem(home, sequence)
        if why is not None:
            report.damages.append(Damage(
                str(commit_journal.journal_path(home, sequence)), 0,
                f"{why}, though checkpoint {sequence} ({found.source}) was written after its "
                "header was synced: the take commits since are unknown (open and recover "
                "report how many events may come back at most)"))
    for generation in commit_journal.generations(home):
        if generation != sequence or why is None:
            _verify_journal(commit_journal.journal_path(home, generation), report)
    if config is not None and config.encryption_key_file is not None:
        _verify_key_file(config, report)
    _verify_losses(home, report)
    lock = home / LOCK_FILE
    if os.path.lexists(lock) and not lock.is_file():
        report.damages.append(Damage(str(lock), 0, "not a regular file: the channel cannot be "
                                                   "locked (open and recover move it to "
                                                   f"{LOCK_FILE}{STRAY_SUFFIX})"))
    _find_strays(home, config, report)


def _verify_losses(home: Path, report: HomeReport) -> None:
    """Losses the channel recorded and no operator acknowledged are not sound: verify agrees
    with the channel's health (`recover --ack` acknowledges them)."""
    ledger = LossLedger.load(home, writable=False, expect_file=False, now_ms=0)
    reason = ledger.health_reason()
    if reason is not None:
        report.damages.append(Damage(str(ledger.path), 0, reason))


def _verify_key_file(config: ChannelConfig, report: HomeReport) -> None:
    """The key file cannot be rebuilt (restore it from a backup): report, never repair.
    It must load (its check values hold) and open the newest sealed batch of each
    partition (a key file without check values, or another channel's)."""
    path = str(config.encryption_key_file)
    why = "(restore the key file from a backup: without it, sealed batches are unreadable)"
    try:
        keys = KeyRing.load(path, str(config.encryption_active_key))
    except (ChannelEngineError, OSError, ValueError, RecursionError) as exc:
        report.damages.append(Damage(path, 0, f"{getattr(exc, 'reason', exc)} {why}"))
        return
    for partition in range(config.partitions):
        try:
            _open_newest_sealed_batch(config.partition_dir(partition),
                                      BatchSealer(keys, config.name, partition))
        except DecryptionError as exc:
            report.damages.append(Damage(path, 0, f"partition {partition}'s newest sealed "
                                                  f"batch does not open: {exc} {why}"))


def _open_newest_sealed_batch(directory: Path, sealer: BatchSealer) -> None:
    """Unseal the newest encrypted batch of a partition's newest non-empty segment, if any;
    DecryptionError if its key does not open it (damage is the partition check's)."""
    if not directory.is_dir():
        return
    for base in sorted((b for b, suffix in _files(directory) if suffix == LOG_SUFFIX),
                       reverse=True):
        path = segment_file(directory, base, LOG_SUFFIX)
        scan = scan_log_file(path, base)
        sealed = [(position, header) for position, header in scan.batches
                  if header.attributes & record_batch.ENCRYPTED_MASK]
        if sealed:
            position, header = sealed[-1]
            with open(path, "rb") as f:
                f.seek(position)
                record_batch.unseal(f.read(header.size), sealer)
            return
        if scan.batches:
            return


def _verify_checkpoint(path: Path, report: HomeReport) -> None:
    try:
        checkpoint_file.read(path)
    except FileNotFoundError:
        report.damages.append(Damage(str(path), 0, "missing"))
    except CorruptStateError as exc:
        report.damages.append(Damage(str(path), exc.position, exc.reason))


def _verify_journal(path: Path, report: HomeReport) -> None:
    try:
        found = commit_journal.scan(path)
    except (FileNotFoundError, CorruptStateError) as exc:
        report.damages.append(Damage(str(path), 0, str(getattr(exc, "reason", exc))))
        return
    if not found.ignored:
        return
    if found.torn_tail:
        why = (f"{found.problem}: {found.ignored} bytes after the last valid record (a torn "
               "append: a commit that never returned)")
    else:
        why = (f"{found.problem}; {found.unreadable_bytes} unreadable bytes, then "
               f"{len(found.after)} intact record(s) (commits that returned are unreadable)")
    report.damages.append(Damage(str(path), found.valid_bytes, why))


def _find_strays(home: Path, config: ChannelConfig | None, report: HomeReport) -> None:
    """Files in the home the engine did not write (home_files.py has the rule)."""
    found = home_files.find_strays(home, config)
    report.notes += found.notes
    for path in found.strays:
        report.strays.append(str(path))
        report.damages.append(Damage(str(path), 0, "a stray file the engine did not write "
                                                   f"(open and recover move it to "
                                                   f"{path.name}{STRAY_SUFFIX})"))


def _files(directory: Path) -> list[tuple[int, str]]:
    return [p for p in map(parse_segment_file, os.listdir(directory))
            if p is not None and os.path.isfile(segment_file(directory, p[0], p[1]))]


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
        if problem.kind == "zero_tail" and live:
            report.notes.append(f"{path}: {problem.reason} after byte {scan.valid_bytes} "
                                "(preallocated active segment; cut at the next recovery)")
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

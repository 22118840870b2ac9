"""`python -m channel_engine dump PATH`: print batches and records, index entries, or a home.

On a partition directory or a .log: every intact batch (kafka-dump-log's
format, or one JSON object per line), each damaged region with its byte, length,
reason and offsets (tools/verify.py's scan), then the batches after it; exit 1
when it met damage. On a .index or .timeindex: its entries. On a channel's home:
the checkpoints and the commit journals. Read-only: it opens nothing for
writing and takes no lock.
"""
from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path
from typing import Any, TextIO

from channel_engine.errors import (
    ChannelEngineError,
    InvalidBatch,
    UsageError,
    describe_os_error,
)
from channel_engine.filenames import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    parse_segment_file,
)
from channel_engine.log import record_batch
from channel_engine.log.offset_index import ENTRY as OFFSET_ENTRY
from channel_engine.log.record_batch import BatchHeader
from channel_engine.log.time_index import ENTRY as TIME_ENTRY
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal
from channel_engine.queue.channel_config import ChannelConfig
from channel_engine.tools.cli_paths import is_home
from channel_engine.tools.log_scan import (
    DamagedRegion,
    read_batch,
    scan_log_file,
)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Print what PATH holds; 1 when it met damage."""
    path: Path = args.path
    if is_home(path, args):
        return _dump_channel(path, args.json, out)
    if path.is_dir():
        files = sorted(path / name for name in map(str, [p.name for p in path.iterdir()])
                       if parse_segment_file(name))
    elif path.is_file() and parse_segment_file(path.name):
        files = [path]
    else:
        raise UsageError(f"{path}: not a partition directory or a segment file")
    damaged = False
    for file in files:
        if not args.json:
            print(f"Dumping {file}", file=out)
        if not file.is_file():  # a directory in a segment's place, say: the next file
            _emit(out, args.json, {"file": str(file), "error": "not a regular file"},
                  f"{file}: not a regular file (skipped)")
            damaged = True
            continue
        if file.suffix == LOG_SUFFIX:
            damaged |= _dump_log(file, args.print_data, args.json, out)
        else:
            _dump_index(file, args.json, out)
    return 1 if damaged else 0


def _dump_channel(home: Path, as_json: bool, out: TextIO) -> int:
    config = ChannelConfig.load(home)
    damaged = False
    for source, directory in (("primary", home), ("backup", _backup_dir(config))):
        if directory is None:
            continue
        path = directory / checkpoint_file.FILE_NAME
        try:
            saved = checkpoint_file.decode(path.read_bytes(), path)
        except (OSError, ChannelEngineError) as exc:
            damaged = True
            _emit(out, as_json, {"checkpoint": source, "error": _reason(exc)},
                  f"{source} checkpoint {path}: {_reason(exc)}")
            continue
        _emit(out, as_json, {"checkpoint": source, "path": str(path),
                             "sequence": saved.sequence, "written_at_ms": saved.written_at_ms,
                             "version": saved.version,
                             "partitions": [vars(p) for p in saved.partitions],
                             "subscriptions": [{"id": s.id, "name": s.name,
                                                "queues": [vars(q) for q in s.queues]}
                                               for s in saved.subscriptions],
                             "next_subscription_id": saved.next_subscription_id,
                             "counters": dict(saved.counters),
                             "subscription_counters": {str(i): dict(c) for i, c
                                                       in saved.subscription_counters}},
              f"{source} checkpoint {path}: version {saved.version} sequence "
              f"{saved.sequence} written_at {saved.written_at_ms}")
        if not as_json:
            for i, p in enumerate(saved.partitions):  # the queue fields: `default`'s
                print(f"| partition {i}: log start {p.log_start_offset} recovery point "
                      f"{p.recovery_point} log end {p.log_end_offset} taken through "
                      f"{p.taken_through} committed {list(p.committed)} in flight "
                      f"{list(p.in_flight)} pending puts {list(p.pending_puts)}", file=out)
            for sub in saved.subscriptions:
                for i, q in enumerate(sub.queues):
                    print(f"| subscription {sub.name} (id {sub.id}) partition {i}: taken "
                          f"through {q.taken_through} committed {list(q.committed)} in "
                          f"flight {list(q.in_flight)}", file=out)
            print(f"| counters {dict(saved.counters)}", file=out)
            for sub_id, counters in saved.subscription_counters:
                print(f"| subscription id {sub_id} counters {dict(counters)}", file=out)
    for generation in commit_journal.generations(home):
        damaged |= _dump_journal(commit_journal.journal_path(home, generation), as_json, out)
    for i in range(config.partitions):
        _emit(out, as_json, {"partition": i, "directory": str(config.partition_dir(i))},
              f"partition {i}: {config.partition_dir(i)} (dump it for its segments)")
    return 1 if damaged else 0


def _dump_journal(path: Path, as_json: bool, out: TextIO) -> bool:
    """Print one journal's records, then what follows its valid ones; True if damaged."""
    try:
        found = commit_journal.scan(path)
    except (OSError, ChannelEngineError) as exc:
        _emit(out, as_json, {"journal": str(path), "error": _reason(exc)},
              f"journal {path}: {_reason(exc)}")
        return True
    _emit(out, as_json, {"journal": str(path), "records": len(found.commits),
                         "ignored_bytes": found.ignored, "position": found.valid_bytes,
                         "problem": found.problem, "torn_tail": found.torn_tail},
          f"journal {path}: {len(found.commits)} records, {found.ignored} bytes ignored"
          + (f" (byte {found.valid_bytes}: {found.problem}"
             f"{'' if found.torn_tail else '; damage: intact records follow'})"
             if found.ignored else ""))
    for commit in found.commits:
        kind = "put" if commit.kind == commit_journal.PUT else "take"
        of = f" of subscription id {commit.subscription}" if commit.subscription else ""
        _emit(out, as_json, {"kind": kind, "id": commit.commit_id,
                             "subscription": commit.subscription,
                             "entries": [list(e) for e in commit.entries]},
              f"| {kind} commit {commit.commit_id}{of}: "
              + ", ".join(f"partition {p} [{a}, {b})" for p, a, b in commit.entries))
    return found.damaged


def _reason(exc: Exception) -> str:
    """An error in words (an OSError's without its errno and path, which the line names)."""
    return describe_os_error(exc) if isinstance(exc, OSError) else str(exc)


def _backup_dir(config: ChannelConfig) -> Path | None:
    if config.use_dual_checkpoints and config.backup_checkpoint_dir:
        return Path(config.backup_checkpoint_dir)
    return None


def _emit(out: TextIO, as_json: bool, row: dict[str, Any], line: str) -> None:
    print(json.dumps(row) if as_json else line, file=out)


def _dump_log(path: Path, print_data: bool, as_json: bool, out: TextIO) -> bool:
    """Print every intact batch; a damaged region is reported (byte, length, reason, the
    offsets it holds) and the dump goes on at the next intact batch, as the engine reads
    (scan_log_file's resync). True if anything was damaged."""
    base = (parse_segment_file(path.name) or (0, ""))[0]
    scan = scan_log_file(path, base, resync=True)
    damaged = bool(scan.damaged or scan.base_offsets_fixable)
    regions = {region.position: region for region in scan.damaged}
    fixable = {position: was for position, was, _ in scan.base_offsets_fixable}
    for position, header in scan.batches:
        for at in sorted(p for p in regions if p < position):
            _dump_region(path, regions.pop(at), as_json, out)
        damaged |= _dump_batch(path, position, header, print_data, as_json, out)
        if position in fixable:
            _emit(out, as_json, {"file": str(path), "position": position,
                                 "base_offset_field": fixable[position]},
                  f"| damaged: the base offset field says {fixable[position]} (its CRC "
                  f"holds; the next writable open rewrites it)")
    for at in sorted(regions):
        _dump_region(path, regions[at], as_json, out)
    invalid = scan.file_size - scan.valid_bytes
    if invalid:
        why = scan.problem.reason if scan.problem else ""
        if as_json:
            print(json.dumps({"file": str(path), "invalid_bytes": invalid,
                              "position": scan.valid_bytes, "reason": why}), file=out)
        else:
            print(f"Found {invalid} invalid bytes at the end of {path.name} "
                  f"(byte {scan.valid_bytes}: {why})", file=out)
    return damaged or bool(invalid)


def _dump_region(path: Path, region: DamagedRegion, as_json: bool, out: TextIO) -> None:
    length = region.end - region.position
    reason = f"{region.problem.kind}: {region.problem.reason}"
    _emit(out, as_json, {"file": str(path), "damaged_bytes": length,
                         "position": region.position, "reason": reason,
                         "first_offset": region.first_offset,
                         "resume_offset": region.resume_offset},
          f"Damaged region at byte {region.position} of {path.name}: {length} bytes "
          f"({reason}); offsets {region.first_offset}..{region.resume_offset - 1} unreadable; "
          f"intact batches resume at byte {region.end}")


def _dump_batch(path: Path, position: int, header: BatchHeader, print_data: bool,
                as_json: bool, out: TextIO) -> bool:
    """Print one CRC-checked batch (and its records); True if its records do not decode."""
    encrypted = bool(header.attributes & record_batch.ENCRYPTED_MASK)
    records: list[record_batch.Record] = []
    problem = None
    if print_data and not encrypted:
        try:
            records = list(record_batch.records(read_batch(path, position, header)))
        except InvalidBatch as exc:
            problem = exc.reason
    if as_json:
        row = _batch_dict(path, position, header)
        row["encrypted"] = encrypted
        if print_data and not encrypted:
            row["records"] = [_record_dict(r) for r in records]
        if problem is not None:
            row["records_error"] = problem
        print(json.dumps(row), file=out)
        return problem is not None
    print(_batch_line(position, header) + (" encrypted: true" if encrypted else ""), file=out)
    for record in records:
        print(_record_line(record), file=out)
    if problem is not None:
        print(f"| damaged: its records do not decode ({problem})", file=out)
    return problem is not None


def _batch_dict(path: Path, position: int, h: BatchHeader) -> dict[str, Any]:
    return {"file": str(path), "baseOffset": h.base_offset, "lastOffset": h.last_offset,
            "count": h.record_count, "position": position, "size": h.size, "magic": h.magic,
            "compresscodec": h.codec, "crc": h.crc, "isvalid": True,
            "baseTimestamp": h.first_timestamp, "maxTimestamp": h.max_timestamp,
            "partitionLeaderEpoch": h.leader_epoch, "producerId": h.producer_id}


def _batch_line(position: int, h: BatchHeader) -> str:
    return (f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.record_count} "
            f"baseSequence: {h.base_sequence} producerId: {h.producer_id} "
            f"partitionLeaderEpoch: {h.leader_epoch} position: {position} "
            f"CreateTime: {h.max_timestamp} size: {h.size} magic: {h.magic} "
            f"compresscodec: {h.codec} crc: {h.crc} isvalid: true")


def _text(value: bytes | None) -> str:
    if value is None:
        return "null"
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + value.hex()


def _record_line(record: record_batch.Record) -> str:
    offset, timestamp, key, value, headers = record
    names = ",".join(name for name, _ in headers)
    return (f"| offset: {offset} CreateTime: {timestamp} keySize: {len(key or b'')} "
            f"valueSize: {len(value or b'')} headerKeys: [{names}] key: {_text(key)} "
            f"payload: {_text(value)}")


def _json_bytes(value: bytes | None) -> Any:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode()}


def _record_dict(record: record_batch.Record) -> dict[str, Any]:
    offset, timestamp, key, value, headers = record
    return {"offset": offset, "timestamp": timestamp, "key": _json_bytes(key),
            "headers": {name: _json_bytes(v) for name, v in headers},
            "payload": _json_bytes(value)}


def _dump_index(path: Path, as_json: bool, out: TextIO) -> None:
    base, suffix = parse_segment_file(path.name) or (0, "")
    data = path.read_bytes()
    if suffix == INDEX_SUFFIX:
        for relative, position in OFFSET_ENTRY.iter_unpack(data[: len(data) // 8 * 8]):
            row = {"offset": base + relative, "position": position}
            print(json.dumps(row) if as_json else f"offset: {base + relative} "
                                                  f"position: {position}", file=out)
    elif suffix == TIME_INDEX_SUFFIX:
        for timestamp, relative in TIME_ENTRY.iter_unpack(data[: len(data) // 12 * 12]):
            row = {"timestamp": timestamp, "offset": base + relative}
            print(json.dumps(row) if as_json else f"timestamp: {timestamp} "
                                                  f"offset: {base + relative}", file=out)

"""Operator tools for a channel or a partition directory, in the spirit of
kafka-dump-log.sh and Flume's file channel integrity tool.

    python -m channel_engine produce PATH [--batch N] [--key K] [--header k=v]...
    python -m channel_engine dump PATH [--print-data] [--json]
    python -m channel_engine verify PATH [--config FILE] [--json]
    python -m channel_engine stat PATH [--json]
    python -m channel_engine recover PATH [--config FILE] [--json] [--ack]

PATH is a channel's home (its checkpoint_dir, holding channel.json), a partition
directory, or (dump) one .log, .index or .timeindex file. On a channel:
produce puts through the channel (as a client when another process owns it);
dump prints the checkpoints and the commit journals (on a partition: every intact
batch, each damaged region with its byte, length, reason and offsets, then the
batches after it, exit 1 when it met damage); verify reports every
damage of the home's files (channel.json, both checkpoint copies, the journals,
strays) and of every partition, without failing on any; stat prints the
channel's status and each partition's segments; recover repairs every damage
verify reports (tools/recover.py: journals cut at their first bad record,
damaged files kept aside, strays moved aside, every batch CRC-checked), opens
the channel as its owner, replays it and prints what it cost: events lost (by
offsets), take commits that may come back (at least once; "up to N events" when
a journal's content is unknown), files moved aside;
with --ack it then acknowledges every loss in the channel's loss ledger and
prints what it acknowledged.
--config FILE supplies the channel's settings (a JSON object, as channel.json
holds them) when channel.json is damaged or missing. A directory is a channel's
home when it holds channel.json, a checkpoint or a commit journal (or --config
is given), else a partition directory. Exit status: 0 success (verify: sound),
1 damage found or the operation failed, 2 bad usage.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO, cast

from channel_engine.channel import Channel
from channel_engine.errors import (
    ChannelEngineError,
    ConfigError,
    InvalidBatch,
    UsageError,
    describe_os_error,
)
from channel_engine.event import PendingEvent
from channel_engine.filenames import (
    DAMAGED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    parse_segment_file,
)
from channel_engine.log import record_batch
from channel_engine.log.config import LogConfig
from channel_engine.log.offset_index import ENTRY as OFFSET_ENTRY
from channel_engine.log.partition_log import PartitionLog
from channel_engine.log.record_batch import BatchHeader
from channel_engine.log.time_index import ENTRY as TIME_ENTRY
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal
from channel_engine.queue.channel_config import CONFIG_FILE, ChannelConfig
from channel_engine.queue.channel_owner import ChannelOwner
from channel_engine.tools.recover import RepairReport, repair
from channel_engine.tools.verify import (
    DamagedRegion,
    read_batch,
    scan_log_file,
    verify_channel,
    verify_partition,
)

CONFIG_HELP = ("the channel's settings, a JSON object as channel.json holds them (when "
               "channel.json is damaged or missing)")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         config: ChannelConfig | None = None) -> int:
    """Run one tool; return the exit status. `config` supplies the channel's settings
    (as --config FILE does) to verify and recover, from a database say."""
    out = out or sys.stdout
    parser = _parser()
    args = parser.parse_args(argv)
    args.supplied = config
    try:
        return int(args.run(args, out))
    except BrokenPipeError:  # `| head` closed the pipe: not an error
        sys.stderr.close()
        return 0
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ChannelEngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file or directory the tool met cannot be used
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{describe_os_error(exc) if where else exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m channel_engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    tools = parser.add_subparsers(dest="tool", required=True)

    produce = tools.add_parser("produce", help="append stdin lines as events")
    produce.add_argument("path", type=Path)
    produce.add_argument("--batch", type=int, default=100, help="events per batch (100)")
    produce.add_argument("--key", help="key of every event")
    produce.add_argument("--header", action="append", default=[], metavar="K=V",
                         help="a header of every event (repeatable)")
    produce.add_argument("--compression", default="none",
                         choices=sorted(record_batch.COMPRESSION_CODECS))
    produce.add_argument("--segment-bytes", type=int, default=LogConfig.segment_bytes)
    produce.set_defaults(run=_produce)

    dump = tools.add_parser("dump", help="print batches and records (or index entries)")
    dump.add_argument("path", type=Path)
    dump.add_argument("--print-data", action="store_true", help="print every record")
    dump.add_argument("--json", action="store_true", help="one JSON object per line")
    dump.set_defaults(run=_dump)

    verify = tools.add_parser("verify", help="deep CRC and index check; exit 1 on damage")
    verify.add_argument("path", type=Path)
    verify.add_argument("--config", type=Path, metavar="FILE", help=CONFIG_HELP)
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(run=_verify)

    stat = tools.add_parser("stat", help="the segments table")
    stat.add_argument("path", type=Path)
    stat.add_argument("--json", action="store_true")
    stat.set_defaults(run=_stat)

    recover = tools.add_parser("recover", help="repair every damage verify reports")
    recover.add_argument("path", type=Path)
    recover.add_argument("--config", type=Path, metavar="FILE", help=CONFIG_HELP)
    recover.add_argument("--json", action="store_true")
    recover.add_argument("--ack", action="store_true",
                         help="then acknowledge every recorded loss (a channel home only)")
    recover.set_defaults(run=_recover)
    return parser


def _require_dir(path: Path) -> None:
    if not path.is_dir():
        raise UsageError(f"{path}: no such partition directory")


def _is_channel(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file()


def _is_home(path: Path, args: argparse.Namespace) -> bool:
    """A channel's home, even with channel.json damaged or gone (see the module doc)."""
    if args.supplied is not None or getattr(args, "config", None) is not None:
        return True
    names = (CONFIG_FILE, CONFIG_FILE + DAMAGED_SUFFIX, checkpoint_file.FILE_NAME)
    return any(os.path.lexists(path / name) for name in names) or (
        path.is_dir() and bool(commit_journal.generations(path)))


def _supplied_config(args: argparse.Namespace) -> ChannelConfig | None:
    """The settings given by the caller (main's config) or in --config FILE."""
    if args.supplied is not None or args.config is None:
        return cast(ChannelConfig | None, args.supplied)
    try:
        document = json.loads(args.config.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError("config", f"{args.config}: cannot be read as JSON ({exc})") from exc
    return ChannelConfig.from_document(document, args.config)


# -- produce --------------------------------------------------------------------------------
def _produce(args: argparse.Namespace, out: TextIO) -> int:
    if args.batch < 1:
        raise UsageError("--batch must be at least 1")
    headers = {}
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--header {item!r}: expected K=V")
        headers[name] = value.encode()
    key = args.key.encode() if args.key is not None else None
    try:
        config = LogConfig(compression=args.compression, segment_bytes=args.segment_bytes)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if _is_channel(args.path):
        return _produce_to_channel(args, key, headers, out)
    events = batches = 0
    first = last = None
    with PartitionLog.open(args.path, config) as log:
        batch: list[PendingEvent] = []
        for line in sys.stdin.buffer:
            batch.append(PendingEvent(line.rstrip(b"\r\n"), key, headers or None))
            if len(batch) == args.batch:
                first, last = _append(log, batch, first)
                events, batches, batch = events + len(batch), batches + 1, []
        if batch:
            first, last = _append(log, batch, first)
            events, batches = events + len(batch), batches + 1
    span = f", offsets {first}..{last}" if events else ""
    print(f"appended {events} events in {batches} batches{span}", file=out)
    return 0


def _produce_to_channel(args: argparse.Namespace, key: bytes | None,
                        headers: dict[str, bytes], out: TextIO) -> int:
    events = transactions = 0
    with Channel.open(args.path) as channel:
        lines = iter(sys.stdin.buffer)
        while True:
            with channel.put() as tx:
                for line in lines:
                    tx.put(line.rstrip(b"\r\n"), key=key, headers=headers or None)
                    if len(tx) == args.batch:
                        break
                count = len(tx)
            if not count:
                break
            events, transactions = events + count, transactions + 1
    print(f"put {events} events in {transactions} transactions into channel "
          f"{channel.name!r}", file=out)
    return 0


def _append(log: PartitionLog, batch: list[PendingEvent], first: int | None) -> tuple[int, int]:
    result = log.append(batch)
    return (result.first_offset if first is None else first), result.last_offset


# -- dump -----------------------------------------------------------------------------------
def _dump(args: argparse.Namespace, out: TextIO) -> int:
    path: Path = args.path
    if _is_home(path, args):
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
                             "partitions": [vars(p) for p in saved.partitions]},
              f"{source} checkpoint {path}: sequence {saved.sequence} written_at "
              f"{saved.written_at_ms}")
        if not as_json:
            for i, p in enumerate(saved.partitions):
                print(f"| partition {i}: log start {p.log_start_offset} recovery point "
                      f"{p.recovery_point} log end {p.log_end_offset} taken through "
                      f"{p.taken_through} committed {list(p.committed)} in flight "
                      f"{list(p.in_flight)} pending puts {list(p.pending_puts)}", file=out)
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
        kind = "take" if commit.kind == commit_journal.TAKE else "put"
        _emit(out, as_json, {"kind": kind, "id": commit.commit_id,
                             "entries": [list(e) for e in commit.entries]},
              f"| {kind} commit {commit.commit_id}: "
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


# -- verify, stat, recover ----------------------------------------------------------------
def _verify(args: argparse.Namespace, out: TextIO) -> int:
    _require_dir(args.path)
    if _is_home(args.path, args):
        return _verify_channel(args.path, _supplied_config(args), args.json, out)
    report = verify_partition(args.path)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2), file=out)
    else:
        for note in report.notes:
            print(f"note: {note}", file=out)
        for damage in report.damages:
            print(f"DAMAGE {damage}", file=out)
        verdict = "sound" if report.ok else f"{len(report.damages)} damaged place(s)"
        print(f"{args.path}: {report.segments} segments, {report.batches} batches, "
              f"{report.records} records, {report.bytes} bytes checked: {verdict}", file=out)
    return 0 if report.ok else 1


def _verify_channel(home: Path, config: ChannelConfig | None, as_json: bool,
                    out: TextIO) -> int:
    result = verify_channel(config or home)
    if as_json:
        print(json.dumps(result, indent=2), file=out)
    else:
        for note in result["notes"]:
            print(f"note: {note}", file=out)
        for problem in result["problems"]:
            print(f"DAMAGE {problem}", file=out)
        records = sum(r["records"] for r in result["partitions"] if r)
        verdict = "sound" if result["ok"] else f"{len(result['problems'])} problem(s)"
        name = repr(result["channel"]) if result["channel"] else str(home)
        print(f"channel {name}: {len(result['partitions'])} partitions, "
              f"{records} records, newest checkpoint {result['checkpoint_source'] or 'none'}: "
              f"{verdict}", file=out)
    return 0 if result["ok"] else 1


def _stat(args: argparse.Namespace, out: TextIO) -> int:
    _require_dir(args.path)
    if _is_home(args.path, args):
        return _stat_channel(args.path, args.json, out)
    with PartitionLog.open(args.path, read_only=True) as log:
        stats = log.stats()
        infos = log.segment_infos()
    if args.json:
        stats["segment_table"] = [vars(info) for info in infos]
        print(json.dumps(stats, indent=2), file=out)
        return 0
    print(f"{args.path}: log start {stats['log_start_offset']}, log end "
          f"{stats['log_end_offset']}, recovery point {stats['recovery_point']}, "
          f"{stats['size_bytes']} bytes in {stats['segments']} segments", file=out)
    columns = ("base_offset", "next_offset", "records", "size", "file_size", "index_entries",
               "time_index_entries", "max_timestamp", "flushed", "active", "deletable")
    rows = [[str(getattr(info, c)) for c in columns] for info in infos]
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    for row in [list(columns), *rows]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)), file=out)
    return 0


def _stat_channel(home: Path, as_json: bool, out: TextIO) -> int:
    with Channel.open(home, read_only=True) as channel:
        status = channel.status(segments=as_json)
    if as_json:
        print(json.dumps(status, indent=2), file=out)
        return 0
    checkpoint = status["checkpoint"]
    print(f"channel {status['name']!r}: {status['events_untaken']} events untaken of capacity "
          f"{status['capacity']} ({status['fill_percent']}%), {status['bytes_on_disk']} bytes, "
          f"checkpoint "
          f"sequence {checkpoint['sequence']}; health {status['health']} "
          f"({status['health_reason']})", file=out)
    for part in status["partitions"]:
        print(f"partition {part['partition']}: {part['directory']}: log start "
              f"{part['log_start_offset']}, log end {part['log_end_offset']}, taken through "
              f"{part['taken_through']}, {part['events_untaken']} untaken, "
              f"{part['segments']} segments", file=out)
    return 0


def _acknowledge(channel: ChannelOwner) -> list[dict[str, Any]]:
    """Acknowledge every loss record; return the records acknowledged now."""
    before = channel.status()["losses"]["records"]
    channel.acknowledge_losses()
    after = {r["id"]: r for r in channel.status()["losses"]["records"]}
    return [after[r["id"]] for r in before
            if r["acknowledged_at_ms"] is None and r["id"] in after]


def _print_acknowledged(records: list[dict[str, Any]], out: TextIO) -> None:
    events = sum(r["events"] for r in records)
    print(f"acknowledged {len(records)} loss records ({events} events)", file=out)
    for r in records:
        print(f"  #{r['id']} partition {r['partition']} offsets {r['start']}..{r['end'] - 1}: "
              f"{r['events']} events; {r['cause']}; {r['path']} byte {r['position']} "
              f"({r['length']} bytes)", file=out)


def _recover(args: argparse.Namespace, out: TextIO) -> int:
    _require_dir(args.path)
    if _is_home(args.path, args):
        acknowledged: list[dict[str, Any]] = []
        on_open = (lambda owner: acknowledged.extend(_acknowledge(owner))) if args.ack \
            else None
        repaired = repair(args.path, _supplied_config(args), on_open)
        if args.json:
            extra = {"acknowledged": acknowledged} if args.ack else {}
            print(json.dumps({**repaired.recovery, "repair": repaired.to_dict(), **extra},
                             indent=2), file=out)
        else:
            _print_repair(repaired, out)
            if args.ack:
                _print_acknowledged(acknowledged, out)
        return 0
    if args.ack:
        raise UsageError(f"{args.path}: --ack needs a channel home (losses are the channel's)")
    with PartitionLog.open(args.path, force_recovery=True) as log:
        report = log.last_recovery
    if args.json:
        print(json.dumps(report.to_dict(), indent=2), file=out)
    else:
        for action in report.actions:
            print(f"{action.kind}: {action.path}: byte {action.position}: {action.reason} "
                  f"({action.bytes_dropped} bytes dropped)", file=out)
        print(report.summary(), file=out)
    return 0


def _print_repair(report: RepairReport, out: TextIO) -> None:
    """What recover did, then what it cost: events lost, take commits back, files moved."""
    print(f"recover {report.home} (channel {report.channel!r})", file=out)
    for moved in report.moved_aside:
        print(f"moved aside: {moved['path']} -> {moved['kept_as']} ({moved['why']})", file=out)
    for cut in report.journals_cut:
        print(f"journal cut: {cut['path']} at byte {cut['position']}: {cut['reason']} "
              f"({cut['intact_after']} intact record(s) after it, {cut['unreadable_bytes']} "
              f"unreadable bytes{'' if cut['replayed'] else '; the checkpoint covers it'})",
              file=out)
    for rewritten in report.rewritten:
        print(f"rewritten: {rewritten['path']} ({rewritten['why']})", file=out)
    print(f"events lost: {report.events_lost}", file=out)
    for lost in report.lost_ranges:
        print(f"  partition {lost['partition']}: offsets [{lost['start']}, {lost['end']}) "
              f"{lost['path']} byte {lost['position']} ({lost['cause']})", file=out)
    for cut in report.cut_at:
        print(f"  partition {cut['partition']}: log cut at offset {cut['offset']} "
              f"({cut['path']} byte {cut['position']}); queued events beyond it counted above",
              file=out)
    puts = report.put_commits_cut
    print(f"events aborted: {report.events_aborted} (put commits cut from the journals: "
          f"{len(puts)}{_commit_list(puts)})", file=out)
    takes = report.take_commits_back
    print(f"take commits that may come back (at-least-once): {len(takes)}, "
          f"{report.events_may_come_back} events{_commit_list(takes)}", file=out)
    if report.unreadable_journal_bytes:
        print(f"  and {report.unreadable_journal_bytes} unreadable journal bytes after the cut "
              "(they may have held more commits)", file=out)
    if report.events_may_come_back_at_most:
        unknown = [j["path"] for j in report.journals_unknown] + [
            j["path"] for j in report.recovery.get("journals_unknown", [])]
        print(f"  journal content unknown ({', '.join(unknown)}): up to "
              f"{report.events_may_come_back_at_most} events may come back in all", file=out)
    if report.no_checkpoint:
        print("no valid checkpoint: every event still in the logs was queued again (takes "
              "committed before it come back, at least once)", file=out)
    print(f"files moved aside: {len(report.moved_aside)}", file=out)
    print(f"after recovery: {report.events_untaken} events untaken", file=out)
    if report.losses:  # the channel's loss ledger, where it keeps one
        print(f"loss ledger: {report.losses.get('events_lost', 0)} events lost, "
              f"{report.losses.get('unacknowledged_events', 0)} not yet acknowledged "
              f"({report.losses.get('unacknowledged', 0)} unacknowledged records; "
              "`recover --ack` acknowledges them)", file=out)
    for key, value in report.recovery.items():
        print(f"{key}: {value}", file=out)


def _commit_list(commits: list[dict[str, Any]]) -> str:
    shown = "; ".join(f"id {c['id']}: " + ", ".join(f"partition {p} [{a}, {b})"
                                                 for p, a, b in c["ranges"])
                      for c in commits[:20])
    more = f"; and {len(commits) - 20} more" if len(commits) > 20 else ""
    return f" ({shown}{more})" if commits else ""

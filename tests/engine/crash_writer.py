"""The writer process of the kill -9 tests (test_crash.py); a script, not a test module.

    python crash_writer.py DIR --seed S [--durability fsync|policy] [--flush-messages N]
        [--preallocate] [--segment-bytes B] [--compression C] [--threads T]
        [--first-batch N] [--retention] [--audit] [--stop-phase PHASE --stop-at K]
        [--max-seconds S]

It opens the PartitionLog in DIR and appends batches until it is killed. Batch
number n (counting from --first-batch) holds batch_events(seed, n): the parent
regenerates it to check the log byte for byte. Protocol on stdout, one line per
write, flushed at once:

    OPEN <log end offset>                  the log is open; appends start
    ACK <first offset> <last offset> <n>   append() of batch n returned
    START <offset>                         delete_records_before(offset) returned (--retention)
    STOP <phase>                           a stop hook fired; the writer waits for the kill
    ERROR <message>                        an append or retention raised, or the audit
                                           failed; the writer exits with 2

With several threads, batch numbers are drawn from one counter and appends run
concurrently, so fsync durability exercises group commit. With --retention one more
thread raises the log start offset every few milliseconds (Kafka DeleteRecords, which
deletes the segments wholly below it), so kills land in retention too.

--audit (fsync durability) checks in the writer what a kill -9 cannot show, since the
page cache survives it: that each append() returns only after an fsync that began after
the batch was written, and after a directory fsync that began after its segment file was
created. A violation is printed as an ERROR line.

Stop hooks (installed after the open) freeze the writer at a chosen instant so the
parent's kill lands exactly there, K-th occurrence after the open:
  after_create  a roll created the new (maybe preallocated) segment; the old one is
                not sealed yet and nothing is in the new one
  after_trim    a roll sealed (and trimmed) the old segment; the new one is still empty
  torn          a batch write stopped part way, as a kill stops one: only a prefix of
                the batch up to a page boundary of the file is written (writes within
                one page are never torn)
  before_sync   just before an fsync / fdatasync (the batch is written, not durable)
  mid_retention retention persisted the new log start, a segment is not yet renamed
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import threading
import time
from typing import Any

from child_lines import Output, freeze, nth_call

from channel_engine import LogConfig, PartitionLog, PendingEvent
from channel_engine.log import segment as segment_module

BASE_TIMESTAMP = 1_700_000_000_000
MAX_EVENTS = 200
PAGE = 4096  # a kill cuts a write short only at a page boundary of the file
STOP_PHASES = ("after_trim", "after_create", "torn", "before_sync", "mid_retention")


def batch_events(seed: int, batch_no: int) -> list[PendingEvent]:
    """The content of batch `batch_no`: 1..200 events derived from (seed, batch_no) only."""
    rng = random.Random(f"weir-crash:{seed}:{batch_no}")  # str seeds hash stably (sha512)
    count = rng.randint(1, MAX_EVENTS)
    body_max = rng.choice([8, 64, 200])
    events = []
    for i in range(count):
        body = rng.randbytes(rng.randint(0, body_max))
        key = None if rng.random() < 0.3 else f"key-{rng.randrange(1000)}".encode()
        headers = {"batch": str(batch_no).encode(), "i": str(i).encode()}
        events.append(PendingEvent(body, key, headers, BASE_TIMESTAMP + batch_no * 10 + i))
    return events


def make_config(durability: str = "fsync", flush_messages: int | None = None,
                preallocate: bool = False, segment_bytes: int = 64 * 1024,
                compression: str = "none") -> LogConfig:
    """The writer's settings; the parent builds the same to reopen the log."""
    return LogConfig(durability=durability, flush_messages=flush_messages,
                     preallocate=preallocate, segment_bytes=segment_bytes,
                     index_interval_bytes=4096, compression=compression)


class SyncAudit:
    """Watches writes, syncs and segment creations, in one sequence; see --audit."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.realpath(directory)
        self._lock = threading.Lock()
        self._seq = 0
        self._writes: dict[tuple[str, int], int] = {}  # (file, end position) -> seq
        self._synced: dict[str, int] = {}  # file or directory -> seq when its last sync began
        self._created: dict[str, int] = {}  # segment file -> seq of its creation

    def _tick(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def install(self) -> None:
        pwrite_all = segment_module._pwrite_all

        def pwrite_then_note(fd: int, data: Any, position: int) -> None:
            pwrite_all(fd, data, position)
            self._writes[(_path_of(fd), position + len(data))] = self._tick()
        segment_module._pwrite_all = pwrite_then_note

        for name in ("fsync", "fdatasync"):
            real = getattr(os, name)

            def sync_and_note(fd: int, real: Any = real) -> None:
                began, path = self._tick(), _path_of(fd)
                real(fd)
                with self._lock:
                    self._synced[path] = max(self._synced.get(path, 0), began)
            setattr(os, name, sync_and_note)

        cls: Any = segment_module.LogSegment
        create = cls.create

        def create_and_note(klass: Any, *args: Any, **kwargs: Any) -> Any:
            segment = create(*args, **kwargs)
            self._created[os.path.realpath(segment.log_path)] = self._tick()
            return segment
        cls.create = classmethod(create_and_note)

    def check_durable(self, segment_base: int, end: int) -> str | None:
        """None if the batch ending at `end` in that segment was on disk; else what was not."""
        path = os.path.join(self.directory, f"{segment_base:020d}.log")
        with self._lock:
            written = self._writes.get((path, end))
            synced = self._synced.get(path, 0)
            created = self._created.get(path)  # None: opened with the log, already durable
            directory_synced = self._synced.get(self.directory, 0)
        if written is None:
            return f"no write ending at byte {end} of {path}"
        if synced <= written:
            return f"{path}: acked before an fsync covered byte {end}"
        if created is not None and directory_synced <= created:
            return f"{path}: acked before the directory fsync that makes the file durable"
        return None


def _path_of(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def install_stop_hook(out: Output, phase: str, at: int, seed: int) -> None:
    """Wrap one engine function so that its `at`-th call freezes the process there."""
    due = nth_call(at)

    cls: Any = segment_module.LogSegment
    if phase == "after_trim":
        seal = cls.on_become_inactive

        def on_become_inactive(self: Any) -> None:
            seal(self)
            if due():
                freeze(out, phase)
        cls.on_become_inactive = on_become_inactive
    elif phase == "after_create":
        create = cls.create

        def create_then_stop(klass: Any, *args: Any, **kwargs: Any) -> Any:
            segment = create(*args, **kwargs)
            if due():
                freeze(out, phase)
            return segment
        cls.create = classmethod(create_then_stop)
    elif phase == "torn":
        pwrite_all = segment_module._pwrite_all
        rng = random.Random(seed)

        def torn_pwrite(fd: int, data: Any, position: int) -> None:
            # a kill stops a write only between the file's pages (damage.py): a prefix
            # ending at a page boundary, past the batch length so it is not zeros
            cuts = range(-(-(position + 12) // PAGE) * PAGE, position + len(data), PAGE)
            if cuts and due():
                pwrite_all(fd, bytes(data[:rng.choice(cuts) - position]), position)
                freeze(out, phase)
            pwrite_all(fd, data, position)
        segment_module._pwrite_all = torn_pwrite
    elif phase == "mid_retention":
        rename = cls.rename_to_deleted

        def stop_then_rename(self: Any) -> None:
            if due():
                freeze(out, phase)
            rename(self)
        cls.rename_to_deleted = stop_then_rename
    elif phase == "before_sync":
        for name in ("fsync", "fdatasync"):
            real = getattr(os, name)

            def sync(fd: int, real: Any = real) -> None:
                if due():
                    freeze(out, phase)
                real(fd)
            setattr(os, name, sync)
    else:
        raise SystemExit(f"unknown stop phase {phase!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--durability", default="fsync")
    parser.add_argument("--flush-messages", type=int)
    parser.add_argument("--preallocate", action="store_true")
    parser.add_argument("--segment-bytes", type=int, default=64 * 1024)
    parser.add_argument("--compression", default="none")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--first-batch", type=int, default=0)
    parser.add_argument("--retention", action="store_true")
    parser.add_argument("--audit", action="store_true")
    parser.add_argument("--stop-phase", choices=STOP_PHASES)
    parser.add_argument("--stop-at", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)

    out = Output()
    config = make_config(args.durability, args.flush_messages, args.preallocate,
                         args.segment_bytes, args.compression)
    log = PartitionLog.open(args.directory, config)
    out.line(f"OPEN {log.log_end_offset}")
    audit = SyncAudit(args.directory) if args.audit else None
    if audit is not None:
        audit.install()
    if args.stop_phase:
        install_stop_hook(out, args.stop_phase, args.stop_at, args.seed)

    numbers = itertools.count(args.first_batch)
    numbers_lock = threading.Lock()

    def append_forever() -> None:
        try:
            while True:
                with numbers_lock:
                    batch_no = next(numbers)
                result = log.append(batch_events(args.seed, batch_no))
                if audit is not None:
                    problem = audit.check_durable(result.segment_base_offset,
                                                  result.position + result.size)
                    if problem is not None:
                        out.line(f"ERROR audit: batch {batch_no}: {problem}")
                        os._exit(2)
                out.line(f"ACK {result.first_offset} {result.last_offset} {batch_no}")
        except BaseException as exc:  # any failure ends the run, loudly
            out.line(f"ERROR {type(exc).__name__}: {exc}")
            os._exit(2)

    def delete_records_forever() -> None:
        rng = random.Random(args.seed)
        try:
            while True:
                time.sleep(rng.uniform(0.002, 0.03))
                offset = rng.randint(log.log_start_offset, log.high_watermark)
                log.delete_records_before(offset)
                out.line(f"START {offset}")
        except BaseException as exc:  # any failure ends the run, loudly
            out.line(f"ERROR {type(exc).__name__}: {exc}")
            os._exit(2)

    for _ in range(args.threads):
        threading.Thread(target=append_forever, daemon=True).start()
    if args.retention:
        threading.Thread(target=delete_records_forever, daemon=True).start()
    time.sleep(args.max_seconds)  # a safety net: the parent kills long before
    out.line("ERROR the parent never killed the writer")
    os._exit(3)  # no close(): the log stays as a crash leaves it


if __name__ == "__main__":
    main()

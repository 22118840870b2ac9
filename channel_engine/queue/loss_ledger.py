"""LossLedger: every loss of events a channel met, kept until an operator acknowledges it.

The log layer reports offsets it can no longer deliver (recovery.LostRange: a gap, a
cut, damage met by a read); the queue reports offsets it knew beyond a log's end. The
channel takes those offsets out of its queue (PartitionQueue.mark_lost), counts the
events among them that were not yet taken, and records each range here. A record
stays until an operator acknowledges it (`recover --ack`, Channel.acknowledge_losses);
until then the channel's health is "degraded", never "healthy".

losses.json, in the channel home, written atomically (atomic_file) on every change:

    field               type         meaning
    ------------------  -----------  -----------------------------------------------------
    format              string       "weir-loss-ledger"
    version             int          1
    next_id             int          id of the next record
    records             [object]     one per lost range, in the order found:
      id                int          1, 2, ... never reused within one ledger
      partition         int          the partition; -1: the ledger itself was damaged or
                                     missing (earlier records may be gone), see cause;
                                     -2: a checkpoint's commit journal was missing or
                                     headless, or `recover` cut a replayed journal at a
                                     damaged record (take commits may come back; the
                                     events of put commits cut are recorded by partition,
                                     cause "journal_cut: ..."), see cause; -3: an open found no
                                     checkpoint of a channel that existed (its home wiped:
                                     the queue state is gone, cause "state_missing: ..."),
                                     or none readable (every copy damaged: committed
                                     takes may come back, cause "state_damaged: ...")
      start, end        int          offsets [start, end) the log can no longer deliver
                                     (partition -2: both the journal's generation)
      events            int          how many of them were not yet taken when the channel
                                     first counted them: the events lost
      path              string       file (or directory) holding the damage
      position          int          byte position of the damage in path (0: not a byte range)
      length            int          bytes of path that held the lost batches (0: unknown)
      cause             string       what was found ("gap: ...", "truncated: ...", ...)
      detected_at_ms    int          when this channel first recorded it
      acknowledged_at_ms int or null  when an operator acknowledged it; null until then

A range is recorded once: records are keyed by (partition, start, end), so a hole the
log reports at every open is one record, and its events are counted once. A damaged place
(partition, file, byte position, length) reported again with other bounds — a read that
began inside the damaged batch, then the open that repairs the whole of it — counts only
the offsets no record of that place holds (counted_here): each lost offset once. Crash order:
the owner writes a record durably before the queue's marking of its offsets is (by the
checkpoint that ends an open, or by a take-commit journal record with take id 0 for a
loss found later), so a crash in between re-counts the same range at the next open, and
the key (or the place) folds it into the record already written (no count lost, none
doubled).

Exactness. Counts never under-count: an offset leaves the queue as lost only after its
record is durable. (One loss cannot be counted: put commits that the unreadable bytes of
a journal `recover` cut may have held; its journal_cut record says so, and their events
are among the open's aborted events.) They can over-count in two cases only:
  * an offset a take holds in flight and has already returned to its consumer, when
    another read (an inspection read, say) meets damage there before that take
    commits: the take can no longer commit it and the ledger counts it lost, though the
    consumer has it (an uncommitted take's events are not delivered in Flume's sense);
  * the same damaged offsets reported under another place (file, byte position or
    length) than the one recorded: counted_here matches places exactly, and the log
    reports a place under its original name and byte, before and after its repair.

Failure behaviour: a damaged losses.json (unreadable, not JSON, wrong format or fields)
never fails an open and never hides a loss: it is moved aside (`losses.json.damaged-
<ms>`, never deleted) and a partition -1 record says so; a missing losses.json where a
checkpoint exists (the ledger is written before the first checkpoint) gets the same
record. A failed write raises StorageError and leaves the records in memory, to write:
the next write (at the latest, before the next checkpoint) retries.

Thread-safe: one lock guards the records and the file. The functions at the end
(deliverable, undelivered, covers) are pure helpers for the owner's takes.
"""
from __future__ import annotations

import json
import os
import threading
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from channel_engine.atomic_file import write_atomically
from channel_engine.errors import StorageError
from channel_engine.event import Event
from channel_engine.filenames import DAMAGED_SUFFIX
from channel_engine.log.recovery import LostRange
from channel_engine.queue.checkpoint import Range

LEDGER_FILE = "losses.json"
FORMAT = "weir-loss-ledger"
VERSION = 1
LEDGER_PARTITION = -1  # a record about the ledger itself
JOURNAL_PARTITION = -2  # a record about a commit journal whose content is unknown
STATE_PARTITION = -3  # a record about a channel whose checkpoints were gone at open


@dataclass
class LossRecord:
    """One lost range of one partition, as losses.json keeps it."""

    id: int
    partition: int
    start: int
    end: int
    events: int
    path: str
    position: int
    length: int
    cause: str
    detected_at_ms: int
    acknowledged_at_ms: int | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        """What makes two reports the same loss."""
        return self.partition, self.start, self.end

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON form (the field table of the module doc)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> LossRecord:
        """Parse one record; ValueError names what is wrong."""
        if not isinstance(raw, dict) or set(raw) != {f.name for f in fields(cls)}:
            raise ValueError(f"record {raw!r:.200} does not have the record fields")
        for name, value in raw.items():
            want: type = str if name in ("path", "cause") else int
            if not (isinstance(value, want) and not isinstance(value, bool)) and not (
                    name == "acknowledged_at_ms" and value is None):
                raise ValueError(f"record {raw.get('id')!r}: {name} is {value!r}")
        return cls(**raw)


class LossLedger:
    """The records of losses.json in one channel home; see the module doc."""

    def __init__(self, path: Path, writable: bool) -> None:
        self.path = path
        self.writable = writable
        self.records: list[LossRecord] = []
        self._keys: set[tuple[int, int, int]] = set()
        self._next_id = 1
        self._dirty = writable  # a writable ledger is written at least once, at open
        self._lock = threading.Lock()

    @classmethod
    def load(cls, home: Path, writable: bool, expect_file: bool, now_ms: int) -> LossLedger:
        """Read `home`/losses.json. Missing when `expect_file` (a checkpoint exists), or
        damaged: a record says so (the damaged file moved aside when writable)."""
        ledger = cls(home / LEDGER_FILE, writable)
        try:
            ledger._parse(ledger.path.read_bytes())
        except FileNotFoundError:
            if expect_file:
                ledger._add_ledger_record(f"ledger_missing: {ledger.path} is missing though a "
                                          "checkpoint exists; earlier loss records may be gone",
                                          now_ms)
        except (OSError, ValueError) as exc:
            ledger.records, ledger._keys, ledger._next_id = [], set(), 1
            aside = ledger._move_aside(now_ms)
            ledger._add_ledger_record(f"ledger_damaged: {ledger.path} could not be read "
                                      f"({exc}){aside}; earlier loss records may be gone",
                                      now_ms)
        return ledger

    def _parse(self, data: bytes) -> None:
        doc = json.loads(data)  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"format is not {FORMAT!r}")
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r} is not {VERSION}")
        records = doc.get("records")
        next_id = doc.get("next_id")
        if not isinstance(records, list) or type(next_id) is not int:
            raise ValueError("records or next_id missing")
        for raw in records:
            record = LossRecord.from_dict(raw)
            if record.key not in self._keys:
                self._keys.add(record.key)
                self.records.append(record)
        self._next_id = max([next_id] + [r.id + 1 for r in self.records])

    def _move_aside(self, now_ms: int) -> str:
        if not self.writable or not os.path.lexists(self.path):
            return ""
        aside = self.path.with_name(f"{self.path.name}{DAMAGED_SUFFIX}-{now_ms}")
        try:
            os.rename(self.path, aside)
        except OSError as exc:
            return f"; moving it aside failed ({exc})"
        return f"; moved to {aside}"

    def _add_ledger_record(self, cause: str, now_ms: int) -> None:
        self._append(LossRecord(0, LEDGER_PARTITION, 0, 0, 0, str(self.path), 0, 0, cause,
                                now_ms))

    def _append(self, record: LossRecord) -> None:
        record.id, self._next_id = self._next_id, self._next_id + 1
        self.records.append(record)
        self._keys.add(record.key)
        self._dirty = True

    # -- changes ------------------------------------------------------------------------------
    def record(self, partition: int, lost: LostRange, events: int,
               now_ms: int) -> LossRecord | None:
        """Record a lost range (in memory; save() writes it); None if already recorded."""
        with self._lock:
            if (partition, lost.start, lost.end) in self._keys:
                return None
            record = LossRecord(0, partition, lost.start, lost.end, events, lost.path,
                                lost.position, lost.length, lost.cause, now_ms)
            self._append(record)
            return record

    def counted_here(self, partition: int, lost: LostRange) -> list[tuple[int, int]]:
        """The offsets of `lost` already recorded for the same damaged place (partition,
        file, byte position and length; never a place without a byte range): the same
        offsets reported again, by an open after a read or a read after a crash."""
        if not lost.length:
            return []
        with self._lock:
            return [(max(r.start, lost.start), min(r.end, lost.end)) for r in self.records
                    if (r.partition, r.path, r.position, r.length) == (
                        partition, lost.path, lost.position, lost.length)
                    and max(r.start, lost.start) < min(r.end, lost.end)]

    def record_journal(self, path: str, generation: int, cause: str, now_ms: int,
                       position: int = 0, length: int = 0) -> LossRecord | None:
        """Record a checkpoint's journal found missing or headless, or a replayed journal
        `recover` cut at `position` (`length` bytes after it unreadable): events 0, the
        events its lost put commits held are recorded by partition; None if recorded."""
        with self._lock:
            if (JOURNAL_PARTITION, generation, generation) in self._keys:
                return None
            record = LossRecord(0, JOURNAL_PARTITION, generation, generation, 0, path,
                                position, length, cause, now_ms)
            self._append(record)
            return record

    def record_state(self, home: str, cause: str, now_ms: int) -> LossRecord:
        """Record that an open found no checkpoint of a channel that existed, or none
        readable: events 0 (the ones the logs still hold are queued again; the cause says
        what cannot be counted, or how many may be delivered again)."""
        with self._lock:
            record = LossRecord(0, STATE_PARTITION, 0, 0, 0, home, 0, 0, cause, now_ms)
            self._append(record)
            return record

    def record_all(self, lost: Sequence[tuple[int, LostRange, int]],
                   now_ms: int) -> list[LossRecord]:
        """Record (partition, range, events) each; return the records new here (a range
        recorded before — by an open a crash ended before its marking was durable — had its
        events counted then)."""
        fresh = [self.record(p, r, events, now_ms) for p, r, events in lost]
        return [record for record in fresh if record is not None]

    def save(self) -> None:
        """Write losses.json durably if anything changed since the last write (StorageError
        if that fails; the changes stay, to write next time)."""
        with self._lock:
            self._save()

    def _save(self) -> None:
        if not self.writable or not self._dirty:
            return
        doc = {"format": FORMAT, "version": VERSION, "next_id": self._next_id,
               "records": [r.to_dict() for r in self.records]}
        try:
            write_atomically(self.path, json.dumps(doc, indent=1).encode() + b"\n")
        except OSError as exc:
            raise StorageError(self.path.parent, exc, f"writing {self.path.name}") from exc
        self._dirty = False

    def acknowledge(self, now_ms: int) -> int:
        """Acknowledge every record not yet acknowledged, durably; return how many. If the
        write fails, none is acknowledged (StorageError)."""
        with self._lock:
            fresh = [r for r in self.records if r.acknowledged_at_ms is None]
            for record in fresh:
                record.acknowledged_at_ms = now_ms
            if fresh:
                self._dirty = True
                try:
                    self._save()
                except StorageError:
                    for record in fresh:
                        record.acknowledged_at_ms = None
                    raise
            return len(fresh)

    # -- reading ------------------------------------------------------------------------------
    def unacknowledged(self) -> list[LossRecord]:
        """Records no operator has acknowledged yet."""
        with self._lock:
            return [r for r in self.records if r.acknowledged_at_ms is None]

    def events_by_partition(self) -> dict[int, int]:
        """Events lost per partition, over every record."""
        lost: dict[int, int] = {}
        with self._lock:
            for r in self.records:
                lost[r.partition] = lost.get(r.partition, 0) + r.events
        return lost

    def summary(self) -> dict[str, Any]:
        """status()["losses"]: totals, and every record."""
        with self._lock:
            open_records = [r for r in self.records if r.acknowledged_at_ms is None]
            return {"events_lost": sum(r.events for r in self.records),
                    "unacknowledged_events": sum(r.events for r in open_records),
                    "unacknowledged": len(open_records),
                    "records": [r.to_dict() for r in self.records]}

    def health_reason(self) -> str | None:
        """Why health is degraded while records are unacknowledged; None when none is."""
        open_records = self.unacknowledged()
        if not open_records:
            return None
        events = sum(r.events for r in open_records)
        where = ", ".join(_where(r) for r in open_records[:3])
        more = f" and {len(open_records) - 3} more" if len(open_records) > 3 else ""
        return (f"{events} events lost in {len(open_records)} unacknowledged loss records "
                f"({where}{more}); acknowledge with `python -m channel_engine recover HOME "
                "--ack` or Channel.acknowledge_losses()")


def _where(record: LossRecord) -> str:
    if record.partition == LEDGER_PARTITION:
        return "the loss ledger"
    if record.partition == JOURNAL_PARTITION:
        return f"commit journal {Path(record.path).name} (taken events may come back)"
    if record.partition == STATE_PARTITION and record.cause.startswith("state_damaged"):
        return f"the queue state of {record.path} (its checkpoints were damaged: taken " \
               "events may come back)"
    if record.partition == STATE_PARTITION:
        return f"the queue state of {record.path} (its checkpoints were gone)"
    return f"partition {record.partition} offsets {record.start}..{record.end - 1}"


def deliverable(reserved: Sequence[tuple[int, int, int]], held: dict[int, list[Range]],
                events: list[Event], directories: Sequence[Path]
                ) -> tuple[list[Event], list[tuple[int, LostRange]]]:
    """What a take that reserved `reserved` (partition, start, end) and read `events` may
    return: the events whose offsets it still `held` (per partition, once this read's
    losses left the queue). And, as lost ranges, what it held but the read did not return
    (a take must never commit offsets it did not return)."""
    kept = [e for e in events if covers(held.get(e.partition, []), e.offset)]
    missed = []
    for p, start, end in reserved:
        offsets = sorted(e.offset for e in kept if e.partition == p and start <= e.offset < end)
        ranges = [(max(a, start), min(b, end)) for a, b in held.get(p, []) if a < end and b > start]
        missed += [(p, LostRange(a, b, str(directories[p]), cause=f"unreadable: a read of "
                                 f"offsets {start}..{end - 1} did not return them"))
                   for a, b in undelivered(ranges, offsets)]
    return kept, missed


def undelivered(held: list[Range], offsets: list[int]) -> list[Range]:
    """The offsets of `held` (sorted, disjoint ranges) that `offsets` (sorted) lack."""
    missing: list[Range] = []
    i = 0
    for start, end in held:
        position = start
        while i < len(offsets) and offsets[i] < end:
            if offsets[i] >= position:
                if offsets[i] > position:
                    missing.append((position, offsets[i]))
                position = offsets[i] + 1
            i += 1
        if position < end:
            missing.append((position, end))
    return missing


def covers(ranges: list[Range], offset: int) -> bool:
    """Is `offset` in one of the sorted, disjoint ranges?"""
    i = bisect_right(ranges, (offset, 1 << 63)) - 1
    return i >= 0 and ranges[i][0] <= offset < ranges[i][1]

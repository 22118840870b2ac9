"""Checkpoint: the queue state of a channel, written atomically with a backup copy.

A channel's queue is, per partition, the offsets of its log that are not yet
taken and committed. Weir does not store a pointer per event as Flume's
checkpoint does (an mmapped array of `capacity` longs, rewritten under a
channel-wide lock); it stores a few numbers per partition, so a checkpoint
costs O(partitions + takes in flight + out-of-order commits), not O(events),
and capacity can change without a rebuild.

Per partition:
  * taken_through: every offset below is taken and committed (the queue head);
  * committed ranges: [start, end) ranges above the head whose takes committed
    out of order (a later take committed before an earlier one);
  * in-flight ranges: [start, end) ranges reserved by takes not yet committed
    when the checkpoint was written; after a crash they return to the queue,
    in offset order, ahead of anything not yet taken;
  * pending puts (version 2): (transaction id, start, end) of the batches a
    multi-partition put had written but not yet committed; on open each is
    kept if the commit journal holds its commit, else aborted (never delivered);
  * log_start_offset, recovery_point, log_end_offset of the partition log then.
Version 3 has version 2's layout and says one more thing: the channel that wrote it
keeps a loss ledger (losses.json, loss_ledger.py) beside it, so a v3 checkpoint without
that file means the ledger was lost; a v1 or v2 one was written before ledgers existed
(an upgrade: no ledger yet, nothing lost).
Offsets in [taken_through, log end) that are in neither list are queued.

Subscriptions (version 4): a channel's events are stored once and read by one or more
subscriptions, each with a queue of its own per partition (the three fields above). The
partition records hold the queue of subscription `default` (id 0, which every channel
has: a v1-v3 checkpoint is a channel with that one subscription); each other
subscription follows them, with its id (never reused: journals name subscriptions by
id), its name and its queue per partition. Then, per partition, the aborted ranges: the
offsets of puts that never committed (their batches stay in the log, unstamped), which
every queue holds as taken; a subscription added or reset later starts with them taken
too, so it never delivers them. Ranges below the log start are not kept.

Counters (version 5): the channel's counters (put_attempts, put_successes, takes, rollbacks,
dropped, lost, ...: channel_state.COUNTERS) and each subscription's take counters
(subscription.COUNTERS) as they stood when the snapshot was taken, so that they count
since the channel was made, not since it was opened: a close writes a final checkpoint
(checkpoint_on_close), so a reopen or a settings change keeps them exactly; after a kill
the open restores them from the checkpoint and adds what replay recounts from durable
records (counters.py says what, and what a kill can undercount). Each counter is named,
so a counter added later reads as 0 from an older file and one unknown to the reader is
ignored. A v1-v4 checkpoint has none: every counter starts at 0.

File layout (big-endian), `checkpoint` in the checkpoint dir, `checkpoint` in
the backup dir when dual checkpoints are on:

    offset  size  field
    ------  ----  -------------------------------------------------------------
         0     4  magic               b"WCKP"
         4     1  version             5 (1-4 are still read; 1: no pending puts)
         5     3  reserved            0
         8     8  sequence            increases by one per checkpoint (<= 2**31 - 1)
        16     8  written_at_ms       wall clock
        24     4  partitions          P
        28     -  P partition records:
                    8  log_start_offset
                    8  recovery_point
                    8  log_end_offset
                    8  taken_through
                    4  committed range count C, then C x (8 start, 8 end)
                    4  in-flight range count F, then F x (8 start, 8 end)
                    4  pending put count N, then N x (8 txn id, 8 start, 8 end)  [v2+]
         -     4  next subscription id (ids below it were given out)               [v4]
         -     4  subscription count S, then S subscription records:                [v4]
                    4  id               1 .. next subscription id - 1
                    1  name length L    1 .. 64
                    L  name             UTF-8
                    P queue records:    8 taken_through, 4 C + C ranges, 4 F + F ranges
         -     -  P aborted records:    4 A, then A x (8 start, 8 end)                 [v4]
         -     -  channel counters:     4 N, then N counter records                    [v5]
         -     4  subscription counter sets S (one per subscription, `default` too)    [v5]
                    4  subscription id  0 (`default`) or an id of the records above
                    -  4 N, then N counter records
                  counter record:       1 name length L (1..64), L name (ASCII),
                                        8 value (0 .. 2**63 - 1)
       end     4  crc                 CRC-32C of every byte before it

Writing: primary first (temp file, fsync, rename, fsync dir), then the backup
the same way. The rename is the complete/incomplete marker: a process killed
mid-write leaves the previous file whole, plus a temp file that the next write
replaces. Reading: the newest valid of primary and backup (by sequence); a
damaged file is reported, never trusted.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from channel_engine.atomic_file import write_atomically
from channel_engine.errors import CorruptStateError

MAGIC = b"WCKP"
VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
LEDGER_VERSION = 3  # the first version written by channels that keep losses.json
FILE_NAME = "checkpoint"
HEADER = struct.Struct(">4sB3xqqi")
PARTITION = struct.Struct(">qqqq")
COUNT = struct.Struct(">i")
RANGE = struct.Struct(">qq")
PENDING = struct.Struct(">qqq")
SUBSCRIPTION = struct.Struct(">iB")  # id, name length
VALUE = struct.Struct(">q")  # a counter's value, after its name
COUNTER_NAME = 64  # longest counter name
MAX_COUNTER = (1 << 63) - 1  # a counter record's value saturates here
NAME_LENGTH = 1 << 8
CRC = struct.Struct(">I")
# The owner numbers its take ids generation << 32 in a signed 64-bit field, so no channel
# reaches a larger sequence (one checkpoint a second for 68 years); a larger one is damage.
MAX_SEQUENCE = 2**31 - 1
assert HEADER.size == 28 and PARTITION.size == 32 and RANGE.size == 16

Range = tuple[int, int]
PendingPut = tuple[int, int, int]  # transaction id, start, end
Counters = tuple[tuple[str, int], ...]  # (name, value), as saved
DEFAULT_SUBSCRIPTION = "default"  # id 0: its queues are in the partition records


@dataclass(frozen=True)
class PartitionCheckpoint:
    """The queue state of one partition; see the module doc."""

    log_start_offset: int = 0
    recovery_point: int = 0
    log_end_offset: int = 0
    taken_through: int = 0
    committed: tuple[Range, ...] = ()
    in_flight: tuple[Range, ...] = ()
    pending_puts: tuple[PendingPut, ...] = ()


@dataclass(frozen=True)
class QueueCheckpoint:
    """The queue of one subscription on one partition; see the module doc."""

    taken_through: int = 0
    committed: tuple[Range, ...] = ()
    in_flight: tuple[Range, ...] = ()


@dataclass(frozen=True)
class SubscriptionCheckpoint:
    """A subscription other than `default`: its id, name and queue per partition."""

    id: int
    name: str
    queues: tuple[QueueCheckpoint, ...] = ()


@dataclass(frozen=True)
class Checkpoint:
    """The queue state of a channel at one moment."""

    sequence: int
    written_at_ms: int
    partitions: tuple[PartitionCheckpoint, ...] = field(default_factory=tuple)
    version: int = field(default=VERSION, compare=False)  # as read; encode writes VERSION
    subscriptions: tuple[SubscriptionCheckpoint, ...] = ()  # besides `default`
    next_subscription_id: int = 1
    aborted: tuple[tuple[Range, ...], ...] = ()  # per partition (none: every one empty)
    counters: Counters = ()  # the channel's (v5; older: none, every counter 0)
    subscription_counters: tuple[tuple[int, Counters], ...] = ()  # (id, counters) (v5)

    def queues(self) -> dict[tuple[int, str], tuple[QueueCheckpoint, ...]]:
        """Every subscription's queues by (id, name), `default` first."""
        default = tuple(QueueCheckpoint(p.taken_through, p.committed, p.in_flight)
                        for p in self.partitions)
        found = {(0, DEFAULT_SUBSCRIPTION): default}
        found.update({(s.id, s.name): s.queues for s in self.subscriptions})
        return found


@dataclass(frozen=True)
class CheckpointRead:
    """What reading the checkpoint files found: the newest valid one, and what was wrong."""

    checkpoint: Checkpoint | None
    source: str | None  # "primary", "backup" or None
    problems: tuple[str, ...] = ()


def encode(checkpoint: Checkpoint) -> bytes:
    """Serialise a checkpoint (the layout in the module doc)."""
    parts = [HEADER.pack(MAGIC, VERSION, checkpoint.sequence, checkpoint.written_at_ms,
                         len(checkpoint.partitions))]
    for p in checkpoint.partitions:
        parts.append(PARTITION.pack(p.log_start_offset, p.recovery_point, p.log_end_offset,
                                    p.taken_through))
        for ranges in (p.committed, p.in_flight):
            parts.append(COUNT.pack(len(ranges)))
            parts.extend(RANGE.pack(start, end) for start, end in ranges)
        parts.append(COUNT.pack(len(p.pending_puts)))
        parts.extend(PENDING.pack(*pending) for pending in p.pending_puts)
    parts.append(COUNT.pack(checkpoint.next_subscription_id))
    parts.append(COUNT.pack(len(checkpoint.subscriptions)))
    for sub in checkpoint.subscriptions:
        name = sub.name.encode()
        parts.append(SUBSCRIPTION.pack(sub.id, len(name)) + name)
        for queue in sub.queues:
            parts.append(struct.pack(">q", queue.taken_through))
            for ranges in (queue.committed, queue.in_flight):
                parts.append(COUNT.pack(len(ranges)))
                parts.extend(RANGE.pack(start, end) for start, end in ranges)
    for index in range(len(checkpoint.partitions)):
        aborted = checkpoint.aborted[index] if index < len(checkpoint.aborted) else ()
        parts.append(COUNT.pack(len(aborted)))
        parts.extend(RANGE.pack(start, end) for start, end in aborted)
    parts.append(_encode_counters(checkpoint.counters))
    parts.append(COUNT.pack(len(checkpoint.subscription_counters)))
    for sub_id, counters in checkpoint.subscription_counters:
        parts.append(COUNT.pack(sub_id) + _encode_counters(counters))
    body = b"".join(parts)
    return body + CRC.pack(crc32c.crc32c(body))


def decode(data: bytes, path: Path | str = FILE_NAME) -> Checkpoint:
    """Parse a checkpoint file; raise CorruptStateError naming what is wrong."""
    if len(data) < HEADER.size + CRC.size:
        raise CorruptStateError(path, f"size {len(data)} is too small for a checkpoint",
                                len(data))
    (stored,) = CRC.unpack_from(data, len(data) - CRC.size)
    if crc32c.crc32c(data[: -CRC.size]) != stored:
        raise CorruptStateError(path, "CRC-32C mismatch (torn or damaged)", len(data) - CRC.size)
    magic, version, sequence, written_at, count = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptStateError(path, f"magic {magic!r}, expected {MAGIC!r}", 0)
    if version not in READABLE_VERSIONS:
        raise CorruptStateError(path, f"version {version} is not supported "
                                      f"(expected one of {READABLE_VERSIONS})", 4)
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise CorruptStateError(path, f"sequence {sequence} outside [0, {MAX_SEQUENCE}]", 8)
    position = HEADER.size
    partitions = []
    try:
        for _ in range(count):
            start, recovery, end, taken = PARTITION.unpack_from(data, position)
            position += PARTITION.size
            committed, position = _ranges(data, position)
            in_flight, position = _ranges(data, position)
            pending: tuple[PendingPut, ...] = ()
            if version >= 2:
                pending, position = _pending(data, position)
            partitions.append(PartitionCheckpoint(start, recovery, end, taken, committed,
                                                  in_flight, pending))
    except struct.error as exc:
        raise CorruptStateError(path, f"partition records end early ({exc})",
                                position) from exc
    subscriptions: tuple[SubscriptionCheckpoint, ...] = ()
    next_id = 1
    aborted: list[tuple[Range, ...]] = []
    if version >= 4:
        subscriptions, next_id, position = _subscriptions(data, position, count, path)
        try:
            for _ in range(count):
                ranges, position = _ranges(data, position)
                aborted.append(ranges)
        except struct.error as exc:
            raise CorruptStateError(path, f"aborted ranges end early ({exc})",
                                    position) from exc
    counters: Counters = ()
    by_subscription: tuple[tuple[int, Counters], ...] = ()
    if version >= 5:
        known = {0} | {s.id for s in subscriptions}
        counters, by_subscription, position = _all_counters(data, position, known, path)
    if position != len(data) - CRC.size:
        raise CorruptStateError(path, f"{len(data) - CRC.size - position} stray bytes", position)
    if not any(aborted):
        aborted = []
    return Checkpoint(sequence, written_at, tuple(partitions), version, subscriptions, next_id,
                      tuple(aborted), counters, by_subscription)


def _encode_counters(counters: Counters) -> bytes:
    """Counter records; a value past the field saturates (a take may ask for any count,
    and one absurd ask must never make every later checkpoint unwritable)."""
    parts = [COUNT.pack(len(counters))]
    for name, value in counters:
        raw = name.encode("ascii")
        parts.append(bytes([len(raw)]) + raw + VALUE.pack(min(max(value, 0), MAX_COUNTER)))
    return b"".join(parts)


def _all_counters(data: bytes, position: int, known: set[int], path: Path | str,
                  ) -> tuple[Counters, tuple[tuple[int, Counters], ...], int]:
    """The v5 counters: the channel's, each subscription's (`known`: the ids there are),
    and the position after them."""
    try:
        counters, position = _counters(data, position, path)
        (count,) = COUNT.unpack_from(data, position)
        if not 0 <= count <= len(known):
            raise CorruptStateError(path, f"{count} subscription counter sets for "
                                          f"{len(known)} subscriptions", position)
        position += COUNT.size
        sets: list[tuple[int, Counters]] = []
        for _ in range(count):
            (sub_id,) = COUNT.unpack_from(data, position)
            if sub_id not in known or any(i == sub_id for i, _ in sets):
                raise CorruptStateError(path, f"counters of subscription id {sub_id}: "
                                              "unknown or twice", position)
            its, position = _counters(data, position + COUNT.size, path)
            sets.append((sub_id, its))
    except struct.error as exc:
        raise CorruptStateError(path, f"counter records end early ({exc})", position) from exc
    return counters, tuple(sets), position


def _counters(data: bytes, position: int, path: Path | str) -> tuple[Counters, int]:
    """One list of counter records (name, value), and the position after it."""
    (count,) = COUNT.unpack_from(data, position)
    position += COUNT.size
    if count < 0:
        raise struct.error(f"negative counter count {count}")
    found: list[tuple[str, int]] = []
    for _ in range(count):
        length = data[position] if position < len(data) else 0
        raw = data[position + 1:position + 1 + length]
        (value,) = VALUE.unpack_from(data, position + 1 + length)
        if not 0 < length <= COUNTER_NAME or len(raw) != length or not raw.isascii() \
                or value < 0 or any(n == raw.decode() for n, _ in found):
            raise CorruptStateError(path, f"counter record {len(found)}: name {raw!r}, "
                                          f"value {value}", position)
        found.append((raw.decode(), value))
        position += 1 + length + VALUE.size
    return tuple(found), position


def _subscriptions(data: bytes, position: int, partitions: int, path: Path | str,
                   ) -> tuple[tuple[SubscriptionCheckpoint, ...], int, int]:
    """The v4 subscription records: (subscriptions, next id, position after them)."""
    end = len(data) - CRC.size
    try:
        (next_id,) = COUNT.unpack_from(data, position)
        (count,) = COUNT.unpack_from(data, position + COUNT.size)
        if next_id < 1 or not 0 <= count < next_id:
            raise CorruptStateError(path, f"{count} subscriptions, next id {next_id}",
                                    position)
        position += 2 * COUNT.size
        found: list[SubscriptionCheckpoint] = []
        for _ in range(count):
            sub_id, length = SUBSCRIPTION.unpack_from(data, position)
            name_at = position + SUBSCRIPTION.size
            raw = data[name_at:name_at + length]
            if not 0 < sub_id < next_id or any(s.id == sub_id for s in found) \
                    or len(raw) != length or name_at + length > end:
                raise CorruptStateError(path, f"subscription record {len(found)}: id "
                                              f"{sub_id}, name length {length}", position)
            try:
                name = raw.decode()
            except UnicodeDecodeError as exc:
                raise CorruptStateError(path, f"subscription {sub_id}: name is not UTF-8",
                                        name_at) from exc
            if name == DEFAULT_SUBSCRIPTION or any(s.name == name for s in found):
                raise CorruptStateError(path, f"subscription {sub_id}: name {name!r} twice",
                                        name_at)
            position = name_at + length
            queues = []
            for _ in range(partitions):
                (taken,) = struct.unpack_from(">q", data, position)
                committed, position = _ranges(data, position + 8)
                in_flight, position = _ranges(data, position)
                queues.append(QueueCheckpoint(taken, committed, in_flight))
            found.append(SubscriptionCheckpoint(sub_id, name, tuple(queues)))
    except struct.error as exc:
        raise CorruptStateError(path, f"subscription records end early ({exc})",
                                position) from exc
    return tuple(found), next_id, position


def _ranges(data: bytes, position: int) -> tuple[tuple[Range, ...], int]:
    (count,) = COUNT.unpack_from(data, position)
    position += COUNT.size
    if count < 0:
        raise struct.error(f"negative range count {count}")
    ranges = tuple(RANGE.unpack_from(data, position + i * RANGE.size) for i in range(count))
    return ranges, position + count * RANGE.size


def _pending(data: bytes, position: int) -> tuple[tuple[PendingPut, ...], int]:
    (count,) = COUNT.unpack_from(data, position)
    position += COUNT.size
    if count < 0:
        raise struct.error(f"negative pending put count {count}")
    pending = tuple(PENDING.unpack_from(data, position + i * PENDING.size)
                    for i in range(count))
    return pending, position + count * PENDING.size


def write(checkpoint: Checkpoint, directory: Path, backup_directory: Path | None,
          create: bool = True) -> None:
    """Write the checkpoint durably to `directory` (created if missing only with `create`:
    a channel's home deleted under its owner stays deleted), then to `backup_directory` if
    given (created if missing)."""
    data = encode(checkpoint)
    for target in (directory, backup_directory):
        if target is not None:
            if create or target is not directory:
                target.mkdir(parents=True, exist_ok=True)
            write_atomically(target / FILE_NAME, data)


def read(path: Path) -> Checkpoint:
    """Read one checkpoint file; FileNotFoundError if absent, else CorruptStateError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:  # a directory in its place, an I/O error
        raise CorruptStateError(path, f"cannot be read ({exc.strerror or exc})", 0) from exc
    return decode(data, path)


def read_newest(directory: Path, backup_directory: Path | None) -> CheckpointRead:
    """Return the newest valid checkpoint of primary and backup, with what was wrong."""
    found: list[tuple[Checkpoint, str]] = []
    problems = []
    for source, target in (("primary", directory), ("backup", backup_directory)):
        if target is None:
            continue
        path = target / FILE_NAME
        try:
            found.append((read(path), source))
        except FileNotFoundError:
            problems.append(f"{path}: missing")
        except CorruptStateError as exc:
            problems.append(str(exc))
    if not found:
        return CheckpointRead(None, None, tuple(problems))
    checkpoint, source = max(found, key=lambda item: item[0].sequence)
    return CheckpointRead(checkpoint, source, tuple(problems))

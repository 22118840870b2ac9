"""Every error class of channel_engine, under one base class, ChannelEngineError.

Every layer raises these (a base module, it imports nothing of the engine). An error
that callers caught as a builtin before it had a class of its own keeps that builtin
as a second base (ConfigError, InvalidEventError and UnknownOperationError (an older
owner's ValueError) are ValueErrors,
OffsetOutOfRangeError and RangeUnavailableError LookupErrors, ExportError and
ExportRunningError RuntimeErrors). Arguments a caller gets wrong (a negative
max_events, an unknown partition in a put) are plain ValueError, as Python's own
functions raise them. The owner protocol rebuilds an error raised in the owner by
its class name here (owner/protocol.py: error_from_wire).

Messages name the file, the position and the numbers involved, so that an
operator reading a log line knows where to look without a debugger.
"""
from __future__ import annotations

import errno
from pathlib import Path
from typing import Protocol


class ChannelEngineError(Exception):
    """Base class of every error raised by channel_engine."""


class ConfigError(ChannelEngineError, ValueError):
    """A configuration setting is missing or out of range."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class InvalidEventError(ChannelEngineError, ValueError):
    """An event handed to the engine is malformed; nothing was written."""

    def __init__(self, index: int, field: str, reason: str) -> None:
        super().__init__(f"event {index}: {field}: {reason}")
        self.index = index
        self.field = field
        self.reason = reason


class BatchTooLargeError(ChannelEngineError, ValueError):
    """A batch is larger than max_batch_bytes (or segment_bytes); nothing was written."""

    def __init__(self, size: int, limit: int, setting: str) -> None:
        super().__init__(f"batch of {size} bytes exceeds {setting}={limit}")
        self.size = size
        self.limit = limit
        self.setting = setting


class CorruptRecordError(ChannelEngineError):
    """Bytes on disk fail a check (CRC, length, magic, offset sequence)."""

    def __init__(self, path: Path | str, position: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt at byte {position}: {reason}")
        self.path = str(path)
        self.position = position
        self.reason = reason


class CorruptIndexError(ChannelEngineError):
    """An index file disagrees with itself or with its log; it is rebuilt, never trusted."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


class IndexAppendError(CorruptIndexError):
    """An index refused an entry (full, or its offset going backwards): appending it would
    corrupt the index. A caller's bug: the log rolls before an index fills up."""


class CorruptStateError(ChannelEngineError):
    """A Weir metadata file (magic, version, CRC) cannot be read; `position` is the byte
    where the check failed (0 when the whole file is in doubt)."""

    def __init__(self, path: Path | str, reason: str, position: int | None = None) -> None:
        where = "" if position is None else f"byte {position}: "
        super().__init__(f"{path}: {where}{reason}")
        self.path = str(path)
        self.reason = reason
        self.position = position or 0


class OffsetOutOfRangeError(ChannelEngineError, LookupError):
    """An offset lies outside [log start offset, log end offset]."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is out of range [{log_start_offset}, {log_end_offset}]"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class LogLockedError(ChannelEngineError):
    """Another process holds the writer lock of this log directory."""

    def __init__(self, directory: Path | str) -> None:
        super().__init__(f"{directory}: another process holds the writer lock (.lock)")
        self.directory = str(directory)


class LogOfflineError(ChannelEngineError):
    """A write or fsync failed; the log refuses further writes until it is reopened."""

    def __init__(self, directory: Path | str, cause: BaseException) -> None:
        super().__init__(f"{directory}: log is offline after an I/O error: {cause}")
        self.directory = str(directory)
        self.cause = cause


class JournalOfflineError(ChannelEngineError):
    """An fdatasync of the commit journal failed: the records appended since its last good
    one may never reach the disk (the kernel may drop the pages it failed to write, and a
    later fsync that succeeds does not bring them back), so no commit after that one is
    acknowledged from this journal; the next checkpoint, which holds those commits, starts
    a new one."""

    def __init__(self, path: Path | str, cause: BaseException) -> None:
        super().__init__(f"{path}: the commit journal is offline after a failed fsync "
                         f"({cause}); commits are durable again after the next checkpoint")
        self.path = str(path)
        self.cause = cause


class StorageError(ChannelEngineError):
    """An I/O operation failed and was undone: nothing was written, the log is usable."""

    def __init__(self, directory: Path | str, cause: OSError, doing: str) -> None:
        super().__init__(f"{directory}: {doing} failed ({cause}); nothing written")
        self.directory = str(directory)
        self.cause = cause


class DiskFullError(StorageError):
    """A write or preallocation ran out of space; it was undone and nothing was appended."""


class LogDirectoryError(LogOfflineError):
    """The partition directory was deleted, replaced, unmounted or made read-only under a
    running log: the batch was not acknowledged and the log is offline until reopened."""

    def __init__(self, directory: Path | str, reason: str) -> None:
        ChannelEngineError.__init__(
            self, f"{directory}: {reason}; this batch was not acknowledged and the log is "
                  "offline until the directory is opened again")
        self.directory = str(directory)
        self.reason = reason
        self.cause = self


class DiskSpaceError(ChannelEngineError):
    """Free space on a data or checkpoint dir is below minimum_required_space; nothing written."""

    def __init__(self, directory: Path | str, free: int, required: int) -> None:
        super().__init__(f"{directory}: {free} bytes free, below minimum_required_space="
                         f"{required}; nothing written")
        self.directory = str(directory)
        self.free = free
        self.required = required


class ReadOnlyLogError(ChannelEngineError):
    """A write was attempted on a log opened read-only."""


class ChannelFullError(ChannelEngineError):
    """A put did not fit under the channel's capacity within keep_alive_ms (Flume's
    ChannelFullException); nothing was written."""

    def __init__(self, channel: str, events: int, untaken: int, capacity: int,
                 waited_ms: int) -> None:
        super().__init__(f"channel {channel!r} is full: {untaken} of capacity={capacity} "
                         f"events untaken, no room for {events} more after waiting "
                         f"{waited_ms} ms (keep_alive_ms); nothing written")
        self.channel = channel
        self.events = events
        self.untaken = untaken
        self.capacity = capacity


class UnknownSubscriptionError(ChannelEngineError, LookupError):
    """A take, reset or removal named a subscription the channel does not have."""

    def __init__(self, channel: str, subscription: str, known: list[str]) -> None:
        super().__init__(f"channel {channel!r} has no subscription {subscription!r} "
                         f"(it has: {', '.join(known)})")
        self.channel = channel
        self.subscription = subscription


class SubscriptionExistsError(ChannelEngineError, ValueError):
    """add_subscription named a subscription the channel has already."""

    def __init__(self, channel: str, subscription: str) -> None:
        super().__init__(f"channel {channel!r} has a subscription {subscription!r} already")
        self.channel = channel
        self.subscription = subscription


class SubscriptionBusyError(ChannelEngineError):
    """A reset or removal of a subscription with takes in flight (Kafka refuses to reset
    the offsets of a group with active members), or a take begun on a subscription being
    removed or reset."""

    def __init__(self, channel: str, subscription: str, reason: str) -> None:
        super().__init__(f"channel {channel!r}, subscription {subscription!r}: {reason}")
        self.channel = channel
        self.subscription = subscription


class TransactionCapacityError(ChannelEngineError, ValueError):
    """A transaction would hold more events than transaction_capacity; it is unchanged."""

    def __init__(self, channel: str, wanted: int, capacity: int) -> None:
        super().__init__(f"channel {channel!r}: a transaction may hold at most "
                         f"transaction_capacity={capacity} events, not {wanted}")
        self.channel = channel
        self.wanted = wanted
        self.capacity = capacity


class TransactionStateError(ChannelEngineError):
    """A transaction was used after it ended, or for the wrong kind of work."""


class ChannelClosedError(TransactionStateError):
    """The channel handle was closed (by another thread of this process, say: its channel
    was deleted or changed) before or while it was used."""


class TakeExpiredError(TransactionStateError):
    """A take transaction's lease ran out: its events went back to the queue."""


class TakeCommittedError(TransactionStateError):
    """A take was committed already (its events are gone for good): a repeated commit
    changes nothing, a rollback cannot return them."""


class ChannelLockedError(ChannelEngineError):
    """Another process has this channel open for writing."""

    def __init__(self, home: Path | str, holder: str) -> None:
        super().__init__(f"{home}: channel is open for writing in another process ({holder}); "
                         "open it read_only=True to inspect it")
        self.home = str(home)
        self.holder = holder


class ChannelGoneError(ChannelEngineError):
    """The channel's home was deleted, or replaced by a new channel of the same name, after
    this process opened it: the old handle writes nothing there."""


class StorageMissingError(ChannelGoneError):
    """An open that must not make a channel (create=False: a drain, a tool, a re-election)
    found some of its files missing: its home (or channel.json), a partition directory.
    Nothing was opened or written; the paths are named."""

    def __init__(self, name: str, paths: list[Path]) -> None:
        self.name, self.paths = name, [str(p) for p in paths]
        super().__init__(f"channel {name!r}: its storage is missing: {', '.join(self.paths)} "
                         "(a volume not mounted, a directory removed, or the channel "
                         "deleted); nothing is written there until the volume is back or an "
                         "operator recreates the channel")


class RepairRefusedError(ChannelEngineError):
    """recover found partition storage missing (tools/missing_storage.py): a repair cannot
    make it back, so it changed nothing; the paths and the operator's way are named."""

    def __init__(self, message: str, paths: list[str]) -> None:
        super().__init__(message)
        self.paths = paths


class ChannelExistsError(ChannelEngineError):
    """Channel.create found a channel, or files of one, where the new channel would go
    (Kafka's TopicExistsException): nothing was written."""

    def __init__(self, path: object, what: str) -> None:
        super().__init__(f"{path}: {what}; a new channel is made only where none is")
        self.path = str(path)


class PartitionCountError(ChannelEngineError):
    """A put was encoded for another partition count than the owner's (the channel grew
    and one of them has not reopened it yet); the producer encodes it again for
    `partitions`. Nothing was written."""

    def __init__(self, name: str, partitions: int, encoded_for: int) -> None:
        super().__init__(f"channel {name!r}: the owner has {partitions} partitions, the put "
                         f"was encoded for {encoded_for}")
        self.partitions = partitions


class UnusableFileError(ChannelEngineError):
    """A file or directory the engine needs is there but cannot be used: a file in place of
    a directory, unreadable, on a read-only file system, a symlink loop. Nothing was
    written; the operator moves it aside or fixes it and retries."""

    def __init__(self, path: Path | str, what: str, cause: OSError) -> None:
        super().__init__(f"{path}: cannot be used as {what}: {describe_os_error(cause)}; "
                         "move it aside (or fix it) and retry")
        self.path = str(path)
        self.cause = cause


# --- the log layer: batches, segments ---------------------------------------------

class InvalidBatch(ChannelEngineError):
    """The bytes at a position are not a valid batch. kind: partial, zero_tail or corrupt.
    Callers that know the file turn it into CorruptRecordError (file and position)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class EncryptedBatchError(ChannelEngineError):
    """A batch is encrypted and no key ring was given to read it."""


class DecryptionError(ChannelEngineError):
    """A sealed unit cannot be opened: unknown key id, wrong key, or damaged bytes."""


class UndoFailedError(ChannelEngineError):
    """A failed write could not be undone: bytes past the valid end are unknown."""


# --- the owner layer: other processes reach the owner over its socket ------------------

class OwnerLostError(ChannelEngineError):
    """The connection to the channel's owner process broke; the outcome of the request in
    flight is unknown (a put may or may not have committed; a take was returned)."""


class OwnerUnreachableError(OwnerLostError):
    """The owner had gone before the request was sent: nothing was done, it is safe to retry
    with the next owner."""


class OwnerProtocolError(ChannelEngineError):
    """A message over the owner socket does not follow the owner protocol (owner/protocol.py):
    a peer of another release, or a bug; nothing in it is used."""


# --- the tools -------------------------------------------------------------------------

class UnknownOperationError(ChannelEngineError, ValueError):
    """The channel's owner does not know an operation a client asked for: an owner of an
    older version, during a rolling upgrade (owner/protocol.py). Nothing was done."""

    def __init__(self, op: str) -> None:
        super().__init__(f"the channel's owner does not know the operation {op!r} (an owner "
                         "of an older version); nothing was done")
        self.op = op


class UsageError(ChannelEngineError):
    """Bad command-line input: the CLI exits 2 with the message."""


# --- spark: the exporter ---------------------------------------------------------------

class LostRangeFacts(Protocol):
    """What DamagedRangeError reads of a log.recovery.LostRange (errors imports no layer)."""

    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def position(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def cause(self) -> str: ...


class RangeUnavailableError(ChannelEngineError, LookupError):
    """The partition log cannot supply a whole requested range (spark/source.py)."""

    def __init__(self, channel: str, partition: int, start: int, end: int, reason: str) -> None:
        super().__init__(f"channel {channel!r} partition {partition}: cannot read offsets "
                         f"[{start}, {end}): {reason}")
        self.partition = partition
        self.start = start
        self.end = end


class DamagedRangeError(RangeUnavailableError):
    """A damaged batch holds offsets of the requested range (see spark/source.py's doc)."""

    def __init__(self, channel: str, partition: int, start: int, end: int,
                 lost: LostRangeFacts) -> None:
        super().__init__(channel, partition, start, end,
                         f"offsets {lost.start}..{lost.end - 1} are in a damaged region of "
                         f"{lost.path} at byte {lost.position} ({lost.length} bytes; "
                         f"{lost.cause}); nothing past it was read. `python -m channel_engine "
                         "verify HOME` names it; `recover` (or a read by the channel's owner) "
                         "counts them lost so that the next take skips them")
        self.path = lost.path
        self.position = lost.position
        self.lost = lost


class ExportError(ChannelEngineError, RuntimeError):
    """An export cannot go on: its id file is damaged, a commit record is damaged or of a
    version it does not know, or the output or its temp dir holds files the export did not
    expect (channel_id.py, spark/commit_records.py, spark/output_layout.py). Nothing
    was committed."""


class SinkError(ChannelEngineError, RuntimeError):
    """A run of the Kafka sink cannot go on (kafka_sink/): a topic is missing or too small,
    its offsets record is damaged, the sink's subscription has takes open; the take it
    held, if any, was rolled back."""


class DriverProtocolError(ChannelEngineError, ValueError):
    """A request or reply frame that is not the warm export driver's protocol
    (spark/driver_protocol.py); names what came."""


class ExportRunningError(ChannelEngineError, RuntimeError):
    """Another export of the channel holds its export.lock."""

    def __init__(self, channel: str, path: Path) -> None:
        super().__init__(f"an export of channel {channel!r} is already running "
                         f"(another process holds {path})")
        self.channel, self.path = channel, path


def describe_os_error(exc: OSError) -> str:
    """What an OSError says about its file, in words (no errno digits)."""
    return _OS_ERROR_WORDS.get(exc.errno or 0, (exc.strerror or str(exc)).lower())


_OS_ERROR_WORDS = {
    errno.EISDIR: "it is a directory, not a regular file",
    errno.ENOTDIR: "it (or a directory above it) is not a directory",
    errno.EEXIST: "it exists and is not a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ELOOP: "a symbolic link loop",
    errno.EROFS: "the file system is read-only",
    errno.ENXIO: "it is a socket or device, not a regular file",
}


# -- signals inside the engine: each is caught by the module named, never seen by a caller --
class RoomWouldWait(ChannelEngineError):
    """Puts.begin(wait=False): the put would wait for room; nothing was written or counted.
    Never reaches a caller of the owner: the server begins the put again where it may wait."""


class OffsetGap(ChannelEngineError):
    """A record batch's records do not continue the offsets at `due`: `got` came instead
    (spark/arrow_decode.py raises it, spark/source.py answers it)."""

    def __init__(self, got: int, due: int) -> None:
        super().__init__(f"offset {got} where {due} was due")
        self.got = got
        self.due = due

"""channel_engine: Weir's storage engine, a plain Python library (no Django, Celery or Spark).

A partition is a Kafka-format log (segments of record batches v2 with sparse
offset and time indexes); channels, transactions and checkpoints build on it.
See FORMAT.md for the files on disk.

Layers, lowest first; a module imports only its own layer and those below
(tests/test_import_layers.py checks):

  base      errors, event, atomic_file, disk_space, filenames, encryption (this folder)
  log/      one partition's log: record batches, segments, indexes, loader, state, config
  queue/    a channel's semantics in one process: queues, checkpoint, commit journals,
            replay, put batches, channel config, the in-process ChannelOwner
  owner/    one process owns a channel and serves the others: protocol, server, client
  channel   channel.py, transaction.py and this module: the public API
  tools/    the operator's CLI (`python -m channel_engine`), verify, recover

spark/ (the exporter) uses the names exported here, plus the few lower modules that
tests/test_import_layers.py allows and says why.
"""
from channel_engine.channel import Channel
from channel_engine.errors import (
    BatchTooLargeError,
    ChannelClosedError,
    ChannelEngineError,
    ChannelExistsError,
    ChannelFullError,
    ChannelGoneError,
    ChannelLockedError,
    ConfigError,
    CorruptIndexError,
    CorruptRecordError,
    CorruptStateError,
    DiskFullError,
    DiskSpaceError,
    InvalidEventError,
    LogDirectoryError,
    LogLockedError,
    LogOfflineError,
    OffsetOutOfRangeError,
    OwnerLostError,
    PartitionCountError,
    ReadOnlyLogError,
    StorageError,
    StorageMissingError,
    SubscriptionBusyError,
    SubscriptionExistsError,
    TakeCommittedError,
    TakeExpiredError,
    TransactionCapacityError,
    TransactionStateError,
    UnknownOperationError,
    UnknownSubscriptionError,
)
from channel_engine.event import Event, PendingEvent
from channel_engine.filenames import recreate_temp_dir
from channel_engine.log.config import LogConfig
from channel_engine.log.fetch import FetchData, FileSlice
from channel_engine.log.partition_log import AppendResult, PartitionLog, RetentionResult
from channel_engine.log.recovery import LostRange, RecoveryReport
from channel_engine.log.state import MAX_OFFSET
from channel_engine.queue.channel_config import ChannelConfig
from channel_engine.queue.channel_owner import ChannelOwner
from channel_engine.queue.channel_recovery import ChannelRecovery
from channel_engine.queue.checkpointer import CheckpointResult
from channel_engine.queue.subscription import DEFAULT as DEFAULT_SUBSCRIPTION
from channel_engine.queue.subscription import NAME as _NAME
from channel_engine.queue.subscription import check_name as check_subscription_name
from channel_engine.transaction import PutTransaction, TakeTransaction

SUBSCRIPTION_NAME_PATTERN = _NAME.pattern  # a subscription's name, whole (fullmatch)

__version__ = "0.1.0"

__all__ = [
    "AppendResult",
    "BatchTooLargeError",
    "Channel",
    "ChannelConfig",
    "ChannelEngineError",
    "ChannelFullError",
    "ChannelExistsError",
    "ChannelGoneError",
    "ChannelLockedError",
    "ChannelOwner",
    "ChannelRecovery",
    "CheckpointResult",
    "ConfigError",
    "CorruptIndexError",
    "CorruptRecordError",
    "CorruptStateError",
    "DiskFullError",
    "DiskSpaceError",
    "Event",
    "FetchData",
    "FileSlice",
    "InvalidEventError",
    "LogConfig",
    "LogDirectoryError",
    "LogLockedError",
    "LogOfflineError",
    "LostRange",
    "MAX_OFFSET",
    "OffsetOutOfRangeError",
    "PartitionCountError",
    "OwnerLostError",
    "PartitionLog",
    "PendingEvent",
    "PutTransaction",
    "ReadOnlyLogError",
    "RecoveryReport",
    "RetentionResult",
    "StorageError",
    "StorageMissingError",
    "TakeCommittedError",
    "TakeExpiredError",
    "TakeTransaction",
    "SubscriptionBusyError",
    "SubscriptionExistsError",
    "TransactionCapacityError",
    "UnknownSubscriptionError",
    "DEFAULT_SUBSCRIPTION",
    "check_subscription_name",
    "recreate_temp_dir",
    "SUBSCRIPTION_NAME_PATTERN",
    "ChannelClosedError",
    "TransactionStateError",
    "UnknownOperationError",
    "__version__",
]

"""channel_engine: Weir's storage engine, a plain Python library (no Django, Celery or Spark).

A partition is a Kafka-format log (segments of record batches v2 with sparse
offset and time indexes); channels, transactions and checkpoints build on it.
See FORMAT.md for the files on disk.
"""
from channel_engine.channel import Channel
from channel_engine.channel_config import ChannelConfig
from channel_engine.channel_owner import ChannelOwner, CheckpointResult
from channel_engine.channel_recovery import ChannelRecovery
from channel_engine.config import LogConfig
from channel_engine.errors import (
    BatchTooLargeError,
    ChannelClosedError,
    ChannelEngineError,
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
    LogLockedError,
    LogOfflineError,
    OffsetOutOfRangeError,
    PartitionCountError,
    ReadOnlyLogError,
    StorageError,
    TakeCommittedError,
    TakeExpiredError,
    TransactionCapacityError,
    TransactionStateError,
)
from channel_engine.event import Event, PendingEvent
from channel_engine.log import AppendResult, PartitionLog, RetentionResult
from channel_engine.owner_protocol import OwnerLostError
from channel_engine.recovery import RecoveryReport
from channel_engine.transaction import PutTransaction, TakeTransaction

__version__ = "0.1.0"

__all__ = [
    "AppendResult",
    "BatchTooLargeError",
    "Channel",
    "ChannelConfig",
    "ChannelEngineError",
    "ChannelFullError",
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
    "InvalidEventError",
    "LogConfig",
    "LogLockedError",
    "LogOfflineError",
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
    "TakeCommittedError",
    "TakeExpiredError",
    "TakeTransaction",
    "TransactionCapacityError",
    "ChannelClosedError",
    "TransactionStateError",
    "__version__",
]

"""LogConfig: every setting of a partition log, defined once with its default, check and doc.

Names follow Kafka's topic configs in snake case with the unit in the name
(segment.bytes -> segment_bytes, flush.ms -> flush_ms). Where Weir's default
differs from Kafka's the doc says why. The engine never reads Django settings:
the appliance builds this object from its models in exactly one place.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from channel_engine.errors import ConfigError
from channel_engine.log.record_batch import COMPRESSION_CODECS, HEADER_SIZE

INT32_MAX = 2**31 - 1
DAY_MS = 24 * 3600 * 1000


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclass(frozen=True)
class LogConfig:
    """Settings of one partition log. Frozen: build a new one with `replace()`."""

    durability: str = field(default="fsync", metadata=_doc(
        "'fsync': an append returns only after its batch is on disk (concurrent appends share "
        "one fsync). 'policy': Kafka's flush_messages / flush_ms bound the loss window. "
        "Kafka defaults to the OS flush because replicas cover a crash; one appliance has none."))
    flush_messages: int | None = field(default=None, metadata=_doc(
        "policy mode: fsync inside append once this many events are unflushed (Kafka "
        "flush.messages). None: no count trigger."))
    flush_ms: int | None = field(default=None, metadata=_doc(
        "policy mode: flush_if_due() fsyncs once this many ms passed since the last flush "
        "(Kafka flush.ms). None: no time trigger."))
    segment_bytes: int = field(default=1024**3, metadata=_doc(
        "Roll to a new segment when the next batch would make the active one larger "
        "(Kafka segment.bytes). At most 2 GiB - 1: index positions are Kafka's int32."))
    segment_ms: int = field(default=7 * DAY_MS, metadata=_doc(
        "Roll when the incoming batch's max timestamp is this much later than the first "
        "batch's (Kafka segment.ms)."))
    segment_index_bytes: int = field(default=10 * 1024**2, metadata=_doc(
        "Largest .index file; a full index rolls the segment (Kafka segment.index.bytes)."))
    index_interval_bytes: int = field(default=4096, metadata=_doc(
        "Add an offset and a time index entry after this many bytes of batches "
        "(Kafka index.interval.bytes)."))
    max_batch_bytes: int = field(default=1048588, metadata=_doc(
        "Largest record batch accepted, header included; a larger one is refused before "
        "anything is written (Kafka message.max.bytes)."))
    preallocate: bool = field(default=False, metadata=_doc(
        "Preallocate each new segment file to segment_bytes and trim it on roll and close "
        "(Kafka preallocate, KIP-20)."))
    verify_on_open: bool = field(default=True, metadata=_doc(
        "Check every batch's CRC-32C at each writable or read-only open, after a clean "
        "shutdown too, so that damage is counted before events_untaken promises its events "
        "(about 0.2 s of CPU per GB plus reading the retained log). False trusts a clean "
        "log's bytes, as Kafka does: damage is then found by the read that meets it."))
    compression: str = field(default="none", metadata=_doc(
        "Codec of each written batch: none, gzip, snappy, lz4 or zstd (Kafka's codec bits "
        "in the batch attributes). Reading handles every codec whatever this says."))
    retention_ms: int = field(default=7 * DAY_MS, metadata=_doc(
        "Delete a segment whose largest timestamp is older than this, the active one too "
        "(rolled first, the log end kept); -1 keeps forever (Kafka retention.ms)."))
    retention_bytes: int = field(default=-1, metadata=_doc(
        "Delete the oldest segments while the log is larger than this; -1: no limit "
        "(Kafka retention.bytes)."))
    file_delete_delay_ms: int = field(default=60_000, metadata=_doc(
        "Time between renaming a deleted segment to .deleted and unlinking it, so that "
        "reads in flight finish (Kafka file.delete.delay.ms)."))
    recovery_point_checkpoint_ms: int = field(default=60_000, metadata=_doc(
        "How often flush_if_due() persists an advanced recovery point to log.state "
        "(Kafka log.flush.offset.checkpoint.interval.ms). A stale one only costs "
        "a longer scan after a crash."))

    def __post_init__(self) -> None:
        _check(self)

    def replace(self, **changes: Any) -> LogConfig:
        """Return a copy with some settings changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return the settings as a plain JSON-serialisable dict."""
        return dataclasses.asdict(self)

    @classmethod
    def docs(cls) -> dict[str, str]:
        """Return each setting's documentation, by name."""
        return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls)}


def require(ok: bool, name: str, reason: str) -> None:
    """Raise ConfigError(name, reason) unless ok (shared by every config class)."""
    if not ok:
        raise ConfigError(name, reason)


def check_int(config: object, name: str, low: int, high: int = 2**63 - 1) -> None:
    """Require setting `name` of `config` to be an int (not a bool) in [low, high]."""
    value = getattr(config, name)
    require(isinstance(value, int) and not isinstance(value, bool), name,
             f"must be an integer, not {value!r}")
    require(low <= value <= high, name, f"must be between {low} and {high}, not {value}")


def _check(c: LogConfig) -> None:
    require(c.durability in ("fsync", "policy"), "durability",
             f"must be 'fsync' or 'policy', not {c.durability!r}")
    for name in ("flush_messages", "flush_ms"):
        if getattr(c, name) is not None:
            check_int(c, name, 1, 2**63 - 1)
    if c.durability == "policy":
        require(c.flush_messages is not None or c.flush_ms is not None, "durability",
                 "'policy' needs flush_messages or flush_ms, or the loss window is unbounded")
    check_int(c, "segment_bytes", 4 * HEADER_SIZE, INT32_MAX)
    check_int(c, "segment_ms", 1, 2**63 - 1)
    check_int(c, "segment_index_bytes", 4 * 12, INT32_MAX)
    check_int(c, "index_interval_bytes", 0, INT32_MAX)
    check_int(c, "max_batch_bytes", HEADER_SIZE, INT32_MAX)
    require(isinstance(c.preallocate, bool), "preallocate", "must be true or false")
    require(isinstance(c.verify_on_open, bool), "verify_on_open", "must be true or false")
    require(c.compression in COMPRESSION_CODECS, "compression",
             f"must be one of {', '.join(COMPRESSION_CODECS)}, not {c.compression!r}")
    check_int(c, "retention_ms", -1, 2**63 - 1)
    check_int(c, "retention_bytes", -1, 2**63 - 1)
    check_int(c, "file_delete_delay_ms", 0, 2**63 - 1)
    check_int(c, "recovery_point_checkpoint_ms", 0, 2**63 - 1)

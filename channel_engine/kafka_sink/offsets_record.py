"""The sink's offsets record: what of a channel a Kafka topic holds, written to Kafka inside
the very transaction that sends those events (as Kafka Connect's exactly-once source
connectors write their source offsets, KIP-618), so that Kafka alone says what was sent.

Where: partition 0 of the offsets topic (settings.offsets_topic, default
`weir-sink-offsets`), whatever its partition count: a partition picked by the key's hash
would move when an operator adds partitions, and a run looking in the new one would find
no record and send everything again. The first run that misses the topic makes it
(TOPIC_CONFIGS): compacted, so Kafka keeps the last record of each key, with segments
rolled hourly so that compaction, which leaves the active segment alone, keeps the
partition a run reads from its start small. A run refuses a topic whose cleanup.policy
lets Kafka delete records (`delete` with a finite retention): an idle stream's record
would go, and with it the knowledge of what was sent. Every stream shares partition 0: a
sink stopped mid-transaction holds its last stable offset, and the other streams' runs
wait for the broker to abort that transaction (sink.py, _stable_end).

Key: UTF-8 `weir-sink/<channel id>/<topic>` (the channel id of channel_id.py: a channel
deleted and made again under its name is another stream). Value: UTF-8 JSON

    field         type                      what
    ------------  ------------------------  ---------------------------------------------
    format        "weir-kafka-sink-offsets" what this is
    version       1 or 2                    the value's format version: 2 when it holds
                                            incarnations, else 1 (below)
    channel       str                       the channel's name (for people)
    channel_id    str                       as in the key
    topic         str                       as in the key
    subscription  str                       the subscription the run drained (for people)
    run_id        str                       the run that wrote it (<ms>-<hex>)
    transaction   int                       its Kafka transaction within the run, from 1
    events        int                       events that transaction sent
    sent          {"<partition>": [[s, e]]} every offset range [s, e) of each channel
                                            partition the topic holds, merged, sorted
    written_ms    int                       when the run wrote it (wall clock, ms)
    incarnations  {"<partition>": "<id>"}   optional: the incarnation of each channel
                                            partition whose `sent` ranges it holds when
                                            not the original one (incarnations.py); a
                                            partition it does not name is the original

A record without incarnations (written before them) holds ranges of the original
incarnations. One with them is version 2, so that a Weir older than incarnations, which
reads version 1 only, refuses it (SinkError, the run stops) rather than rewrite it
without them at its next transaction and so relabel a recreated partition's ranges as
the original's (false refusals for good). A record of a stream whose partitions are all
original stays version 1, readable by that older Weir too. This Weir reads both; a
version 1 record naming incarnations is damage.

A partition's label is that of the run that last sent to it: a run checks the record
against each partition's incarnation before it takes anything (sink.py), so
the ranges of an older incarnation it relabels all lie below the current one's start.

`sent` is cumulative: the last committed record of a key is the whole truth, whichever
subscription (or run) sent what. A run sends what it took less `sent`, so an event
reaches the topic once even when its take came back after a kill, a subscription was
reset to an earlier position, or the sink changed subscriptions. To send a channel's
events to the topic again, point the sink at another topic (or delete the record's
key from the offsets topic: a tombstone, `null` value, forgets the stream).

Reading (read_committed: a record of an aborted or still open transaction is never
seen): a value of another format or version, or one that does not parse, stops the
run with SinkError naming the offsets topic and partition; it is never taken for
"nothing sent", which would send everything again.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka.partitioner import murmur2

from channel_engine.errors import SinkError
from channel_engine.incarnations import ORIGINAL, Recorded
from channel_engine.offset_ranges import Range, merge

FORMAT = "weir-kafka-sink-offsets"
VERSION = 2  # written when the record holds incarnations (module doc)
VERSION_WITHOUT_INCARNATIONS = 1  # the first version: every partition original
PARTITION = 0
TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.ms": str(3_600_000),
                 "min.cleanable.dirty.ratio": "0.1"}


@dataclass
class OffsetsRecord:
    """The value of one offsets record (the table above)."""

    channel: str
    channel_id: str
    topic: str
    subscription: str
    run_id: str = ""
    transaction: int = 0
    events: int = 0
    sent: dict[int, list[Range]] = field(default_factory=dict)
    written_ms: int = 0
    incarnations: dict[int, str] = field(default_factory=dict)  # absent: ORIGINAL

    @property
    def key(self) -> bytes:
        """The record's key."""
        return record_key(self.channel_id, self.topic)

    def with_sent(self, ranges: list[tuple[int, Range]], run_id: str, transaction: int,
                  subscription: str, *, incarnations: dict[int, str]) -> OffsetsRecord:
        """The record after a transaction that sends `ranges` ((partition, range) pairs) of
        partitions whose incarnations are `incarnations` (a partition absent: ORIGINAL;
        always given, so that no record relabels a recreated partition's ranges)."""
        sent = {p: list(r) for p, r in self.sent.items()}
        labels = dict(self.incarnations)
        for partition, piece in ranges:
            sent[partition] = merge(sent.get(partition, []) + [piece])
            labels[partition] = incarnations.get(partition, ORIGINAL)
        return OffsetsRecord(self.channel, self.channel_id, self.topic, subscription, run_id,
                             transaction, sum(e - s for _, (s, e) in ranges), sent,
                             int(time.time() * 1000),
                             {p: i for p, i in labels.items() if i != ORIGINAL})

    def by_incarnation(self) -> Recorded:
        """The ranges sent, by partition and incarnation (incarnations.conflicts)."""
        return {p: {self.incarnations.get(p, ORIGINAL): ranges}
                for p, ranges in self.sent.items()}

    def encode(self) -> bytes:
        """The record's value."""
        return json.dumps({
            "format": FORMAT,
            "version": VERSION if self.incarnations else VERSION_WITHOUT_INCARNATIONS,
            "channel": self.channel,
            "channel_id": self.channel_id, "topic": self.topic,
            "subscription": self.subscription, "run_id": self.run_id,
            "transaction": self.transaction, "events": self.events,
            "sent": {str(p): [list(r) for r in ranges] for p, ranges in sorted(self.sent.items())},
            "written_ms": self.written_ms,
            **({"incarnations": {str(p): i for p, i in sorted(self.incarnations.items())}}
               if self.incarnations else {})}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes, where: str) -> OffsetsRecord:
        """A record's value; SinkError naming `where` unless it is one of ours."""
        try:
            doc = json.loads(value)
            version = doc.get("version")
            if doc.get("format") != FORMAT or version not in (VERSION_WITHOUT_INCARNATIONS,
                                                             VERSION):
                raise ValueError(f"not format {FORMAT} version "
                                 f"{VERSION_WITHOUT_INCARNATIONS} or {VERSION}")
            if version == VERSION_WITHOUT_INCARNATIONS and "incarnations" in doc:
                raise ValueError(f"version {version} names incarnations")
            sent = {int(p): [(int(s), int(e)) for s, e in ranges]
                    for p, ranges in doc["sent"].items()}
            if any(p < 0 or s < 0 or e < s for p, rs in sent.items() for s, e in rs):
                raise ValueError("a negative partition or offset, or a range ending first")
            incarnations = {int(p): i for p, i in doc.get("incarnations", {}).items()}
            if not all(isinstance(i, str) and i for i in incarnations.values()):
                raise ValueError("an incarnation that is not a non-empty string")
            return cls(str(doc["channel"]), str(doc["channel_id"]), str(doc["topic"]),
                       str(doc["subscription"]), str(doc["run_id"]), int(doc["transaction"]),
                       int(doc["events"]), {p: merge(r) for p, r in sent.items()},
                       int(doc["written_ms"]), incarnations)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SinkError(f"the offsets record at {where} is damaged or not Weir's "
                            f"({type(exc).__name__}: {exc}); the sink stops rather than "
                            "send what it may have sent already") from exc


def record_key(channel_id: str, topic: str) -> bytes:
    """The offsets record's key of a channel's stream into a topic."""
    return f"weir-sink/{channel_id}/{topic}".encode()


def keeps_records(configs: dict[str, str]) -> bool:
    """Whether a topic with these configs (cleanup.policy, retention.ms, retention.bytes)
    keeps the last record of every key for good."""
    policies = {p.strip() for p in configs.get("cleanup.policy", "delete").split(",")}
    return "delete" not in policies or (configs.get("retention.ms") == "-1"
                                        and configs.get("retention.bytes") == "-1")


def key_partition(key: bytes, partitions: int) -> int:
    """A keyed record's partition as the Java client's default partitioner picks it:
    murmur2 of the key, made positive, mod the partition count."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


def sent_ranges(record: OffsetsRecord | None) -> dict[int, list[Range]]:
    """The ranges a record says the topic holds, by partition (none without a record)."""
    return {} if record is None else record.sent


def describe_sent(sent: dict[int, list[Range]]) -> dict[str, Any]:
    """`sent` for a report line: partition -> ranges."""
    return {str(p): [list(r) for r in ranges] for p, ranges in sorted(sent.items())}

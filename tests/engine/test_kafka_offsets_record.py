"""offsets_record.py without a broker: the record's value round-trips, `sent` accumulates
merged ranges, and which offsets-topic configs keep a stream's record for good."""
from __future__ import annotations

import pytest

from channel_engine.errors import SinkError
from channel_engine.kafka_sink.offsets_record import OffsetsRecord, keeps_records


def test_a_record_round_trips_and_accumulates_what_was_sent() -> None:
    first = OffsetsRecord("orders", "abc", "t", "kafka").with_sent(
        [(0, (0, 10)), (1, (5, 7))], "run-1", 1, "kafka", incarnations={})
    second = first.with_sent([(0, (10, 20)), (1, (9, 12))], "run-1", 2, "kafka",
                             incarnations={})
    assert second.sent == {0: [(0, 20)], 1: [(5, 7), (9, 12)]}
    assert second.events == 13 and second.transaction == 2
    again = OffsetsRecord.decode(second.encode(), "here")
    assert again == second and again.key == b"weir-sink/abc/t"


@pytest.mark.parametrize("value", [b"{", b'{"format": "weir-kafka-sink-offsets", "version": 3}',
                                   b'{"format": "weir-kafka-sink-offsets", "version": 1, '
                                   b'"sent": {"0": [[5, 1]]}}'])
def test_a_value_not_ours_is_refused_naming_where(value: bytes) -> None:
    with pytest.raises(SinkError, match="offsets record at topic x partition 0"):
        OffsetsRecord.decode(value, "topic x partition 0")


@pytest.mark.parametrize(("configs", "keeps"), [
    ({"cleanup.policy": "compact", "retention.ms": "604800000", "retention.bytes": "-1"}, True),
    ({"cleanup.policy": "compact,delete", "retention.ms": "-1", "retention.bytes": "-1"}, True),
    ({"cleanup.policy": "compact,delete", "retention.ms": "604800000",
      "retention.bytes": "-1"}, False),
    ({"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}, True),
    ({"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "1073741824"}, False),
    ({"cleanup.policy": "delete", "retention.ms": "-1"}, False),  # not told: not assumed
    ({}, False),
])
def test_which_offsets_topics_keep_every_streams_record(configs: dict[str, str],
                                                        keeps: bool) -> None:
    assert keeps_records(configs) is keeps

"""The drains' check of what they sent against each partition's incarnation
(channel_engine/incarnations.py), and the incarnations their records carry."""
from __future__ import annotations

import inspect
import json
from typing import Any

import pytest

from channel_engine.errors import ExportError, SinkError
from channel_engine.incarnations import (
    ORIGINAL,
    PartitionIncarnation,
    conflicts,
    record_incarnations,
)
from channel_engine.kafka_sink.offsets_record import OffsetsRecord
from channel_engine.spark.commit_records import CommitRecords, commit_record, read_record
from channel_engine.spark.export_report import describe

NEW = "ab" * 16


def _part(incarnation: str = ORIGINAL, start: int = 0, end: int = 100,
          partition: int = 1) -> PartitionIncarnation:
    return PartitionIncarnation(partition, incarnation, start, end, "/data/b/orders-1")


def test_ranges_of_the_same_incarnation_within_the_log_are_fine() -> None:
    assert conflicts("orders", [_part(end=100)], {1: {ORIGINAL: [(0, 100)]}}, "export") == []


def test_ranges_of_an_older_incarnation_below_the_start_are_fine() -> None:
    current = [_part(NEW, start=60, end=90)]
    assert conflicts("orders", current, {1: {ORIGINAL: [(0, 40), (50, 60)]}}, "export") == []


def test_ranges_of_an_older_incarnation_reaching_the_start_conflict() -> None:
    current = [_part(NEW, start=60, end=90)]
    [found] = conflicts("orders", current, {1: {ORIGINAL: [(0, 61)]}}, "export")
    assert "channel 'orders' partition 1" in found
    assert "starting at offset 60" in found and "offsets up to 60" in found
    assert "nothing was taken or written" in found
    assert "manage.py recreate_channel orders --yes --next-offset 1:61" in found
    assert "/data/b/orders-1" in found


def test_ranges_recorded_under_a_later_recreate_conflict_with_another_one() -> None:
    """Ranges of any incarnation other than the current one count, not only ORIGINAL."""
    current = [_part("cd" * 16, start=10, end=20)]
    assert conflicts("orders", current, {1: {NEW: [(0, 15)]}}, "Kafka sink")


def test_a_log_ending_below_what_its_own_incarnation_sent_conflicts() -> None:
    [found] = conflicts("orders", [_part(end=50)], {1: {ORIGINAL: [(0, 80)]}}, "Kafka sink")
    assert "the Kafka sink had sent offsets up to 79" in found
    assert "now ends at offset 50" in found
    assert "--next-offset 1:80" in found


def test_other_partitions_and_unrecorded_ones_are_left_alone() -> None:
    current = [_part(partition=0, end=5), _part(NEW, start=60, end=60)]
    assert conflicts("orders", current, {0: {ORIGINAL: [(0, 5)]}}, "export") == []


def test_a_record_names_only_partitions_not_original() -> None:
    current = [_part(partition=0), _part(NEW, 60, 90, partition=1)]
    assert record_incarnations(current, [0, 1]) == {"1": NEW}
    assert record_incarnations(current, [0]) == {}


def test_a_commit_record_carries_its_incarnations_and_old_ones_read_as_original() -> None:
    record = commit_record("r1", "id", [], {1: [(60, 70)]}, 2, incarnations={"1": NEW})
    assert read_record("r1.json", json.dumps(record).encode())["incarnations"] == {"1": NEW}
    plain = commit_record("r0", "id", [], {1: [(0, 60)]}, 2, incarnations={})
    assert "incarnations" not in plain
    assert read_record("r0.json", json.dumps(plain).encode()).get("incarnations") is None


@pytest.mark.parametrize("bad", [[], {"1": ""}, {"1": 7}])
def test_a_commit_record_with_malformed_incarnations_is_damage(bad: object) -> None:
    record = commit_record("r1", "id", [], {1: [(60, 70)]}, 2, incarnations={})
    record["incarnations"] = bad
    with pytest.raises(ExportError, match="damaged commit record"):
        read_record("r1.json", json.dumps(record).encode())


def test_the_offsets_record_labels_the_partitions_it_sends_to() -> None:
    old = OffsetsRecord("orders", "id", "t", "kafka", sent={0: [(0, 5)], 1: [(0, 80)]})
    assert old.by_incarnation() == {0: {ORIGINAL: [(0, 5)]}, 1: {ORIGINAL: [(0, 80)]}}
    after = old.with_sent([(1, (80, 90))], "run", 1, "kafka",
                          incarnations={0: ORIGINAL, 1: NEW})
    assert after.incarnations == {1: NEW}
    decoded = OffsetsRecord.decode(after.encode(), "weir-sink-offsets/0")
    assert decoded.by_incarnation() == {0: {ORIGINAL: [(0, 5)]}, 1: {NEW: [(0, 90)]}}
    assert b"incarnations" not in old.encode()  # an original stream's record as before


def test_an_offsets_record_with_a_malformed_incarnation_is_refused() -> None:
    value = json.loads(OffsetsRecord("orders", "id", "t", "kafka").encode())
    value["incarnations"] = {"1": ""}
    with pytest.raises(SinkError, match="damaged or not Weir's"):
        OffsetsRecord.decode(json.dumps(value).encode(), "weir-sink-offsets/0")


def test_an_export_refusal_is_told_as_its_sentence_without_a_class_name() -> None:
    [refusal] = conflicts("orders", [_part(NEW, start=60, end=90)],
                          {1: {ORIGINAL: [(0, 80)]}}, "export")
    assert describe(ExportError(refusal)) == refusal
    assert describe(ValueError("bad")) == "ValueError: bad"  # not the engine's: named


@pytest.mark.parametrize("function", [commit_record, CommitRecords.compact,
                                      CommitRecords.commit, OffsetsRecord.with_sent])
def test_every_record_writer_must_be_told_the_incarnations(function: Any) -> None:
    """Keyword-only and required: a call that forgets them cannot write a record that
    relabels a recreated partition's ranges as the original's."""
    parameter = inspect.signature(function).parameters["incarnations"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
    assert parameter.default is inspect.Parameter.empty


def test_an_offsets_record_with_incarnations_is_version_2_which_an_older_sink_refuses(
        ) -> None:
    plain = OffsetsRecord("orders", "id", "t", "kafka", sent={0: [(0, 5)]})
    labelled = plain.with_sent([(1, (0, 9))], "run", 1, "kafka", incarnations={1: NEW})
    assert json.loads(plain.encode())["version"] == 1  # readable by an older Weir still
    assert json.loads(labelled.encode())["version"] == 2  # an older Weir reads 1 only
    for record in (plain, labelled):
        assert OffsetsRecord.decode(record.encode(), "here") == record
    mislabelled = json.loads(labelled.encode())
    mislabelled["version"] = 1
    with pytest.raises(SinkError, match="version 1 names incarnations"):
        OffsetsRecord.decode(json.dumps(mislabelled).encode(), "here")


def test_a_refusal_says_its_next_offset_is_a_least_one_among_the_drains() -> None:
    """Each drain names only its own sent end: the operator is told to take the highest."""
    [recreated] = conflicts("orders", [_part(NEW, start=60, end=90)],
                            {1: {ORIGINAL: [(0, 61)]}}, "export")
    [went_back] = conflicts("orders", [_part(end=50)], {1: {ORIGINAL: [(0, 80)]}},
                            "Kafka sink")
    for found in (recreated, went_back):
        assert "the least next offset this drain needs" in found
        assert "use the highest offset any of them names" in found
    assert "flush-policy durability" in went_back  # a cause besides a restored copy

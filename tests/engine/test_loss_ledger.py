"""LossLedger: losses.json records each lost range once, survives reopening, and a damaged
or missing ledger is itself reported, never a failed open and never a hidden loss."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from channel_engine import StorageError
from channel_engine.event import Event
from channel_engine.log.recovery import LostRange
from channel_engine.queue import loss_ledger
from channel_engine.queue.loss_ledger import (
    JOURNAL_PARTITION,
    LEDGER_FILE,
    LEDGER_PARTITION,
    LossLedger,
    covers,
    deliverable,
    undelivered,
)

HOLE = LostRange(10, 20, "/data/ch-0/00000000000000000010.log", 4096, 700, "gap: missing")


def test_it_records_a_range_once_and_writes_the_documented_fields(tmp_path: Path) -> None:
    ledger = LossLedger.load(tmp_path, writable=True, expect_file=False, now_ms=1000)
    first = ledger.record(0, HOLE, 7, now_ms=2000)
    assert first is not None and first.id == 1
    assert ledger.record(0, HOLE, 0, now_ms=3000) is None  # reported again: one record
    assert ledger.record(1, HOLE, 3, now_ms=3000) is not None  # another partition
    ledger.save()
    doc = json.loads((tmp_path / LEDGER_FILE).read_text())
    assert doc["format"] == "weir-loss-ledger" and doc["version"] == 1
    assert doc["next_id"] == 3
    assert doc["records"][0] == {
        "id": 1, "partition": 0, "start": 10, "end": 20, "events": 7, "path": HOLE.path,
        "position": 4096, "length": 700, "cause": "gap: missing", "detected_at_ms": 2000,
        "acknowledged_at_ms": None}
    summary = ledger.summary()
    assert (summary["events_lost"], summary["unacknowledged_events"],
            summary["unacknowledged"]) == (10, 10, 2)
    assert ledger.events_by_partition() == {0: 7, 1: 3}


def test_it_records_a_journal_of_unknown_content_once_with_no_event_lost(
        tmp_path: Path) -> None:
    ledger = LossLedger.load(tmp_path, writable=True, expect_file=False, now_ms=1)
    path = str(tmp_path / "commits-00000000000000000002.journal")
    first = ledger.record_journal(path, 2, "journal_missing: up to 9 events", now_ms=2)
    assert first is not None and (first.partition, first.start, first.end, first.events) == (
        JOURNAL_PARTITION, 2, 2, 0)
    assert ledger.record_journal(path, 2, "again", now_ms=3) is None  # the next open's
    assert ledger.record_journal(path, 3, "another", now_ms=3) is not None
    ledger.save()
    again = LossLedger.load(tmp_path, writable=True, expect_file=True, now_ms=4)
    assert [r.key for r in again.records] == [(JOURNAL_PARTITION, 2, 2),
                                              (JOURNAL_PARTITION, 3, 3)]
    summary = again.summary()
    assert (summary["events_lost"], summary["unacknowledged"]) == (0, 2)
    assert "commit journal commits-00000000000000000002.journal" in str(again.health_reason())
    assert again.acknowledge(now_ms=5) == 2 and again.health_reason() is None


def test_it_keeps_records_and_acknowledgements_across_reopening(tmp_path: Path) -> None:
    ledger = LossLedger.load(tmp_path, writable=True, expect_file=False, now_ms=1)
    ledger.record(0, HOLE, 7, now_ms=2)
    ledger.save()
    again = LossLedger.load(tmp_path, writable=True, expect_file=True, now_ms=3)
    assert [r.key for r in again.records] == [(0, 10, 20)]
    assert again.record(0, HOLE, 7, now_ms=4) is None  # the key survives too
    assert "7 events lost in 1 unacknowledged" in str(again.health_reason())
    assert again.acknowledge(now_ms=5) == 1
    assert again.acknowledge(now_ms=6) == 0
    assert again.health_reason() is None
    third = LossLedger.load(tmp_path, writable=True, expect_file=True, now_ms=7)
    assert third.records[0].acknowledged_at_ms == 5 and third.unacknowledged() == []
    later = third.record(0, LostRange(30, 31, "p"), 1, now_ms=8)
    assert later is not None and later.id == 2  # ids are not reused


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"format": "other", "version": 1}',
                                    b'{"format": "weir-loss-ledger", "version": 9}',
                                    b'{"format": "weir-loss-ledger", "version": 1, "next_id": 2,'
                                    b' "records": [{"id": 1}]}', b"\xff\xfe", "directory"])
def test_it_reports_a_damaged_ledger_and_moves_it_aside(tmp_path: Path,
                                                         damage: bytes | str) -> None:
    path = tmp_path / LEDGER_FILE
    if damage == "directory":
        path.mkdir()
    else:
        assert isinstance(damage, bytes)
        path.write_bytes(damage)
    ledger = LossLedger.load(tmp_path, writable=True, expect_file=True, now_ms=42)
    [record] = ledger.records
    assert record.partition == LEDGER_PARTITION and record.cause.startswith("ledger_damaged")
    assert (tmp_path / f"{LEDGER_FILE}.damaged-42").exists()  # moved aside, not deleted
    assert "moved to" in record.cause
    ledger.save()  # the new ledger replaces it; the damage record stays until acknowledged
    reread = LossLedger.load(tmp_path, writable=True, expect_file=True, now_ms=43)
    assert [r.cause for r in reread.records] == [record.cause]
    assert reread.health_reason() is not None


def test_a_read_only_ledger_reports_damage_without_touching_the_file(tmp_path: Path) -> None:
    (tmp_path / LEDGER_FILE).write_bytes(b"garbage")
    ledger = LossLedger.load(tmp_path, writable=False, expect_file=True, now_ms=1)
    assert ledger.records[0].cause.startswith("ledger_damaged")
    ledger.record(0, HOLE, 1, now_ms=2)
    ledger.save()
    assert (tmp_path / LEDGER_FILE).read_bytes() == b"garbage"


def test_it_reports_a_missing_ledger_only_where_one_was_written(tmp_path: Path) -> None:
    fresh = LossLedger.load(tmp_path, writable=True, expect_file=False, now_ms=1)
    assert fresh.records == []
    missing = LossLedger.load(tmp_path, writable=True, expect_file=True, now_ms=1)
    assert missing.records[0].cause.startswith("ledger_missing")


def test_a_failed_write_keeps_records_to_write_and_acknowledges_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = LossLedger.load(tmp_path, writable=True, expect_file=False, now_ms=1)
    ledger.record(0, HOLE, 7, now_ms=2)

    def fail(path: Path, data: bytes) -> None:
        raise OSError(30, "Read-only file system")
    with monkeypatch.context() as patch:
        patch.setattr(loss_ledger, "write_atomically", fail)
        with pytest.raises(StorageError, match="losses.json"):
            ledger.save()
        with pytest.raises(StorageError):
            ledger.acknowledge(now_ms=3)
    assert ledger.unacknowledged() != []
    ledger.save()  # retried later: the record was kept
    assert json.loads((tmp_path / LEDGER_FILE).read_text())["records"][0]["events"] == 7


def test_undelivered_finds_the_offsets_a_read_did_not_return() -> None:
    assert undelivered([(0, 5), (8, 10)], [0, 1, 3, 8, 9]) == [(2, 3), (4, 5)]
    assert undelivered([(0, 3)], []) == [(0, 3)]
    assert undelivered([(0, 3)], [0, 1, 2]) == []
    assert covers([(0, 3), (5, 6)], 5) and not covers([(0, 3), (5, 6)], 3)
    assert not covers([], 0)


def test_deliverable_keeps_held_events_and_names_what_a_read_missed() -> None:
    events = [Event(0, o, 0, None, {}, b"") for o in (0, 1, 2, 4)]
    kept, missed = deliverable([(0, 0, 5)], {0: [(0, 2), (4, 5)]}, events, [Path("/d/ch-0")])
    assert [e.offset for e in kept] == [0, 1, 4]  # 2 left the take (lost): not returned
    assert missed == []
    kept, missed = deliverable([(0, 0, 5)], {0: [(0, 5)]}, events, [Path("/d/ch-0")])
    assert [e.offset for e in kept] == [0, 1, 2, 4]
    [(partition, lost)] = missed
    assert (partition, lost.start, lost.end, lost.path) == (0, 3, 4, "/d/ch-0")
    assert lost.cause.startswith("unreadable")

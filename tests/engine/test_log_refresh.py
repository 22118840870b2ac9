"""A read-only PartitionLog follows a writer (another process's view) through refresh()."""
from __future__ import annotations

from pathlib import Path

from channel_engine import LogConfig, PartitionLog, PendingEvent
from channel_engine.log.record_batch import build, set_base_offset

CONFIG = LogConfig(segment_bytes=1024, file_delete_delay_ms=0)


def batch(tag: str, n: int = 3) -> list[PendingEvent]:
    return [PendingEvent(f"{tag}-{i}".encode() * 8, timestamp=1_000) for i in range(n)]


def bodies(log: PartitionLog) -> list[bytes]:
    return [e.body for e in log.iter_events(log.log_start_offset)]


def test_a_reader_sees_appends_rolls_and_retention_after_refresh(tmp_path: Path) -> None:
    writer = PartitionLog.open(tmp_path, CONFIG)
    writer.append(batch("a"))
    reader = PartitionLog.open(tmp_path, CONFIG, read_only=True)
    assert len(bodies(reader)) == 3
    for i in range(12):  # several rolls, and more bytes into the segment the reader knew
        writer.append(batch(f"b{i}"))
    assert len(writer.segments) > 2 and len(bodies(reader)) == 3
    reader.refresh()
    assert bodies(reader) == bodies(writer) and reader.log_end_offset == writer.log_end_offset
    assert [s.base_offset for s in reader.segments] == [s.base_offset for s in writer.segments]

    following = reader.iter_events(0)
    first = next(following)
    writer.delete_records_before(writer.segments[2].base_offset)
    reader.refresh()
    assert reader.log_start_offset == writer.log_start_offset
    assert bodies(reader) == bodies(writer)
    assert [first.body] + [e.body for e in following][: 5] == \
        [e.body for e in batch("a")] + [e.body for e in batch("b0")]  # still reads what it held
    reader.close()
    writer.close()


def test_a_batch_still_being_written_stays_invisible(tmp_path: Path) -> None:
    writer = PartitionLog.open(tmp_path, LogConfig())
    writer.append(batch("a"))
    writer.close()
    reader = PartitionLog.open(tmp_path, LogConfig(), read_only=True)
    raw = build(batch("b"))
    set_base_offset(raw, 3)
    log_file = tmp_path / "00000000000000000000.log"
    with open(log_file, "ab") as f:  # a writer in another process, half way through
        f.write(raw[:40])
    reader.refresh()
    assert reader.log_end_offset == 3 and len(bodies(reader)) == 3
    with open(log_file, "ab") as f:
        f.write(raw[40:])
    reader.refresh()
    assert reader.log_end_offset == 6 and bodies(reader)[3:] == [e.body for e in batch("b")]
    reader.close()


def test_a_preallocated_zero_tail_is_not_read(tmp_path: Path) -> None:
    config = LogConfig(preallocate=True, segment_bytes=1 << 16)
    writer = PartitionLog.open(tmp_path, config)
    writer.append(batch("a"))
    reader = PartitionLog.open(tmp_path, config, read_only=True)
    writer.append(batch("b"))
    reader.refresh()
    assert reader.log_end_offset == 6 and bodies(reader) == bodies(writer)
    reader.close()
    writer.close()


def test_refresh_changes_nothing_for_the_writer(tmp_path: Path) -> None:
    with PartitionLog.open(tmp_path, CONFIG) as writer:
        writer.append(batch("a"))
        writer.refresh()
        assert writer.log_end_offset == 3

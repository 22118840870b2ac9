"""PartitionLog: appends, reads, rolls, durability, group commit, locking, retention, truncation."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from channel_engine.errors import (
    BatchTooLargeError,
    InvalidEventError,
    LogLockedError,
    OffsetOutOfRangeError,
    ReadOnlyLogError,
)
from channel_engine.event import Event, PendingEvent
from channel_engine.log import state as log_state
from channel_engine.log.config import LogConfig
from channel_engine.log.partition_log import PartitionLog

pytestmark = pytest.mark.usefixtures("each_codec")  # conftest.py: both codecs

T0 = 1_700_000_000_000  # ms: event timestamps around here, and the clock too


class Clock:
    """An injectable clock (seconds, like time.time) that only moves when told."""

    def __init__(self, ms: int = T0) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000

    def advance(self, ms: int) -> None:
        self.ms += ms


def event(n: int, timestamp: int | None = None, size: int = 20) -> PendingEvent:
    key = None if n % 3 == 0 else b"k%d" % n
    headers = {"n": b"%d" % n} if n % 2 else None
    body = (b"%06d" % n) * (size // 6 + 1)
    return PendingEvent(body[:size], key, headers, T0 + n if timestamp is None else timestamp)


def as_event(offset: int, e: PendingEvent) -> Event:
    return Event(0, offset, e.timestamp, e.key, dict(e.headers or {}), e.body)


def append(log: PartitionLog, batches: list[list[PendingEvent]], expected: list) -> list:
    results = []
    for batch in batches:
        result = log.append(batch)
        assert result.first_offset == len(expected)
        expected += [as_event(result.first_offset + i, e) for i, e in enumerate(batch)]
        results.append(result)
    return results


def batches(count: int, start: int = 0, per_batch=lambda i: i % 3 + 1, **kw) -> list:
    out, n = [], start
    for i in range(count):
        size = per_batch(i)
        out.append([event(n + j, **kw) for j in range(size)])
        n += size
    return out


def state(log: PartitionLog):
    return (log.log_start_offset, log.log_end_offset, log.high_watermark,
            [s.base_offset for s in log.segments], list(log.iter_events(log.log_start_offset)))


def files(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".lock"}


def reopened_state(directory, config, clock=None) -> tuple:
    with PartitionLog.open(directory, config, clock=clock or time.time) as log:
        return state(log)


@pytest.fixture
def fsyncs(monkeypatch):
    """Count os.fdatasync calls (the segment data flushes)."""
    calls = []
    real = os.fdatasync

    def counting(fd):
        calls.append(fd)
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    return calls


SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=128)


# -- append and read ----------------------------------------------------------------------


def test_it_assigns_contiguous_offsets_and_reads_every_event_back(tmp_path):
    expected: list = []
    with PartitionLog.open(tmp_path) as log:
        results = append(log, batches(10), expected)
        assert [(r.first_offset, r.last_offset) for r in results][:3] == [(0, 0), (1, 2), (3, 5)]
        assert log.log_end_offset == len(expected) == 19
        assert log.read(0) == expected
        assert list(log.iter_events(0)) == expected
        position = 0
        for r in results:
            assert r.position == position and r.segment_base_offset == 0
            position += r.size
        assert log.size_bytes == position


def test_it_stamps_events_without_a_timestamp(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        before = int(time.time() * 1000)
        log.append([PendingEvent(b"now")])
        assert before <= log.read(0)[0].timestamp <= int(time.time() * 1000)


def test_it_rolls_segments_at_segment_bytes(tmp_path):
    expected: list = []
    with PartitionLog.open(tmp_path, SMALL) as log:
        results = append(log, batches(40), expected)
        segments = log.segments
        assert len(segments) >= 4
        for seg, nxt in zip(segments, segments[1:], strict=False):
            assert seg.next_offset == nxt.base_offset
        for seg in segments:
            assert 0 < seg.size <= SMALL.segment_bytes
        for seg in segments[:-1]:  # rolled: trimmed to their batches
            assert seg.log_path.stat().st_size == seg.size
        # the active one keeps zeros ahead (fsync durability), never past segment_bytes
        active = segments[-1]
        assert active.size < active.log_path.stat().st_size == active.file_size \
            <= SMALL.segment_bytes
        with open(active.log_path, "rb") as f:
            assert not f.read()[active.size:].strip(b"\0")
        assert sorted({r.segment_base_offset for r in results}) == [s.base_offset for s in
                                                                     segments]
        assert list(log.iter_events(0)) == expected
        before = state(log)
    assert reopened_state(tmp_path, SMALL) == before


def test_it_rolls_when_a_batch_is_more_than_segment_ms_newer_than_the_first(tmp_path):
    config = LogConfig(segment_ms=1_000)
    with PartitionLog.open(tmp_path, config) as log:
        bases = [log.append([event(i, timestamp=T0 + ts)]).segment_base_offset
                 for i, ts in enumerate([0, 500, 1_000, 1_001, 900, 2_001, 2_002])]
        assert bases == [0, 0, 0, 3, 3, 3, 6]
        log.roll()
        assert [s.base_offset for s in log.segments] == [0, 3, 6, 7]
        log.roll()  # the active segment is empty: no new one
        assert len(log.segments) == 4


def test_it_rolls_by_segment_ms_after_a_reopen(tmp_path):
    config = LogConfig(segment_ms=1_000)
    with PartitionLog.open(tmp_path, config) as log:
        log.append([event(0, timestamp=T0)])
    with PartitionLog.open(tmp_path, config) as log:
        assert log.append([event(1, timestamp=T0 + 1_000)]).segment_base_offset == 0
        assert log.append([event(2, timestamp=T0 + 1_001)]).segment_base_offset == 2


def test_it_adds_an_index_entry_after_every_index_interval_bytes(tmp_path):
    config = LogConfig(segment_bytes=4096, index_interval_bytes=300)
    with PartitionLog.open(tmp_path, config) as log:
        results = append(log, batches(60, per_batch=lambda i: i % 4 + 1), [])
        expected: dict[int, list] = {}
        since: dict[int, int] = {}
        for r in results:
            base = r.segment_base_offset
            if since.setdefault(base, 0) > config.index_interval_bytes:
                expected.setdefault(base, []).append((r.last_offset, r.position))
                since[base] = 0
            since[base] += r.size
        assert len(log.segments) >= 2
        for seg in log.segments:
            entries = [seg.offset_index.entry(i) for i in range(len(seg.offset_index))]
            assert entries == expected.get(seg.base_offset, [])
        assert len(log.segments[0].offset_index) >= 3


def test_it_indexes_every_batch_but_the_first_with_a_zero_interval(tmp_path):
    with PartitionLog.open(tmp_path, LogConfig(index_interval_bytes=0)) as log:
        append(log, batches(25), [])
        assert len(log.segments[0].offset_index) == 24


def test_it_rolls_before_an_index_runs_out_of_room(tmp_path):
    config = LogConfig(segment_index_bytes=48, index_interval_bytes=0)  # 4 time entries
    expected: list = []
    with PartitionLog.open(tmp_path, config) as log:
        append(log, [[event(i)] for i in range(12)], expected)
        assert len(log.segments) >= 3
        for seg in log.segments:
            assert len(seg.time_index) <= seg.time_index.max_entries - 1
        before = state(log)
    with PartitionLog.open(tmp_path, config) as log:
        assert state(log) == before
        assert log.last_recovery.actions == []
        assert list(log.iter_events(0)) == expected


def test_it_rebuilds_an_index_made_for_a_larger_segment_index_bytes_without_failing(tmp_path):
    # the sparse rule stops adding entries to a full index instead of refusing the batch
    expected: list = []
    with PartitionLog.open(tmp_path, LogConfig(index_interval_bytes=0)) as log:
        append(log, [[event(i)] for i in range(40)], expected)
        log.close(clean=False)
    small = LogConfig(index_interval_bytes=0, segment_index_bytes=48)
    with PartitionLog.open(tmp_path, small) as log:
        segment = log.segments[-1]
        assert len(segment.offset_index) <= segment.offset_index.max_entries - 1
        assert list(log.iter_events(0)) == expected
        assert log.append([event(99)]).segment_base_offset == 40  # full: rolls first


def test_it_restores_the_active_segments_final_time_entry_after_recovery(tmp_path):
    # Kafka's LogSegment.recover appends the largest timestamp to the time index: without
    # it a crash cost the active segment its final entry until the next roll
    with PartitionLog.open(tmp_path, LogConfig(index_interval_bytes=10**6)) as log:
        append(log, [[event(i, timestamp=T0 + 5 - i)] for i in range(4)], [])
        log.close(clean=False)
    with PartitionLog.open(tmp_path, LogConfig(index_interval_bytes=10**6)) as log:
        assert not log.last_recovery.clean_shutdown
        active = log.segments[-1]
        assert active.time_index.last_entry() == (T0 + 5, 0)
        assert (active.max_timestamp, active.offset_of_max_timestamp) == (T0 + 5, 0)
    with PartitionLog.open(tmp_path, LogConfig(index_interval_bytes=10**6)) as log:
        assert log.last_recovery.actions == []


def test_it_reads_the_right_event_from_every_offset(tmp_path):
    expected: list = []
    config = SMALL.replace(index_interval_bytes=64)
    with PartitionLog.open(tmp_path, config) as log:
        append(log, batches(30), expected)
        for offset in range(len(expected)):
            assert log.read(offset, max_events=1) == [expected[offset]]
            assert log.read(offset) == expected[offset:offset + len(log.read(offset))]
            assert list(log.iter_events(offset)) == expected[offset:]


def test_it_reads_at_most_max_events(tmp_path):
    expected: list = []
    with PartitionLog.open(tmp_path, SMALL) as log:
        append(log, batches(30), expected)
        for start in (0, 1, 7, 30):
            for n in (1, 2, 5, 13):
                assert log.read(start, max_events=n) == expected[start:start + n]


def test_it_stops_at_end_offset(tmp_path):
    expected: list = []
    with PartitionLog.open(tmp_path, SMALL) as log:
        append(log, batches(30), expected)
        end = len(expected)
        for start, stop in [(0, 1), (0, 10), (3, 4), (5, 33), (12, end), (20, 10**9)]:
            assert log.read(start, end_offset=stop) == expected[start:stop]
            assert list(log.iter_events(start, stop)) == expected[start:stop]


def test_it_reads_a_whole_batch_however_small_max_bytes_is(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        log.append([event(i) for i in range(5)])
        log.append([event(5)])
        assert [e.offset for e in log.read(0, max_bytes=1)] == [0, 1, 2, 3, 4]
        assert [e.offset for e in log.read(2, max_bytes=1)] == [2, 3, 4]


def test_it_never_skips_events_when_max_bytes_ends_a_read(tmp_path):
    """A read cut short by max_bytes must return a contiguous run from start_offset, also when
    the cut falls at the end of a segment that is not the last one."""
    with PartitionLog.open(tmp_path, LogConfig(segment_bytes=300)) as log:
        expected: list = []
        append(log, [[event(i, size=20)] for i in range(12)], expected)
        assert len(log.segments) >= 4
        sizes = sorted({h.size for _, h, _ in log.read_batches(0)})
        for max_bytes in (1, sizes[0] + 1, 2 * sizes[-1] - 1, 2 * sizes[-1], 250, 400, 10**6):
            for start in range(len(expected)):
                got = log.read(start, max_bytes=max_bytes)
                assert got, (start, max_bytes)
                assert got == expected[start:start + len(got)], (start, max_bytes)


def test_it_returns_no_more_than_max_bytes_beyond_the_first_batch(tmp_path):
    with PartitionLog.open(tmp_path, LogConfig(segment_bytes=300)) as log:
        append(log, [[event(i, size=20)] for i in range(12)], [])
        for max_bytes in (100, 150, 200, 250, 400):
            for start in range(log.log_end_offset):
                sizes = [h.size for _, h, _ in log.read_batches(start, max_bytes=max_bytes)]
                assert len(sizes) == 1 or sum(sizes) <= max_bytes, (start, max_bytes, sizes)


def test_it_reads_nothing_at_the_high_watermark_and_refuses_offsets_outside_the_log(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        append(log, batches(3), [])
        end = log.log_end_offset
        assert log.read(end) == []
        assert list(log.iter_events(end)) == []
        with pytest.raises(OffsetOutOfRangeError) as info:
            log.read(end + 1)
        assert (info.value.offset, info.value.log_end_offset) == (end + 1, end)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(-1)


# -- offsets_for_time ---------------------------------------------------------------------


def earliest(expected: list, timestamp: int, start: int = 0):
    return next((e.offset for e in expected if e.offset >= start and e.timestamp >= timestamp),
                None)


def jumbled(count: int) -> list:
    """Batches whose timestamps go up and down, inside and across batches."""
    out, n = [], 0
    for i in range(count):
        batch = []
        for _ in range(i % 3 + 1):
            batch.append(event(n, timestamp=T0 + (n * 7919) % 101 * 10 + n))
            n += 1
        out.append(batch)
    return out


def test_it_finds_the_earliest_offset_at_or_after_a_time(tmp_path):
    config = LogConfig(segment_bytes=1024, index_interval_bytes=100)
    expected: list = []
    with PartitionLog.open(tmp_path, config) as log:
        append(log, jumbled(40), expected)
        assert len(log.segments) >= 4
        stamps = sorted({e.timestamp for e in expected})
        probes = {T0 - 1, stamps[-1] + 1} | set(stamps) | {t + 1 for t in stamps}
        for t in sorted(probes):
            assert log.offsets_for_time(t) == earliest(expected, t), t
    with PartitionLog.open(tmp_path, config) as log:  # indexes loaded from the files
        for t in sorted(probes):
            assert log.offsets_for_time(t) == earliest(expected, t), t


def test_it_finds_every_offset_by_its_own_timestamp(tmp_path):
    config = LogConfig(segment_bytes=1024, index_interval_bytes=0)  # every batch indexed
    with PartitionLog.open(tmp_path, config) as log:
        for i in range(30):
            log.append([event(i, timestamp=T0 + 10 * i)])
        assert len(log.segments) >= 2
        for i in range(30):
            assert log.offsets_for_time(T0 + 10 * i) == i
            assert log.offsets_for_time(T0 + 10 * i - 9) == i


def test_it_answers_none_past_the_largest_timestamp(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        assert log.offsets_for_time(0) is None
        log.append([event(0, timestamp=T0), event(1, timestamp=T0 + 5)])
        assert log.offsets_for_time(0) == 0
        assert log.offsets_for_time(T0 + 5) == 1
        assert log.offsets_for_time(T0 + 6) is None


def test_it_finds_an_early_offset_with_a_late_timestamp_before_a_later_segment(tmp_path):
    with PartitionLog.open(tmp_path, LogConfig(segment_bytes=300)) as log:
        log.append([event(0, timestamp=T0 + 9_000)])
        for i in range(1, 8):
            log.append([event(i, timestamp=T0 + i)])
        assert len(log.segments) >= 3
        assert log.offsets_for_time(T0 + 5) == 0
        assert log.offsets_for_time(T0 + 9_000) == 0
        assert log.offsets_for_time(T0 + 9_001) is None


# -- refused appends leave the log unchanged ------------------------------------------------


def test_it_refuses_a_batch_over_max_batch_bytes_leaving_the_log_unchanged(tmp_path):
    config = LogConfig(max_batch_bytes=500)
    with PartitionLog.open(tmp_path, config) as log:
        expected: list = []
        append(log, batches(3), expected)
        before, on_disk = state(log), files(tmp_path)
        with pytest.raises(BatchTooLargeError) as info:
            log.append([event(100, size=300), event(101, size=300)])
        assert (info.value.setting, info.value.limit) == ("max_batch_bytes", 500)
        assert info.value.size > 500
        assert state(log) == before and files(tmp_path) == on_disk
        assert log.append([event(102)]).first_offset == before[1]


def test_it_refuses_a_batch_over_segment_bytes_leaving_the_log_unchanged(tmp_path):
    config = LogConfig(segment_bytes=400)
    with PartitionLog.open(tmp_path, config) as log:
        append(log, batches(2), [])
        before, on_disk = state(log), files(tmp_path)
        with pytest.raises(BatchTooLargeError) as info:
            log.append([event(100, size=500)])
        assert info.value.setting == "segment_bytes"
        assert state(log) == before and files(tmp_path) == on_disk


def test_it_refuses_invalid_events_leaving_the_log_unchanged(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        append(log, batches(2), [])
        before, on_disk = state(log), files(tmp_path)
        with pytest.raises(InvalidEventError) as info:
            log.append([event(10), PendingEvent("not bytes")])
        assert (info.value.index, info.value.field) == (1, "body")
        with pytest.raises(InvalidEventError):
            log.append([])
        assert state(log) == before and files(tmp_path) == on_disk


def test_it_refuses_appends_when_closed_or_read_only(tmp_path):
    log = PartitionLog.open(tmp_path)
    log.append([event(0)])
    log.close()
    with pytest.raises(ReadOnlyLogError):
        log.append([event(1)])
    with PartitionLog.open(tmp_path, read_only=True) as reader:
        with pytest.raises(ReadOnlyLogError):
            reader.append([event(1)])
        assert len(reader.read(0)) == 1


# -- durability -----------------------------------------------------------------------------


def test_it_makes_each_append_durable_before_returning_in_fsync_mode(tmp_path, fsyncs):
    with PartitionLog.open(tmp_path) as log:
        for i in range(5):
            calls = len(fsyncs)
            result = log.append([event(i)])
            assert len(fsyncs) > calls
            assert log.recovery_point == log.high_watermark == result.last_offset + 1
            assert log.unflushed_events == 0


def test_it_reports_unflushed_events_in_policy_mode_until_a_flush(tmp_path, fsyncs):
    config = LogConfig(durability="policy", flush_ms=1_000)
    with PartitionLog.open(tmp_path, config, clock=Clock()) as log:
        calls = len(fsyncs)
        append(log, batches(4), [])
        assert len(fsyncs) == calls
        assert log.high_watermark == log.log_end_offset == 7
        assert log.unflushed_events == 7
        assert len(log.read(0)) == 7  # policy mode: readers see the log end
        log.flush()
        assert len(fsyncs) > calls
        assert log.unflushed_events == 0 and log.recovery_point == 7


def test_it_flushes_when_flush_ms_passed_on_flush_if_due(tmp_path, fsyncs):
    clock = Clock()
    config = LogConfig(durability="policy", flush_ms=1_000)
    with PartitionLog.open(tmp_path, config, clock=clock) as log:
        assert log.flush_if_due() is False  # nothing to flush
        log.append([event(0), event(1)])
        clock.advance(999)
        calls = len(fsyncs)
        assert log.flush_if_due() is False
        assert log.unflushed_events == 2 and len(fsyncs) == calls
        clock.advance(1)
        assert log.flush_if_due() is True
        assert log.unflushed_events == 0 and len(fsyncs) > calls
        log.append([event(2)])
        clock.advance(500)
        assert log.flush_if_due() is False  # the timer restarted at the last flush
        clock.advance(500)
        assert log.flush_if_due() is True


def test_it_flushes_inside_append_once_flush_messages_are_unflushed(tmp_path, fsyncs):
    config = LogConfig(durability="policy", flush_messages=3)
    with PartitionLog.open(tmp_path, config) as log:
        calls = len(fsyncs)
        log.append([event(0)])
        log.append([event(1)])
        assert log.unflushed_events == 2 and len(fsyncs) == calls
        log.append([event(2)])
        assert log.unflushed_events == 0 and len(fsyncs) > calls
        calls = len(fsyncs)
        log.append([event(i) for i in range(3, 8)])  # one batch past the threshold
        assert log.unflushed_events == 0 and len(fsyncs) > calls


@pytest.fixture
def synced(monkeypatch):
    """Names of the files (and directories) fsynced or fdatasynced, in order."""
    names: list[str] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def recording(fd, real=real):
            names.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) or "/")
            return real(fd)

        monkeypatch.setattr(os, name, recording)
    return names


def test_it_flushes_the_sealed_segment_on_a_roll_in_policy_mode(tmp_path, synced):
    # Kafka flushes up to the new segment's base on roll; before, a sealed segment stayed
    # unflushed until the next flush_ms or flush_messages, the loss window growing with it
    config = LogConfig(durability="policy", flush_ms=10**9, segment_bytes=400)
    with PartitionLog.open(tmp_path, config, clock=Clock()) as log:
        append(log, [[event(i)] for i in range(3)], [])
        assert log.unflushed_events == 3 and len(log.segments) == 1
        del synced[:]
        while len(log.segments) == 1:
            log.append([event(9)])
        sealed, active = log.segments
        assert f"{sealed.base_offset:020d}.log" in synced
        assert sealed.durable_size == sealed.size and not sealed.dirty
        assert log.recovery_point == active.base_offset  # everything sealed is on disk
        assert log.unflushed_events == 1


def test_it_syncs_the_new_segments_files_on_a_flush_right_after_a_roll(tmp_path, synced):
    config = LogConfig(durability="policy", flush_ms=10**9)
    with PartitionLog.open(tmp_path, config, clock=Clock()) as log:
        append(log, batches(3), [])
        log.flush()
        log.roll()
        del synced[:]
        assert log.unflushed_events == 0  # nothing to flush but the new files
        log.flush()
        new = f"{log.log_end_offset:020d}"
        assert {f"{new}.log", f"{new}.index", f"{new}.timeindex", tmp_path.name} <= set(synced)
        del synced[:]
        log.flush()
        assert synced == []  # done once


def test_it_syncs_the_new_segments_files_on_a_flush_if_due_after_a_roll(tmp_path, synced):
    clock = Clock()
    config = LogConfig(durability="policy", flush_ms=1_000)
    with PartitionLog.open(tmp_path, config, clock=clock) as log:
        append(log, batches(3), [])
        log.flush()
        log.roll()
        clock.advance(1_000)
        del synced[:]
        assert log.flush_if_due() is True
        assert tmp_path.name in synced


def test_it_syncs_the_new_segments_index_files_with_the_first_commit_in_fsync_mode(
        tmp_path, synced):
    with PartitionLog.open(tmp_path, LogConfig(segment_bytes=300)) as log:
        while len(log.segments) == 1:
            log.append([event(1)])
        new = f"{log.segments[-1].base_offset:020d}"
        assert {f"{new}.log", f"{new}.index", f"{new}.timeindex", tmp_path.name} <= set(synced)


def test_it_persists_the_recovery_point_on_checkpoint_and_on_close(tmp_path):
    config = LogConfig(durability="policy", flush_ms=1_000)
    path = tmp_path / "log.state"
    log = PartitionLog.open(tmp_path, config, clock=Clock())
    assert log_state.read(path).clean_shutdown is False
    append(log, batches(3), [])
    log.flush()
    log.append([event(50)])
    assert log_state.read(path).recovery_point == 0
    log.checkpoint_recovery_point()
    persisted = log_state.read(path)
    assert (persisted.recovery_point, persisted.clean_shutdown) == (6, False)
    log.close()
    persisted = log_state.read(path)
    assert (persisted.recovery_point, persisted.log_end_offset) == (7, 7)
    assert persisted.clean_shutdown is True


def test_it_persists_the_recovery_point_when_its_interval_passed(tmp_path):
    clock = Clock()
    config = LogConfig(durability="policy", flush_ms=1_000, recovery_point_checkpoint_ms=5_000)
    path = tmp_path / "log.state"
    with PartitionLog.open(tmp_path, config, clock=clock) as log:
        log.append([event(0), event(1)])
        clock.advance(1_000)
        assert log.flush_if_due() is True
        assert log_state.read(path).recovery_point == 0
        clock.advance(4_000)
        log.flush_if_due()
        assert log_state.read(path).recovery_point == 2


def test_it_opens_with_everything_recovered_after_a_clean_close(tmp_path):
    expected: list = []
    with PartitionLog.open(tmp_path, SMALL) as log:
        append(log, batches(30), expected)
    with PartitionLog.open(tmp_path, SMALL) as log:
        assert log.last_recovery.clean_shutdown is True
        assert log.last_recovery.actions == []
        assert log.recovery_point == log.log_end_offset == len(expected)
        assert list(log.iter_events(0)) == expected


# -- group commit -----------------------------------------------------------------------------


def test_it_group_commits_concurrent_appends_in_fsync_mode(tmp_path, monkeypatch):
    fsyncs = []
    real = os.fdatasync

    def slow_fdatasync(fd):  # a disk that takes a moment, so appenders pile up behind it
        fsyncs.append(fd)
        time.sleep(0.002)
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    threads, per_thread = 8, 25
    start = threading.Barrier(threads)

    with PartitionLog.open(tmp_path, LogConfig(segment_bytes=8192)) as log:
        fsyncs.clear()

        def producer(t):
            start.wait()
            out = []
            for i in range(per_thread):
                batch = [PendingEvent(b"t%d-%d-%d" % (t, i, j), timestamp=T0)
                         for j in range(i % 3 + 1)]
                result = log.append(batch)
                assert log.recovery_point > result.last_offset  # durable on return
                out.append((result, batch))
            return out

        with ThreadPoolExecutor(threads) as pool:
            per_producer = list(pool.map(producer, range(threads)))

        appended = [item for out in per_producer for item in out]
        ranges = sorted((r.first_offset, r.last_offset) for r, _ in appended)
        total = sum(len(batch) for _, batch in appended)
        assert ranges[0][0] == 0 and ranges[-1][1] == total - 1
        for (_, last), (first, _) in zip(ranges, ranges[1:], strict=False):
            assert first == last + 1
        by_offset = {e.offset: e.body for e in log.iter_events(0)}
        assert len(by_offset) == total == log.log_end_offset
        for out in per_producer:
            for result, batch in out:
                bodies = [by_offset[o] for o in range(result.first_offset, result.last_offset + 1)]
                assert bodies == [e.body for e in batch]
        assert len(log.segments) > 1
        assert 0 < len(fsyncs) < threads * per_thread // 2  # one fsync served many appends


# -- one writer per directory -----------------------------------------------------------------


def test_it_refuses_a_second_writer_but_lets_a_reader_open(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        append(log, batches(3), [])
        log.checkpoint_recovery_point()
        with pytest.raises(LogLockedError) as info:
            PartitionLog.open(tmp_path)
        assert info.value.directory == str(tmp_path)
        with PartitionLog.open(tmp_path, read_only=True) as reader:
            assert [e.offset for e in reader.read(0)] == list(range(6))
    with PartitionLog.open(tmp_path) as log:  # the lock went with the first writer
        assert log.log_end_offset == 6


def test_it_shows_a_read_only_opener_every_event_committed_in_fsync_mode(tmp_path):
    """A put commit returned in fsync mode: the events are on disk and committed, so a
    reader process opening the directory must see them (without waiting for a checkpoint)."""
    with PartitionLog.open(tmp_path) as log:
        append(log, batches(3), [])
        assert log.high_watermark == 6
        with PartitionLog.open(tmp_path, read_only=True) as reader:
            assert reader.high_watermark == 6
            assert len(reader.read(0)) == 6


def test_it_refuses_to_open_a_missing_directory_read_only(tmp_path):
    with pytest.raises(FileNotFoundError):
        PartitionLog.open(tmp_path / "nope", read_only=True)
    assert not (tmp_path / "nope").exists()


# -- retention --------------------------------------------------------------------------------


AGED_BATCH = 88  # bytes of a batch of one event with a 20-byte body, no key, no headers


def aged_log(directory, clock, **settings):
    """Six segments of 3 single-event batches; segment i's events are stamped T0 + i*1000."""
    config = LogConfig(segment_bytes=300, **settings)
    log = PartitionLog.open(directory, config, clock=clock)
    expected: list = []
    for i in range(18):
        append(log, [[PendingEvent(b"%020d" % i, timestamp=T0 + (i // 3) * 1_000)]], expected)
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9, 12, 15]
    assert {s.size for s in log.segments} == {3 * AGED_BATCH}
    return log, config, expected


def test_it_deletes_segments_older_than_retention_ms(tmp_path):
    clock = Clock(T0 + 2_500)
    log, config, expected = aged_log(tmp_path, clock, retention_ms=1_000)
    result = log.apply_retention()  # segments stamped T0 and T0+1000 are more than 1 s old
    assert result.deleted_base_offsets == [0, 3]
    assert all("retention_ms" in why for why in result.reasons)
    assert (result.events_deleted, result.log_start_offset) == (6, 6)
    assert result.bytes_deleted > 0
    assert log.log_start_offset == 6
    assert log_state.read(tmp_path / "log.state").log_start_offset == 6  # persisted first
    assert list(log.iter_events(6)) == expected[6:]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(5)
    assert log.offsets_for_time(0) == 6
    before = state(log)
    log.close()
    assert reopened_state(tmp_path, config, clock) == before


def test_it_keeps_a_segment_exactly_retention_ms_old(tmp_path):
    clock = Clock(T0 + 1_000)
    log, config, _ = aged_log(tmp_path, clock, retention_ms=1_000)
    assert log.apply_retention().deleted_base_offsets == []  # T0 is exactly 1000 ms old
    clock.advance(1)
    assert log.apply_retention().deleted_base_offsets == [0]
    log.close()


@pytest.mark.parametrize("durability", ["fsync", "policy"])
def test_it_rolls_and_deletes_an_expired_active_segment_keeping_the_log_end(
        tmp_path, durability):
    # Kafka rolls an active segment whose every event is past retention.ms, so an idle
    # log does not keep expired events readable forever
    clock = Clock(T0 + 10**9)
    policy = {"flush_messages": 1} if durability == "policy" else {}
    log, config, expected = aged_log(tmp_path, clock, retention_ms=1, durability=durability,
                                     **policy)
    result = log.apply_retention()
    assert result.deleted_base_offsets == [0, 3, 6, 9, 12, 15]
    assert "active segment" in result.reasons[-1]
    assert (result.events_deleted, result.log_start_offset) == (18, 18)
    assert [s.base_offset for s in log.segments] == [18]
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (18, 18, 18)
    assert log.read(18) == [] and log.offsets_for_time(0) is None
    log.close()
    with PartitionLog.open(tmp_path, config, clock=clock) as log:
        assert (log.log_start_offset, log.log_end_offset) == (18, 18)
        assert list(log.iter_events(18)) == []
        assert log.append([event(99)]).first_offset == 18  # no offset is handed out twice


def test_it_keeps_the_active_segment_while_one_of_its_events_is_within_retention(tmp_path):
    clock = Clock(T0 + 5_000 + 1_000)  # the active segment's events: exactly 1000 ms old
    log, config, expected = aged_log(tmp_path, clock, retention_ms=1_000)
    assert log.apply_retention().deleted_base_offsets == [0, 3, 6, 9, 12]
    assert [s.base_offset for s in log.segments] == [15]
    assert list(log.iter_events(log.log_start_offset)) == expected[15:]
    clock.advance(1)
    assert log.apply_retention().deleted_base_offsets == [15]
    assert (log.log_start_offset, log.log_end_offset) == (18, 18)
    log.close()


def test_it_never_deletes_an_active_segment_that_is_not_all_flushed(tmp_path):
    clock = Clock(T0 + 10**9)
    log, config, expected = aged_log(tmp_path, clock, retention_ms=1)
    assert log.apply_retention(limit_offset=17).deleted_base_offsets == [0, 3, 6, 9, 12]
    assert [s.base_offset for s in log.segments] == [15]
    log.close()


def test_it_never_deletes_an_empty_active_segment(tmp_path):
    clock = Clock(T0 + 10**9)
    log, config, expected = aged_log(tmp_path, clock, retention_ms=1)
    log.apply_retention()
    assert log.apply_retention().deleted_base_offsets == []
    assert [s.base_offset for s in log.segments] == [18]
    log.close()


@pytest.mark.parametrize("retention_bytes, deleted", [
    (9 * AGED_BATCH + 10, [0, 3]),
    (12 * AGED_BATCH, [0, 3]),      # exactly the size left: still deleted
    (12 * AGED_BATCH + 1, [0]),
    (18 * AGED_BATCH, []),
])
def test_it_deletes_the_oldest_segments_while_over_retention_bytes(
        tmp_path, retention_bytes, deleted):
    clock = Clock()
    log, config, expected = aged_log(tmp_path, clock, retention_bytes=retention_bytes)
    result = log.apply_retention()
    # Kafka's rule: delete the oldest segment while the log stays at least retention_bytes
    assert result.deleted_base_offsets == deleted
    kept = sum(s.size for s in log.segments)
    assert kept >= config.retention_bytes > kept - log.segments[0].size
    assert all("retention_bytes" in why for why in result.reasons)
    assert log.apply_retention().deleted_base_offsets == []
    assert list(log.iter_events(log.log_start_offset)) == expected[log.log_start_offset:]
    before = state(log)
    log.close()
    assert reopened_state(tmp_path, config, clock) == before


def test_it_respects_the_limit_offset(tmp_path):
    clock = Clock(T0 + 10**9)
    log, config, _ = aged_log(tmp_path, clock, retention_ms=1)
    assert log.apply_retention(limit_offset=5).deleted_base_offsets == [0]  # [3, 6) ends past 5
    assert log.apply_retention(limit_offset=8).deleted_base_offsets == [3]
    assert log.apply_retention(limit_offset=8).deleted_base_offsets == []
    assert log.apply_retention(limit_offset=9).deleted_base_offsets == [6]
    assert log.log_start_offset == 9
    log.close()


def test_it_renames_deleted_segments_then_unlinks_them_after_the_delay(tmp_path):
    clock = Clock(T0 + 2_500)
    log, config, _ = aged_log(tmp_path, clock, retention_ms=1_000, file_delete_delay_ms=30_000)
    log.apply_retention()
    names = sorted(p.name for p in tmp_path.iterdir())
    deleted = [n for n in names if n.endswith(".deleted")]
    assert deleted == sorted(f"{b:020d}{s}.deleted" for b in (0, 3)
                             for s in (".log", ".index", ".timeindex"))
    assert not any(n.startswith(("00000000000000000000.", "00000000000000000003."))
                   and not n.endswith(".deleted") for n in names)
    clock.advance(29_999)
    assert log.delete_expired_files() == 0
    assert all((tmp_path / n).exists() for n in deleted)
    clock.advance(1)
    assert log.delete_expired_files() == 2
    assert not any(p.name.endswith(".deleted") for p in tmp_path.iterdir())
    log.close()


def test_it_lets_a_reader_finish_after_retention_deleted_its_segments(tmp_path):
    clock = Clock(T0 + 10**9)
    log, config, expected = aged_log(tmp_path, clock, retention_ms=1)
    reader = log.iter_events(0)
    assert next(reader) == expected[0]
    assert log.apply_retention().deleted_base_offsets == [0, 3, 6, 9, 12, 15]
    assert [p for p in tmp_path.iterdir() if p.name.endswith(".log")] == [
        tmp_path / "00000000000000000018.log"]
    assert list(reader) == expected[1:]
    clock.advance(config.file_delete_delay_ms)
    assert log.delete_expired_files() == 6
    log.close()


def test_it_deletes_pending_files_on_close(tmp_path):
    clock = Clock(T0 + 10**9)
    log, config, _ = aged_log(tmp_path, clock, retention_ms=1)
    log.apply_retention()
    assert any(p.name.endswith(".deleted") for p in tmp_path.iterdir())
    log.close()
    assert not any(p.name.endswith(".deleted") for p in tmp_path.iterdir())


def test_it_deletes_leftover_deleted_and_temp_files_on_open(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        append(log, batches(3), [])
        before = state(log)
    strays = ["00000000000000000042.log.deleted", "00000000000000000042.index.deleted",
              "00000000000000000000.index.tmp", "00000000000000000099.index"]
    for name in strays:
        (tmp_path / name).write_bytes(b"left over")
    with PartitionLog.open(tmp_path) as log:
        assert state(log) == before
        deleted = sorted(a.path for a in log.last_recovery.actions
                         if a.kind == "stray_file_deleted")
        assert deleted == sorted(str(tmp_path / name) for name in strays)
    assert not any((tmp_path / name).exists() for name in strays)


def test_it_deletes_records_before_an_offset(tmp_path):
    clock = Clock()
    log, config, expected = aged_log(tmp_path, clock)
    result = log.delete_records_before(7)
    assert result.deleted_base_offsets == [0, 3]
    assert log.log_start_offset == result.log_start_offset == 7
    assert log_state.read(tmp_path / "log.state").log_start_offset == 7  # persisted at once
    assert log.read(7, max_events=1) == [expected[7]]
    assert list(log.iter_events(7)) == expected[7:]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(6)
    assert log.offsets_for_time(0) == 7
    before = state(log)
    log.close()
    assert reopened_state(tmp_path, config, clock) == before


def test_it_refuses_to_delete_records_past_the_high_watermark(tmp_path):
    clock = Clock()
    log, config, _ = aged_log(tmp_path, clock)
    before = state(log)
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(19)
    assert state(log) == before
    log.delete_records_before(18)  # up to the log end is allowed: an empty readable range
    assert log.log_start_offset == 18
    assert log.read(18) == []
    assert [s.base_offset for s in log.segments] == [15]
    log.close()
    assert reopened_state(tmp_path, config, clock)[:2] == (18, 18)


# -- truncation -------------------------------------------------------------------------------


def test_it_truncates_to_a_batch_boundary_and_deletes_later_segments(tmp_path):
    clock = Clock()
    log, config, expected = aged_log(tmp_path, clock)
    assert log.truncate_to(7) == 7
    assert log.log_end_offset == 7
    assert [s.base_offset for s in log.segments] == [0, 3, 6]
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [
        f"{b:020d}.log" for b in (0, 3, 6)]
    assert list(log.iter_events(0)) == expected[:7]
    assert log.offsets_for_time(T0 + 3_000) is None
    assert log.append([event(70)]).first_offset == 7
    expected = expected[:7] + [as_event(7, event(70))]
    before = state(log)
    log.close()
    assert reopened_state(tmp_path, config, clock) == before
    assert before[4] == expected


def test_it_truncates_at_the_start_of_the_batch_holding_the_offset(tmp_path):
    expected: list = []
    with PartitionLog.open(tmp_path, SMALL) as log:
        append(log, [[event(i) for i in range(5)], [event(i) for i in range(5, 9)]], expected)
        assert log.truncate_to(7) == 5
        assert list(log.iter_events(0)) == expected[:5]
        before = state(log)
    assert reopened_state(tmp_path, SMALL) == before


def test_it_truncates_to_a_segment_base_offset(tmp_path):
    clock = Clock()
    log, config, expected = aged_log(tmp_path, clock)
    assert log.truncate_to(9) == 9
    assert [s.base_offset for s in log.segments] == [0, 3, 6]
    assert log.append([event(90, size=20)]).segment_base_offset == 9  # seg 6 is full
    before = state(log)
    log.close()
    assert reopened_state(tmp_path, config, clock) == before


def gapped_log(directory, clock):
    """aged_log with segment 6..8 lost while closed: a gap of offsets 6, 7, 8."""
    log, config, expected = aged_log(directory, clock)
    log.close()
    for suffix in (".log", ".index", ".timeindex"):
        (directory / f"{6:020d}{suffix}").unlink()
    log = PartitionLog.open(directory, config, clock=clock)
    assert [s.base_offset for s in log.segments] == [0, 3, 9, 12, 15]
    return log, config, expected


@pytest.mark.parametrize("target, bases", [(6, [0, 3]), (7, [0, 3, 7]), (8, [0, 3, 8])])
def test_it_never_lowers_the_log_end_below_a_target_inside_a_gap(tmp_path, target, bases):
    # offsets 6..8 were handed out once: truncating into them must not hand them out again
    clock = Clock()
    log, config, expected = gapped_log(tmp_path, clock)
    assert log.truncate_to(target) == target
    assert (log.log_end_offset, [s.base_offset for s in log.segments]) == (target, bases)
    assert list(log.iter_events(0)) == expected[:6]
    assert log.append([event(70)]).first_offset == target
    before = state(log)
    log.close()
    assert reopened_state(tmp_path, config, clock) == before


def test_it_truncates_to_the_base_of_the_segment_after_a_gap(tmp_path):
    clock = Clock()
    log, config, expected = gapped_log(tmp_path, clock)
    assert log.truncate_to(9) == 9
    assert [s.base_offset for s in log.segments] == [0, 3, 9]
    assert log.append([event(70)]).first_offset == 9
    log.close()


def test_it_ignores_a_truncation_at_or_past_the_log_end(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        append(log, batches(3), [])
        on_disk = files(tmp_path)
        assert log.truncate_to(6) == 6
        assert log.truncate_to(100) == 6
        assert files(tmp_path) == on_disk


def test_it_refuses_a_truncation_below_the_log_start(tmp_path):
    clock = Clock()
    log, config, _ = aged_log(tmp_path, clock)
    log.delete_records_before(4)
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_to(3)
    assert log.log_end_offset == 18
    log.close()


# -- preallocation ----------------------------------------------------------------------------


def test_it_preallocates_segments_and_trims_them_on_roll_and_close(tmp_path):
    config = LogConfig(segment_bytes=4096, preallocate=True)
    expected: list = []
    with PartitionLog.open(tmp_path, config) as log:
        assert log.segments[0].log_path.stat().st_size == 4096
        append(log, batches(5), expected)
        assert log.segments[0].log_path.stat().st_size == 4096
        while len(log.segments) < 3:
            append(log, batches(5, start=len(expected)), expected)
        for seg in log.segments[:-1]:
            assert seg.log_path.stat().st_size == seg.size  # trimmed on roll
        assert log.segments[-1].log_path.stat().st_size == 4096
        assert list(log.iter_events(0)) == expected
        active = log.segments[-1].log_path
        before = state(log)
    assert active.stat().st_size < 4096  # trimmed on close
    with PartitionLog.open(tmp_path, config) as log:
        assert state(log) == before
        assert log.last_recovery.actions == []
        append(log, batches(3, start=len(expected)), expected)
        assert list(log.iter_events(0)) == expected
        before = state(log)
    assert reopened_state(tmp_path, config) == before


def test_it_decodes_a_batch_wanted_whole_as_it_decodes_part_of_it(tmp_path):
    log = PartitionLog.open(tmp_path, LogConfig(durability="policy", flush_ms=1000))
    events = [PendingEvent(b"v%d" % i, key=b"k" if i % 2 else None,
                           headers={"h": b"x"} if i % 3 == 0 else None, timestamp=1000 + i)
              for i in range(10)]
    log.append(events[:4])
    log.append(events[4:])
    whole = log.read(0)
    assert [(e.offset, e.timestamp, e.key, e.headers, e.body) for e in whole] == [
        (i, 1000 + i, b"k" if i % 2 else None, {"h": b"x"} if i % 3 == 0 else {}, b"v%d" % i)
        for i in range(10)]
    assert all(type(e) is Event for e in whole)
    assert log.read(2, max_events=5) == whole[2:7]  # part of each batch: the filtering loop
    assert log.read(4, end_offset=10) == whole[4:]
    log.close()


def test_it_delivers_only_the_offsets_of_a_batch_whose_records_are_out_of_order(tmp_path):
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from channel_engine.log import record_batch as rb
    builder = DefaultRecordBatchBuilder(rb.MAGIC, 0, 0, -1, -1, -1, 1 << 20)
    for delta in (0, 5, 2):  # count 3, last delta 2: a valid header, records out of place
        builder.append(delta, 1000, None, b"d%d" % delta, [])
    log = PartitionLog.open(tmp_path, LogConfig(durability="policy", flush_ms=1000))
    log.append_batch(bytearray(builder.build()))
    log.append([PendingEvent(b"next")])
    # offset 5 is not this batch's: never handed out as if it were (offset 3's body is "next")
    assert [(e.offset, e.body) for e in log.read(0, end_offset=3)] == [(0, b"d0")]
    assert [(e.offset, e.body) for e in log.read(3)] == [(3, b"next")]
    log.close()

"""PartitionLog against a list model: a hypothesis state machine.

The model is the list of every event ever appended and not truncated, indexed by
offset, plus the base offsets of the batches and the log start offset. Each step
does one thing to the real log (append, read, offsets_for_time, roll, truncate,
retention, clean reopen, simulated crash and reopen, a read-only view) and the
invariants compare the log with the model after every step.

Settings are drawn per machine so that rolls happen all the time: small
segment_bytes and index sizes, a random codec, preallocation on or off, fsync or
policy durability. A "crash" is a process dying between steps: the descriptors
and the directory lock are dropped without close(), so the clean marker is never
written; the page cache survives, so nothing that was written may be lost.
"""
from __future__ import annotations

import bisect
import shutil
import tempfile
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from channel_engine import (
    BatchTooLargeError,
    Event,
    LogConfig,
    OffsetOutOfRangeError,
    PartitionLog,
    PendingEvent,
)
from channel_engine.log import record_batch
from channel_engine.log.partition_log import DEFAULT_READ_BYTES
from channel_engine.log.recovery import (
    GAP,
    INDEX_REBUILT,
    LOG_END_MISMATCH,
    SEGMENT_DELETED,
    STRAY_FILE_DELETED,
    TRUNCATED,
    ZERO_TAIL_CUT,
)

BASE_TS = 1_600_000_000_000
TS_SPAN = 5_000_000
NOW_MS = BASE_TS + TS_SPAN  # the log's clock starts here (retention_ms is measured by it)
DAY_MS = 24 * 3600 * 1000
CODECS = ["none", "gzip", "lz4", "zstd"]

header_names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
timestamps = st.integers(BASE_TS, BASE_TS + TS_SPAN)
pending_events = st.builds(
    PendingEvent,
    body=st.binary(max_size=40),
    key=st.none() | st.binary(max_size=8),
    headers=st.none() | st.dictionaries(header_names, st.binary(max_size=8), max_size=2),
    # None now and then: the engine stamps "now" (SteppingClock) and the model learns it
    timestamp=st.one_of(timestamps, timestamps, timestamps, st.none()),
)
event_batches = st.lists(pending_events, min_size=1, max_size=20)


class SteppingClock:
    """Stands in for the time module in record_batch, so that the "now" stamped on events
    without a timestamp is the same in every run of an example (hypothesis replays them):
    it starts at the end of the span of explicit timestamps and moves 1 ms per batch
    built, so stamped events keep raising a segment's largest timestamp, as in real life."""

    def __init__(self) -> None:
        self.now_ms = NOW_MS

    def time(self) -> float:
        self.now_ms += 1
        return self.now_ms / 1000


@st.composite
def log_configs(draw: st.DrawFn) -> LogConfig:
    durability = draw(st.sampled_from(["fsync", "fsync", "policy"]))
    flush_messages = flush_ms = None
    if durability == "policy":
        triggers = draw(st.sampled_from(["messages", "ms", "both"]))
        if triggers != "ms":
            flush_messages = draw(st.integers(1, 50))
        if triggers != "messages":
            flush_ms = draw(st.integers(1, 1_000_000))
    return LogConfig(
        durability=durability, flush_messages=flush_messages, flush_ms=flush_ms,
        segment_bytes=draw(st.integers(600, 3000)),
        segment_ms=draw(st.sampled_from([7 * DAY_MS, 1_000_000, 60_000])),
        segment_index_bytes=draw(st.sampled_from([48, 120, 10 * 1024**2])),
        index_interval_bytes=draw(st.integers(0, 400)),
        preallocate=draw(st.booleans()),
        compression=draw(st.sampled_from(CODECS)),
        retention_ms=draw(st.sampled_from([-1, -1, 2_000_000, 4_500_000])),
        retention_bytes=draw(st.sampled_from([-1, 800, 2000, 6000])),
        file_delete_delay_ms=draw(st.sampled_from([0, 60_000])),
    )


class PartitionLogMachine(RuleBasedStateMachine):
    """One partition log and its model."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="weir-props-"))
        self.config = LogConfig()
        self.log: PartitionLog | None = None
        self.events: list[Event] = []  # offset i -> the event at offset i
        self.batch_starts: list[int] = []
        self.log_start = 0
        self.clock_ms = NOW_MS  # the log's clock, moved by the tick rule
        self.stamps = SteppingClock()
        self.real_time = record_batch.time
        record_batch.time = self.stamps

    # -- model helpers ----------------------------------------------------------------------
    @property
    def leo(self) -> int:
        return len(self.events)

    @property
    def plog(self) -> PartitionLog:
        assert self.log is not None
        return self.log

    def visible(self, start: int, end: int | None = None) -> list[Event]:
        stop = self.leo if end is None else min(end, self.leo)
        return self.events[start:stop]

    def batch_start_of(self, offset: int) -> int:
        return self.batch_starts[bisect.bisect_right(self.batch_starts, offset) - 1]

    def open(self) -> None:
        self.log = PartitionLog.open(self.directory, self.config,
                                     clock=lambda: self.clock_ms / 1000)

    # -- rules ------------------------------------------------------------------------------
    @initialize(config=log_configs(), batches=st.lists(event_batches, max_size=12))
    def create(self, config: LogConfig, batches: list[list[PendingEvent]]) -> None:
        self.config = config
        self.open()
        report = self.plog.last_recovery
        assert not report.lost_data, report.summary()
        for events in batches:
            self.append_one(events)

    @rule(batches=st.lists(event_batches, min_size=1, max_size=5))
    def append(self, batches: list[list[PendingEvent]]) -> None:
        for events in batches:
            self.append_one(events)

    @rule(events=event_batches)
    def append_one(self, events: list[PendingEvent]) -> None:
        before_ms = self.stamps.now_ms
        try:
            result = self.plog.append(events)
        except BatchTooLargeError as exc:
            assert exc.size > min(self.config.segment_bytes, self.config.max_batch_bytes)
            return  # refused before anything was written: the invariants check that
        after_ms = self.stamps.now_ms
        base = self.leo
        assert (result.first_offset, result.last_offset) == (base, base + len(events) - 1)
        assert result.size <= self.config.segment_bytes
        assert result.segment_base_offset == self.plog.segments[-1].base_offset
        stamped = self.plog.read(base, len(events)) if any(
            e.timestamp is None for e in events) else []
        for i, event in enumerate(events):
            timestamp = event.timestamp
            if timestamp is None:
                timestamp = stamped[i].timestamp
                assert before_ms - 1 <= timestamp <= after_ms + 1
            self.events.append(Event(0, base + i, timestamp, event.key,
                                     dict(event.headers or {}), event.body))
        self.batch_starts.append(base)
        assert result.max_timestamp == max(e.timestamp for e in self.events[base:])

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        start = data.draw(st.integers(self.log_start, self.leo), label="start")
        max_events = data.draw(st.none() | st.integers(1, 60), label="max_events")
        max_bytes = data.draw(st.just(DEFAULT_READ_BYTES) | st.integers(1, 3000),
                              label="max_bytes")
        end = data.draw(st.none() | st.integers(start, self.leo + 3), label="end_offset")
        got = self.plog.read(start, max_events, max_bytes, end)
        expected = self.visible(start, end)[:max_events]
        if max_bytes == DEFAULT_READ_BYTES:
            assert got == expected
            return
        # a small max_bytes cuts the read at a batch boundary, but never before one batch
        assert got == expected[: len(got)]
        if expected:
            rest_of_first_batch = next(
                (b for b in self.batch_starts if b > start), self.leo) - start
            assert len(got) >= min(len(expected), rest_of_first_batch)

    @rule(max_bytes=st.integers(1, 3000), max_events=st.none() | st.integers(1, 40))
    def consume_in_chunks(self, max_bytes: int, max_events: int | None) -> None:
        """A consumer's loop: read from the log start to the end, each read where the last
        one stopped; together the reads must be the log, each in order and none empty."""
        position, seen = self.log_start, []
        while position < self.leo:
            got = self.plog.read(position, max_events, max_bytes)
            assert got, f"read({position}, max_bytes={max_bytes}) returned nothing"
            assert [e.offset for e in got] == list(range(position, position + len(got)))
            seen += got
            position = got[-1].offset + 1
        assert seen == self.visible(self.log_start)

    @rule(data=st.data())
    def read_out_of_range(self, data: st.DataObject) -> None:
        below = [st.integers(0, self.log_start - 1)] if self.log_start else []
        offset = data.draw(st.one_of(*below, st.integers(self.leo + 1, self.leo + 50)))
        with pytest.raises(OffsetOutOfRangeError):
            self.plog.read(offset)

    @rule(data=st.data())
    def offsets_for_time(self, data: st.DataObject) -> None:
        # near the timestamp at some offset
        known = [e.timestamp for e in self.events] or [BASE_TS]
        near_known = st.tuples(st.integers(0, len(known) - 1), st.integers(-1, 1)).map(
            lambda pick: known[pick[0]] + pick[1])
        target = data.draw(st.one_of(near_known, st.integers(BASE_TS - 10, BASE_TS + TS_SPAN)),
                           label="timestamp")
        expected = next((e.offset for e in self.visible(self.log_start)
                         if e.timestamp >= target), None)
        assert self.plog.offsets_for_time(target) == expected

    @rule()
    def roll(self) -> None:
        active_was_empty = self.plog.segments[-1].size == 0
        count = len(self.plog.segments)
        self.plog.roll()
        assert len(self.plog.segments) == count + (0 if active_was_empty else 1)
        assert self.plog.segments[-1].base_offset == self.leo

    @rule(data=st.data())
    def truncate_to(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log_start, self.leo + 2), label="offset")
        new_end = self.plog.truncate_to(offset)
        if offset < self.leo:
            cut = self.batch_start_of(offset)  # the start of the batch holding `offset`
            del self.events[cut:]
            del self.batch_starts[bisect.bisect_left(self.batch_starts, cut):]
            self.log_start = min(self.log_start, cut)
        assert new_end == self.leo

    @precondition(lambda self: self.log_start > 0)
    @rule(data=st.data())
    def truncate_below_log_start(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(0, self.log_start - 1), label="offset")
        if offset < self.leo:
            with pytest.raises(OffsetOutOfRangeError):
                self.plog.truncate_to(offset)

    @rule(data=st.data())
    def delete_records_before(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log_start, self.leo), label="offset")
        result = self.plog.delete_records_before(offset)
        self.log_start = offset
        assert result.log_start_offset == offset
        assert all(base < offset for base in result.deleted_base_offsets)

    @rule(data=st.data())
    def delete_records_out_of_range(self, data: st.DataObject) -> None:
        below = [st.integers(0, self.log_start - 1)] if self.log_start else []
        offset = data.draw(st.one_of(*below, st.integers(self.leo + 1, self.leo + 50)))
        with pytest.raises(OffsetOutOfRangeError):
            self.plog.delete_records_before(offset)

    @rule(limit=st.none() | st.integers(0, 400))
    def apply_retention(self, limit: int | None) -> None:
        config = self.config
        segments = self.plog.segments
        bound = self.leo if limit is None else min(limit, self.leo)
        # Kafka's rules, with each segment's largest timestamp taken from the model
        excess = sum(s.size for s in segments) - config.retention_bytes
        doomed = []
        for seg in segments[:-1]:
            newest = max(e.timestamp for e in self.events[seg.base_offset:seg.next_offset])
            if seg.next_offset > bound:
                break
            if not (seg.next_offset <= self.log_start
                    or (config.retention_bytes >= 0 and excess - seg.size >= 0)
                    or (config.retention_ms >= 0
                        and self.clock_ms - newest > config.retention_ms)):
                break
            excess -= seg.size
            doomed.append(seg)
        active = segments[-1]
        if (len(doomed) == len(segments) - 1 and active.size and active.next_offset <= bound
                and config.retention_ms >= 0 and self.clock_ms - max(
                    e.timestamp for e in self.events[active.base_offset:active.next_offset])
                > config.retention_ms):
            doomed.append(active)  # Kafka rolls an expired active segment so it can go too
        result = self.plog.apply_retention(limit)
        assert result.deleted_base_offsets == [s.base_offset for s in doomed]
        assert result.events_deleted == sum(s.next_offset - s.base_offset for s in doomed)
        if doomed:
            self.log_start = max(self.log_start, doomed[-1].next_offset)
        assert result.log_start_offset == self.log_start
        remaining = self.plog.segments
        if config.retention_bytes >= 0 and limit is None and len(remaining) > 1:
            # nothing more may go: the log would fall below retention_bytes without it
            first = remaining[0]
            assert (self.plog.size_bytes - first.size < config.retention_bytes
                    or first.next_offset > self.leo)

    def check_segment_deletions(self, before: dict[str, tuple[int, int]]) -> None:
        """The loader may finish a retention: delete a segment wholly below the log start."""
        for action in self.plog.last_recovery.actions:
            if action.kind == SEGMENT_DELETED:
                _, next_offset = before[action.path]
                assert next_offset <= self.log_start, action

    @rule(compression=st.sampled_from(CODECS))
    def reopen_cleanly(self, compression: str) -> None:
        before = {str(s.log_path): (s.base_offset, s.next_offset) for s in self.plog.segments}
        self.plog.close()
        self.config = self.config.replace(compression=compression)
        self.open()
        report = self.plog.last_recovery
        assert report.clean_shutdown, report.summary()
        assert {a.kind for a in report.actions} <= {SEGMENT_DELETED}, report.summary()
        self.check_segment_deletions(before)

    @rule()
    def crash_and_reopen(self) -> None:
        log = self.plog
        before = {str(s.log_path): (s.base_offset, s.next_offset) for s in log.segments}
        log.state.release_dir_lock()  # the process dies: no close(), no clean marker
        for seg in log.segments + tuple(log.state.pending_deletes):
            seg.close()
        self.open()
        report = self.plog.last_recovery
        assert not report.clean_shutdown
        assert not report.lost_data, report.summary()
        kinds = {a.kind for a in report.actions}
        assert not kinds & {TRUNCATED, GAP, LOG_END_MISMATCH, INDEX_REBUILT}, report.summary()
        if ZERO_TAIL_CUT in kinds:  # only preallocation leaves zeros: Kafka's, or the
            # zeros fsync durability writes ahead of its appends (segment_file.py)
            assert self.config.preallocate or self.config.durability == "fsync", \
                report.summary()
        assert kinds <= {ZERO_TAIL_CUT, STRAY_FILE_DELETED, SEGMENT_DELETED}, report.summary()
        self.check_segment_deletions(before)
        assert report.recovery_point == self.leo

    @rule()
    def read_only_view(self) -> None:
        with PartitionLog.open(self.directory, self.config, read_only=True) as reader:
            assert reader.log_start_offset <= self.leo
            assert reader.log_end_offset == self.leo
            end = reader.high_watermark
            start = reader.log_start_offset
            assert list(reader.iter_events(start)) == self.visible(start, end)

    @precondition(lambda self: self.config.durability == "policy")
    @rule()
    def flush(self) -> None:
        self.plog.flush()
        assert self.plog.unflushed_events == 0
        assert self.plog.recovery_point == self.leo

    @rule(ms=st.integers(0, 2_000_000))
    def tick(self, ms: int) -> None:
        """Time passes; the scheduler's hook runs (flush_ms, recovery point, deleted files)."""
        self.clock_ms += ms
        if self.plog.flush_if_due():
            assert self.plog.unflushed_events == 0
        if self.config.durability == "policy" and self.config.flush_ms is not None:
            assert self.plog.unflushed_events == 0 or ms < self.config.flush_ms
        if self.config.file_delete_delay_ms == 0:
            assert not list(self.directory.glob("*.deleted"))

    @rule()
    def checkpoint(self) -> None:
        self.plog.checkpoint_recovery_point()

    # -- invariants -------------------------------------------------------------------------
    @invariant()
    def offsets_match(self) -> None:
        log = self.plog
        assert log.log_start_offset == self.log_start
        assert log.log_end_offset == self.leo
        assert log.high_watermark == self.leo
        assert log.unflushed_events >= 0
        if self.config.durability == "fsync":
            assert log.unflushed_events == 0

    @invariant()
    def segments_are_contiguous(self) -> None:
        segments = self.plog.segments
        assert segments[0].base_offset <= self.log_start
        for seg, nxt in pairwise(segments):
            assert seg.next_offset == nxt.base_offset, segments
            assert seg.size > 0 and seg.file_size == seg.size, seg  # inactive: trimmed
        assert segments[-1].next_offset == self.leo

    @invariant()
    def events_match(self) -> None:
        assert list(self.plog.iter_events(self.log_start)) == self.visible(self.log_start)

    def teardown(self) -> None:
        record_batch.time = self.real_time
        try:
            if self.log is not None:
                self.log.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


DEFAULT_SETTINGS = settings(
    max_examples=100, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOW_SETTINGS = settings(
    DEFAULT_SETTINGS, max_examples=1500, stateful_step_count=60,
)


def test_it_behaves_like_a_list() -> None:
    run_state_machine_as_test(PartitionLogMachine, settings=DEFAULT_SETTINGS)


@pytest.mark.slow
def test_it_behaves_like_a_list_over_many_examples() -> None:
    run_state_machine_as_test(PartitionLogMachine, settings=SLOW_SETTINGS)

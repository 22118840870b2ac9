"""Golden files: a partition directory written by each released format (v1, v2) must stay
readable.

tests/engine/golden/partition-v1/ and partition-v2/ were each made once by
tests/engine/golden/make_golden.py (v2: log.state version 2, with its committed-end record;
every other file the same as v1's) and committed. If a change to the engine makes this
test fail, the engine can no longer read files it released: fix the engine (or add a
migration), never the golden files. Every test works on a copy; the committed
directories are never opened in place.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from channel_engine.event import Event, PendingEvent
from channel_engine.log import state as log_state
from channel_engine.log.config import LogConfig
from channel_engine.log.partition_log import PartitionLog
from channel_engine.log.state import LogState

GOLDENS = {version: Path(__file__).parent / "golden" / f"partition-v{version}"
           for version in (1, 2)}
T = 1_600_000_000_000

EXPECTED = [
    Event(0, 0, T, None, {}, b"first"),
    Event(0, 1, T + 10, b"key-2", {"src": b"golden", "n": b"2"}, b"second"),
    Event(0, 2, T + 5, b"", {}, b""),
    Event(0, 3, T + 15, b"key-4", {}, b"fourth"),
    Event(0, 4, T + 20, b"key-5", {"n": b"5"}, b"fifth" * 20),
    Event(0, 5, T + 30, None, {"empty": b""}, b"sixth"),
    Event(0, 6, T + 40, b"key-7", {"codec": b"gzip"}, b"gzip-7 " * 30),
    Event(0, 7, T + 41, None, {}, b"gzip-8 " * 30),
    Event(0, 8, T + 35, b"key-9", {"a": b"1", "b": b"2"}, b"gzip-9"),
    Event(0, 9, T + 50, None, {}, b"gzip-10"),
    Event(0, 10, T + 60, b"key-11", {}, b"eleventh"),
]
FILES = sorted(
    [f"{base:020d}{suffix}" for base in (0, 4, 6) for suffix in (".log", ".index", ".timeindex")]
    + ["log.state"]
)
CONFIG = LogConfig(segment_bytes=350, index_interval_bytes=100)


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module", params=sorted(GOLDENS), ids=lambda v: f"v{v}")
def golden(request):
    directory = GOLDENS[request.param]
    before = digest(directory)
    yield directory
    assert digest(directory) == before, "a test changed the committed golden directory"


@pytest.fixture
def copy(tmp_path, golden):
    target = tmp_path / golden.name
    shutil.copytree(golden, target)
    return target


def test_it_ships_a_small_golden_directory(golden):
    assert sorted(p.name for p in golden.iterdir()) == FILES
    assert sum(p.stat().st_size for p in golden.iterdir()) < 20_000


def test_it_reads_the_state_file(copy):
    committed_end = None if copy.name == "partition-v1" else 11  # v1 has no such record
    assert log_state.read(copy / "log.state") == LogState(0, 11, 11, True, 1_700_000_000_000,
                                                          committed_end)


def test_the_formats_differ_in_log_state_alone():
    v1, v2 = (digest(GOLDENS[version]) for version in (1, 2))
    assert {name for name in v1 if v1[name] != v2[name]} == {"log.state"}


def test_it_reads_every_event_of_the_golden_log_read_only(copy):
    with PartitionLog.open(copy, CONFIG, read_only=True) as log:
        assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (0, 11, 11)
        assert [s.base_offset for s in log.segments] == [0, 4, 6]
        assert log.read(0) == EXPECTED
        assert list(log.iter_events(0)) == EXPECTED
        for offset in range(11):
            assert log.read(offset, max_events=1) == [EXPECTED[offset]]
        codecs = [h.codec for _, h, _ in log.read_batches(0, max_bytes=1 << 20)]
        assert codecs == ["none", "none", "none", "gzip", "none"]
        assert log.last_recovery.clean_shutdown is True
        assert log.last_recovery.actions == []
    assert digest(copy) == digest(GOLDENS[int(copy.name[-1])])  # a reader never writes


def test_it_opens_the_golden_log_for_writing_without_repairs(copy):
    with PartitionLog.open(copy, CONFIG) as log:
        assert log.last_recovery.clean_shutdown is True
        assert log.last_recovery.actions == []  # indexes and log.state accepted as written
        assert list(log.iter_events(0)) == EXPECTED
        assert [len(s.offset_index) for s in log.segments] == [1, 0, 0]
        assert log.offsets_for_time(T + 31) == 6
        assert log.offsets_for_time(T + 36) == 6
        assert log.offsets_for_time(T + 42) == 9
        assert log.offsets_for_time(T + 61) is None
        result = log.append([PendingEvent(b"twelfth", None, None, T + 70)])
        assert result.first_offset == 11
    with PartitionLog.open(copy, CONFIG) as log:
        assert list(log.iter_events(0)) == EXPECTED + [Event(0, 11, T + 70, None, {}, b"twelfth")]


def test_it_opens_the_golden_log_with_any_config(copy):
    with PartitionLog.open(copy, LogConfig(compression="zstd", preallocate=True)) as log:
        assert list(log.iter_events(0)) == EXPECTED

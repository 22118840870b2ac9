"""TimeIndex: the sparse `.timeindex` file (12-byte entries >qi: timestamp, relative offset)."""
from __future__ import annotations

import struct

import pytest

from channel_engine.errors import CorruptIndexError, IndexAppendError
from channel_engine.log.time_index import TimeIndex

BASE = 500


def index_at(path, base=BASE, max_bytes=1200, writable=True):
    return TimeIndex(path, base, max_bytes, writable)


def entries(index):
    return [index.entry(i) for i in range(len(index))]


def file_entries(path):
    return list(struct.iter_unpack(">qi", path.read_bytes()))


@pytest.fixture
def path(tmp_path):
    return tmp_path / "00000000000000000500.timeindex"


@pytest.fixture
def filled(path):
    index = index_at(path)
    for timestamp, offset in [(1_000, 502), (2_000, 510), (3_000, 511), (5_000, 530)]:
        index.maybe_append(timestamp, offset)
    return index


def test_it_writes_entries_in_kafkas_layout(filled, path):
    assert file_entries(path) == [(1_000, 2), (2_000, 10), (3_000, 11), (5_000, 30)]
    assert filled.size_bytes == 48


def test_it_skips_an_entry_whose_timestamp_does_not_increase(filled, path):
    filled.maybe_append(5_000, 540)
    filled.maybe_append(4_000, 541)
    assert len(filled) == 4
    assert len(file_entries(path)) == 4


def test_it_refuses_an_entry_whose_offset_goes_back(filled, path):
    # Kafka's TimeIndex.maybeAppend: an offset going backwards is an error, never stored
    with pytest.raises(IndexAppendError, match="offset goes back below 530"):
        filled.maybe_append(6_000, 520)
    assert filled.last_entry() == (5_000, 530)
    assert len(file_entries(path)) == 4


def test_it_ignores_a_smaller_timestamp_even_with_an_offset_going_back(filled, path):
    filled.maybe_append(4_000, 520)
    assert len(filled) == 4 and len(file_entries(path)) == 4


def test_it_ignores_the_no_timestamp_entry_of_an_empty_index(path):
    index = index_at(path)
    index.maybe_append(-1, BASE - 1)  # a segment with no timestamp yet (Kafka NO_TIMESTAMP)
    assert len(index) == 0 and not path.exists()


def test_it_looks_up_the_last_entry_older_than_a_timestamp(filled):
    assert filled.lookup_before(0) is None
    assert filled.lookup_before(1_000) is None
    assert filled.lookup_before(1_001) == 502
    assert filled.lookup_before(2_000) == 502
    assert filled.lookup_before(2_001) == 510
    assert filled.lookup_before(5_000) == 511
    assert filled.lookup_before(10**12) == 530


def test_it_answers_none_when_empty(path):
    index = index_at(path)
    assert index.lookup_before(10**12) is None
    assert index.last_entry() is None


def test_it_loads_what_it_wrote(filled, path):
    filled.close()
    loaded = index_at(path)
    loaded.load()
    assert entries(loaded) == entries(filled)
    assert loaded.lookup_before(2_500) == 510
    assert loaded.last_entry() == (5_000, 530)


def test_it_reports_a_missing_file_as_corrupt(path):
    with pytest.raises(CorruptIndexError) as info:
        index_at(path).load()
    assert info.value.reason == "missing"


def test_it_truncates_entries_at_or_after_an_offset(filled, path):
    filled.truncate_to_offset(511)
    assert entries(filled) == [(1_000, 502), (2_000, 510)]
    assert file_entries(path) == [(1_000, 2), (2_000, 10)]
    filled.truncate_to_offset(503)
    assert entries(filled) == [(1_000, 502)]
    filled.truncate_to_offset(BASE)
    assert entries(filled) == []
    assert path.read_bytes() == b""


def test_it_appends_after_a_truncation_at_the_new_end_of_the_file(filled, path):
    filled.truncate_to_offset(511)
    filled.maybe_append(2_500, 511)
    assert file_entries(path) == [(1_000, 2), (2_000, 10), (2_500, 11)]
    filled.close()
    loaded = index_at(path)
    loaded.load()
    assert loaded.last_entry() == (2_500, 511)


def test_it_resets_to_empty_in_memory_and_on_disk(filled, path):
    filled.reset()
    assert len(filled) == 0
    assert path.read_bytes() == b""
    filled.maybe_append(1, BASE)
    assert file_entries(path) == [(1, 0)]


@pytest.mark.parametrize("extra", [1, 8, 11])
def test_it_refuses_to_load_a_size_not_a_multiple_of_the_entry(filled, path, extra):
    filled.close()
    with open(path, "ab") as f:
        f.write(b"\x00" * extra)
    with pytest.raises(CorruptIndexError) as info:
        index_at(path).load()
    assert "multiple of 12" in info.value.reason


@pytest.mark.parametrize(
    "pairs",
    [
        [(1_000, 2), (1_000, 3)],             # timestamp repeats
        [(1_000, 2), (900, 3)],               # timestamp goes back
        [(1_000, 5), (2_000, 4)],             # offset goes back
        [(1, 1), (5, 2), (4, 3)],             # a later entry out of order
        [(1_000, -1)],                        # below the base offset
        [(-4_949_760_090_801_870_785, 3)],    # a negative timestamp (damaged bytes)
    ],
)
def test_it_refuses_to_load_entries_that_do_not_increase(path, pairs):
    path.write_bytes(b"".join(struct.pack(">qi", *p) for p in pairs))
    with pytest.raises(CorruptIndexError):
        index_at(path).load()


def test_it_is_full_when_one_slot_is_left(path):
    index = index_at(path, max_bytes=4 * 12)
    assert index.max_entries == 4
    index.maybe_append(1, BASE)
    index.maybe_append(2, BASE + 1)
    assert not index.is_full
    index.maybe_append(3, BASE + 2)
    assert index.is_full


def test_it_refuses_an_entry_when_full_but_keeps_the_slot_for_the_final_one(path):
    index = index_at(path, max_bytes=4 * 12)
    for i in range(3):
        index.maybe_append(i + 1, BASE + i)
    assert index.is_full
    with pytest.raises(IndexAppendError, match="full"):
        index.maybe_append(10, BASE + 10)
    index.maybe_append(10, BASE + 10, skip_full_check=True)  # roll and close: the last slot
    assert index.last_entry() == (10, BASE + 10)
    with pytest.raises(IndexAppendError, match="full"):
        index.maybe_append(11, BASE + 11, skip_full_check=True)
    assert len(file_entries(path)) == 4


def test_it_never_writes_when_read_only(path):
    index = index_at(path, writable=False)
    index.maybe_append(1, BASE)
    index.truncate_to_offset(BASE)
    assert not path.exists()

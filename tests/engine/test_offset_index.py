"""OffsetIndex: the sparse `.index` file (8-byte entries >ii: relative offset, position)."""
from __future__ import annotations

import struct

import pytest

from channel_engine.errors import CorruptIndexError, IndexAppendError
from channel_engine.log.offset_index import OffsetIndex

BASE = 1000


def index_at(path, base=BASE, max_bytes=1024, writable=True):
    return OffsetIndex(path, base, max_bytes, writable)


def entries(index):
    return [index.entry(i) for i in range(len(index))]


def file_entries(path):
    return list(struct.iter_unpack(">ii", path.read_bytes()))


@pytest.fixture
def path(tmp_path):
    return tmp_path / "00000000000000001000.index"


@pytest.fixture
def filled(path):
    index = index_at(path)
    for offset, position in [(1003, 100), (1010, 250), (1011, 400), (1020, 900)]:
        index.append(offset, position)
    return index


def test_it_writes_entries_in_kafkas_layout(filled, path):
    assert file_entries(path) == [(3, 100), (10, 250), (11, 400), (20, 900)]
    assert len(filled) == 4
    assert filled.size_bytes == 32


def test_it_looks_up_the_largest_entry_at_or_below_an_offset(filled):
    assert filled.lookup(BASE) == (BASE, 0)
    assert filled.lookup(1002) == (BASE, 0)
    assert filled.lookup(1003) == (1003, 100)
    assert filled.lookup(1009) == (1003, 100)
    assert filled.lookup(1010) == (1010, 250)
    assert filled.lookup(1019) == (1011, 400)
    assert filled.lookup(1020) == (1020, 900)
    assert filled.lookup(10**9) == (1020, 900)


def test_it_answers_the_base_for_any_lookup_when_empty(path):
    index = index_at(path)
    assert index.lookup(BASE + 50) == (BASE, 0)
    assert index.last_entry() == (BASE, 0)


def test_it_loads_what_it_wrote(filled, path):
    filled.close()
    loaded = index_at(path)
    loaded.load()
    assert entries(loaded) == entries(filled)
    assert loaded.lookup(1015) == (1011, 400)
    assert loaded.last_entry() == (1020, 900)


def test_it_reports_a_missing_file_as_corrupt(path):
    with pytest.raises(CorruptIndexError) as info:
        index_at(path).load()
    assert info.value.reason == "missing"


def test_it_refuses_non_increasing_appends(filled, path):
    for offset, position in [(1020, 1000), (1019, 1000), (1030, 900), (1030, 800)]:
        with pytest.raises(CorruptIndexError):
            filled.append(offset, position)
    assert len(filled) == 4
    assert len(file_entries(path)) == 4


def test_it_truncates_entries_at_or_after_a_position(filled, path):
    filled.truncate_to_position(400)
    assert entries(filled) == [(1003, 100), (1010, 250)]
    assert file_entries(path) == [(3, 100), (10, 250)]
    assert filled.lookup(1015) == (1010, 250)


def test_it_keeps_entries_below_the_truncation_position(filled, path):
    filled.truncate_to_position(401)
    assert entries(filled) == [(1003, 100), (1010, 250), (1011, 400)]
    filled.truncate_to_position(0)
    assert entries(filled) == []
    assert path.read_bytes() == b""


def test_it_appends_after_a_truncation_at_the_new_end_of_the_file(filled, path):
    filled.truncate_to_position(250)
    filled.append(1012, 300)
    assert file_entries(path) == [(3, 100), (12, 300)]
    filled.close()
    loaded = index_at(path)
    loaded.load()
    assert entries(loaded) == [(1003, 100), (1012, 300)]


def test_it_resets_to_empty_in_memory_and_on_disk(filled, path):
    filled.reset()
    assert len(filled) == 0
    assert path.read_bytes() == b""
    filled.append(1001, 10)
    assert file_entries(path) == [(1, 10)]


@pytest.mark.parametrize("extra", [1, 4, 7])
def test_it_refuses_to_load_a_size_not_a_multiple_of_the_entry(filled, path, extra):
    filled.close()
    with open(path, "ab") as f:
        f.write(b"\x00" * extra)
    with pytest.raises(CorruptIndexError) as info:
        index_at(path).load()
    assert "multiple of 8" in info.value.reason
    assert info.value.path == str(path)


@pytest.mark.parametrize(
    "pairs",
    [
        [(3, 100), (3, 200)],          # offset repeats
        [(3, 100), (2, 200)],          # offset goes back
        [(3, 100), (4, 100)],          # position repeats
        [(3, 100), (4, 50)],           # position goes back
        [(1, 10), (5, 50), (4, 60)],   # a later entry out of order
        [(-1, 10)],                    # below the base offset
        [(1, -10), (2, 10)],           # a negative position (a flipped sign bit)
    ],
)
def test_it_refuses_to_load_entries_that_do_not_increase(path, pairs):
    path.write_bytes(b"".join(struct.pack(">ii", *p) for p in pairs))
    with pytest.raises(CorruptIndexError):
        index_at(path).load()


def test_it_is_full_when_one_slot_is_left(path):
    index = index_at(path, max_bytes=5 * 8)
    assert index.max_entries == 5
    for i in range(3):
        index.append(BASE + i + 1, (i + 1) * 10)
        assert not index.is_full
    index.append(BASE + 10, 100)
    assert index.is_full


def test_it_refuses_an_append_when_full(path):
    index = index_at(path, max_bytes=3 * 8)
    index.append(BASE + 1, 10)
    index.append(BASE + 2, 20)
    index.append(BASE + 3, 30)
    with pytest.raises(IndexAppendError, match=r"full \(3 entries\)"):
        index.append(BASE + 4, 40)
    assert len(index) == 3 and len(file_entries(path)) == 3


def test_it_refuses_non_increasing_appends_with_an_index_append_error(filled):
    with pytest.raises(IndexAppendError, match="does not follow"):
        filled.append(1020, 1000)


def test_it_keeps_at_least_two_slots(path):
    assert index_at(path, max_bytes=1).max_entries == 2


def test_it_never_writes_when_read_only(path):
    index = index_at(path, writable=False)
    index.append(1001, 10)
    index.reset()
    assert not path.exists()


def test_it_reads_a_file_when_read_only(filled, path):
    filled.close()
    loaded = index_at(path, writable=False)
    loaded.load()
    assert entries(loaded) == entries(filled)


def test_it_renames_and_deletes_its_file(filled, path):
    new = path.with_name(path.name + ".deleted")
    filled.rename(new)
    assert not path.exists() and new.exists()
    filled.delete()
    assert not new.exists()


def test_it_refuses_to_load_a_position_below_byte_zero(path):
    path.write_bytes(struct.pack(">iiii", 3, -8, 10, 250))  # increasing, but -8 is no byte
    with pytest.raises(CorruptIndexError, match="position -8 is negative"):
        index_at(path, writable=False).load()

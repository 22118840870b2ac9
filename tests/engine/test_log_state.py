"""log/state.py: the 56-byte `log.state` file (magic, version, flags, offsets, CRC-32C, the
committed-end record); version 1 (44 bytes, no record) is still read."""
from __future__ import annotations

import struct
import time

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from channel_engine.errors import CorruptStateError
from channel_engine.log import state as log_state
from channel_engine.log.state import LogState

STATE = LogState(log_start_offset=7, recovery_point=1_000, log_end_offset=1_234,
                 clean_shutdown=True, written_at_ms=1_700_000_000_000, committed_end=1_234)


def test_it_round_trips_every_field():
    for state in (STATE, STATE.with_(clean_shutdown=False, committed_end=1_200),
                  LogState(2**62 - 1, 2**62, 2**62, True, 1, 2**62)):  # the largest allowed
        assert log_state.decode(log_state.encode(state)) == state


def test_it_encodes_the_documented_layout():
    data = log_state.encode(STATE.with_(committed_end=1_111))
    body = b"WLST" + bytes([2, 1, 0, 0]) + struct.pack(">qqqq", 7, 1_000, 1_234,
                                                       1_700_000_000_000)
    end = struct.pack(">q", 1_111)
    assert data == (body + struct.pack(">I", crc32c.crc32c(body))
                    + end + struct.pack(">I", crc32c.crc32c(end)))
    assert len(data) == log_state.SIZE == 56 and log_state.COMMITTED_END_AT == 44
    assert data[44:] == log_state.encode_committed_end(1_111)  # the in-place record


def test_it_writes_the_committed_end_a_state_implies_when_none_is_given():
    assert log_state.decode(log_state.encode(STATE.with_(committed_end=None))) == STATE
    unclean = STATE.with_(clean_shutdown=False, committed_end=None)
    assert log_state.decode(log_state.encode(unclean)).committed_end == 1_000


def test_it_reads_a_version_1_file_without_a_committed_end():
    body = b"WLST" + bytes([1, 0, 0, 0]) + struct.pack(">qqqq", 7, 1_000, 1_234, 5)
    state = log_state.decode(body + struct.pack(">I", crc32c.crc32c(body)))
    assert state == LogState(7, 1_000, 1_234, False, 5, committed_end=None)


def test_it_reads_a_committed_end_rewritten_in_place(tmp_path):
    path = tmp_path / "log.state"
    log_state.write(path, STATE.with_(clean_shutdown=False))
    with open(path, "r+b") as f:
        f.seek(log_state.COMMITTED_END_AT)
        f.write(log_state.encode_committed_end(1_300))
    assert log_state.read(path) == STATE.with_(clean_shutdown=False, committed_end=1_300)


def test_it_clears_the_clean_flag_bit_for_an_unclean_state():
    assert log_state.encode(STATE.with_(clean_shutdown=False))[5] == 0


def test_it_stamps_the_wall_clock_when_no_time_is_given():
    before = int(time.time() * 1000)
    state = log_state.decode(log_state.encode(LogState(1, 2, 3)))
    assert before <= state.written_at_ms <= int(time.time() * 1000)
    assert (state.log_start_offset, state.recovery_point, state.log_end_offset) == (1, 2, 3)


def test_it_writes_then_reads_a_file(tmp_path):
    path = tmp_path / "log.state"
    log_state.write(path, STATE)
    assert log_state.read(path) == STATE
    log_state.write(path, STATE.with_(recovery_point=1_100, clean_shutdown=False))
    assert log_state.read(path) == STATE.with_(recovery_point=1_100, clean_shutdown=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.state"]  # no temp file left


def test_it_reads_a_missing_file_as_none(tmp_path):
    assert log_state.read(tmp_path / "log.state") is None


def corrupt(tmp_path, change):
    data = bytearray(log_state.encode(STATE))
    data = change(data)
    path = tmp_path / "log.state"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStateError) as info:
        log_state.read(path)
    assert info.value.path == str(path)
    return info.value.reason


def with_crc(data):
    struct.pack_into(">I", data, 40, crc32c.crc32c(bytes(data[:40])))
    return data


def test_it_refuses_a_bad_magic(tmp_path):
    reason = corrupt(tmp_path, lambda d: with_crc(d.__setitem__(slice(0, 4), b"WLSX") or d))
    assert "magic" in reason


def test_it_refuses_an_unknown_version(tmp_path):
    reason = corrupt(tmp_path, lambda d: with_crc(d.__setitem__(4, 3) or d))
    assert "version 3 is not supported (expected 1 or 2)" in reason


@pytest.mark.parametrize("where", [5, 8, 20, 39, 40, 43, 44, 51, 52, 55])
def test_it_refuses_a_crc_mismatch(tmp_path, where):
    def flip(data):
        data[where] ^= 0x10
        return data

    assert "CRC" in corrupt(tmp_path, flip)


@pytest.mark.parametrize("size", [0, 43, 44, 45, 55, 57, 112])
def test_it_refuses_a_wrong_size(tmp_path, size):
    def resize(data):
        return (data * 2)[:size]

    assert f"size {size}" in corrupt(tmp_path, resize)


def test_it_raises_an_engine_error_for_a_directory_in_its_place(tmp_path):
    (tmp_path / "log.state").mkdir()
    with pytest.raises(CorruptStateError, match="byte 0: cannot be read"):
        log_state.read(tmp_path / "log.state")


def test_it_names_the_byte_of_a_crc_mismatch(tmp_path):
    data = bytearray(log_state.encode(STATE))
    data[30] ^= 0x10
    with pytest.raises(CorruptStateError, match="byte 40: CRC-32C mismatch") as caught:
        log_state.decode(bytes(data), tmp_path / "log.state")
    assert caught.value.position == 40


@given(st.binary(max_size=70), st.integers(0, 55), st.binary(min_size=1, max_size=4))
def test_decode_of_mutated_bytes_raises_only_engine_errors(extra, at, patch):
    for data in (extra, log_state.encode(STATE)[:at] + patch + log_state.encode(STATE)[at + 1:]):
        try:
            log_state.decode(data, "state")
        except CorruptStateError as exc:
            assert str(exc).startswith("state: byte ")


@pytest.mark.parametrize("field", ["log_start_offset", "recovery_point", "log_end_offset",
                                   "committed_end"])
@pytest.mark.parametrize("offset", [-1, log_state.MAX_OFFSET + 1, 2**63 - 5])
def test_it_refuses_an_offset_no_log_reaches_even_with_a_valid_crc(field, offset):
    # log_start_offset 2**63 - 5 deleted every segment at open and overflowed int64 offsets
    data = log_state.encode(LogState(3, 5, 8).with_(**{field: offset}))
    with pytest.raises(CorruptStateError, match=f"{field} {offset} outside"):
        log_state.decode(data)

"""Corruption tests: damage real files, then check that open recovers as specified, reports
the drop, and that `verify` found the damage first."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from channel_engine import CorruptRecordError, LogConfig, PartitionLog, PendingEvent
from channel_engine.log import record_batch as rb
from channel_engine.log import state as state_file
from channel_engine.log.recovery import (
    DAMAGE_SPLIT,
    GAP,
    INDEX_REBUILT,
    LOG_END_MISMATCH,
    TRUNCATED,
    ZERO_TAIL_CUT,
)
from channel_engine.tools import cli

CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def fill(directory: Path, batches: int = 40, config: LogConfig = CONFIG) -> list[bytes]:
    """Write `batches` batches of 5 events and close cleanly; return all bodies in order."""
    bodies = []
    with PartitionLog.open(directory, config) as log:
        for b in range(batches):
            batch = [f"batch {b} event {i} ".encode() * 3 for i in range(5)]
            log.append([PendingEvent(body, timestamp=1_000 + b) for body in batch])
            bodies += batch
    return bodies


def verify(directory: Path) -> tuple[int, str]:
    out = io.StringIO()
    status = cli.main(["verify", str(directory)], out)
    return status, out.getvalue()


def segment_logs(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def batch_positions(path: Path) -> list[int]:
    from channel_engine.tools.verify import scan_log_file
    return [position for position, _ in scan_log_file(path, None).batches]


def mark_unclean(directory: Path, recovery_point: int = 0) -> None:
    """Make log.state say what a crash leaves: no clean flag, an older recovery point."""
    state = state_file.read(directory / "log.state")
    assert state is not None
    state_file.write(directory / "log.state",
                     state.with_(clean_shutdown=False, recovery_point=recovery_point))


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def bodies_in(directory: Path) -> list[bytes]:
    with PartitionLog.open(directory, CONFIG, read_only=True) as log:
        return [event.body for event in log.iter_events(log.log_start_offset)]


def test_it_cuts_out_a_flipped_byte_after_an_unclean_shutdown_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    bodies = fill(tmp_path)
    last = segment_logs(tmp_path)[-1]
    positions = batch_positions(last)
    flip_byte(last, positions[2] + 70)
    status, text = verify(tmp_path)
    assert status == 1 and f"{last}: byte {positions[2]}: corrupt: CRC-32C" in text
    mark_unclean(tmp_path)

    log = PartitionLog.open(tmp_path, CONFIG)
    [action] = [a for a in log.last_recovery.actions if a.kind == DAMAGE_SPLIT]
    assert action.path == str(last) and action.position == positions[2]
    assert action.bytes_dropped == positions[3] - positions[2]
    base = int(last.name[:20])
    [lost] = log.last_recovery.lost_ranges
    assert (lost.start, lost.end) == (base + 10, base + 15)
    assert log.log_end_offset == len(bodies)
    log.close()
    assert bodies_in(tmp_path) == bodies[:base + 10] + bodies[base + 15:]
    assert (tmp_path / f"{last.name}.damaged-{positions[2]}").exists()
    status, text = verify(tmp_path)  # the hole stays visible
    assert status == 1 and f"offsets {base + 10}..{base + 14} are missing" in text


def test_a_read_skips_a_damaged_batch_below_the_recovery_point_and_reports_it(
    tmp_path: Path,
) -> None:
    bodies = fill(tmp_path)
    middle = segment_logs(tmp_path)[1]
    position = batch_positions(middle)[1]
    flip_byte(middle, position + 65)
    base = int(middle.name[:20])
    trusting = CONFIG.replace(verify_on_open=False)
    with PartitionLog.open(tmp_path, trusting) as log:  # clean, unchecked: damage unseen
        assert log.take_new_losses() == []
        events = log.read(base + 5, max_events=10)
        assert [e.offset for e in events] == list(range(base + 10, base + 20))
        [lost] = log.take_new_losses()
        assert (lost.start, lost.end, lost.path, lost.position) == \
            (base + 5, base + 10, str(middle), position)
        assert "CRC" in lost.cause
        assert [e.body for e in log.iter_events(0)] == bodies[:base + 5] + bodies[base + 10:]
        assert log.take_new_losses() == []  # reported once
        assert log.stats()["read_damage"] == {"places": 1, "offsets_lost": 5}
    assert verify(tmp_path)[0] == 1
    with PartitionLog.open(tmp_path, trusting) as log:  # the next writable open repairs it
        assert [a.kind for a in log.last_recovery.actions] == [DAMAGE_SPLIT]
        assert [(r.start, r.end) for r in log.take_new_losses()] == [(base + 5, base + 10)]
        assert [e.body for e in log.iter_events(0)] == bodies[:base + 5] + bodies[base + 10:]
    assert not list(tmp_path.glob("*.repair"))


def test_recover_cuts_out_the_damaged_batch_and_keeps_every_intact_one(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    logs = segment_logs(tmp_path)
    middle = logs[1]
    middle_base = int(middle.name[:20])
    position = batch_positions(middle)[1]
    flip_byte(middle, position + 65)
    out = io.StringIO()
    assert cli.main(["recover", str(tmp_path)], out) == 0
    assert "damage_split" in out.getvalue()
    with PartitionLog.open(tmp_path, CONFIG) as log:
        kinds = {a.kind for a in log.last_recovery.actions}
        assert kinds == {GAP}  # the hole stays reported; nothing is cut again
        [lost] = log.last_recovery.lost_ranges
        assert (lost.start, lost.end) == (middle_base + 5, middle_base + 10)
        assert [e.body for e in log.iter_events(0)] == \
            bodies[:middle_base + 5] + bodies[middle_base + 10:]
        # committed offsets are never handed out again
        assert log.append([PendingEvent(b"new")]).first_offset == len(bodies)


def test_recover_reports_the_offsets_it_lost(tmp_path: Path) -> None:
    fill(tmp_path)
    middle = segment_logs(tmp_path)[1]
    flip_byte(middle, batch_positions(middle)[1] + 65)
    with PartitionLog.open(tmp_path, CONFIG, force_recovery=True) as log:
        kinds = [a.kind for a in log.last_recovery.actions]
        [lost] = log.last_recovery.lost_ranges
    assert kinds == [DAMAGE_SPLIT]
    base = int(middle.name[:20])
    assert (lost.start, lost.end, lost.path) == (base + 5, base + 10, str(middle))
    assert lost.length > 0 and "CRC" in lost.cause


def test_it_truncates_a_file_cut_mid_batch(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    last = segment_logs(tmp_path)[-1]
    positions = batch_positions(last)
    os.truncate(last, positions[-1] + 30)
    status, text = verify(tmp_path)
    assert status == 1 and "partial" in text

    with PartitionLog.open(tmp_path, CONFIG) as log:  # log.state says clean: the end disagrees
        kinds = [a.kind for a in log.last_recovery.actions]
        assert kinds == [LOG_END_MISMATCH, TRUNCATED]
        [lost] = log.last_recovery.lost_ranges
        assert (lost.start, lost.end) == (len(bodies) - 5, len(bodies))
        assert log.last_recovery.lost_data
        # the lost batch's offsets were committed once: they are never handed out again
        assert log.log_end_offset == len(bodies)
        assert log.append([PendingEvent(b"after")]).first_offset == len(bodies)
    assert bodies_in(tmp_path) == bodies[:-5] + [b"after"]
    status, text = verify(tmp_path)
    assert status == 1 and f"offsets {len(bodies) - 5}..{len(bodies) - 1} are missing" in text


@pytest.mark.parametrize("damage", ["deleted", "garbage", "stale", "odd_size"])
@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_it_rebuilds_a_damaged_index(tmp_path: Path, damage: str, suffix: str) -> None:
    bodies = fill(tmp_path)
    index = segment_logs(tmp_path)[0].with_suffix(suffix)
    good = index.read_bytes()
    assert good, "the test needs a non-empty index"
    if damage == "deleted":
        index.unlink()
    elif damage == "garbage":
        index.write_bytes(os.urandom(len(good)))
    elif damage == "stale":  # entries for data the log no longer has
        entry = (b"\x00\x00\x7f\x00\x00\x00\x7f\x00" if suffix == ".index"
                 else b"\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x7f\x00")
        index.write_bytes(good + entry)
    else:
        index.write_bytes(good + b"\x01\x02\x03")
    status, text = verify(tmp_path)
    assert status == 1 and str(index) in text

    with PartitionLog.open(tmp_path, CONFIG) as log:
        rebuilt = [a for a in log.last_recovery.actions if a.kind == INDEX_REBUILT]
        assert len(rebuilt) == 1 and not log.last_recovery.lost_data
        assert [e.body for e in log.iter_events(0)] == bodies
        for offset in range(0, len(bodies), 7):
            assert log.read(offset, max_events=1)[0].body == bodies[offset]
        assert log.offsets_for_time(1_003) == 15
    assert index.read_bytes() == good
    assert verify(tmp_path)[0] == 0


def test_it_cuts_a_zero_tail_and_says_no_data_was_lost(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    last = segment_logs(tmp_path)[-1]
    with open(last, "ab") as f:
        f.write(bytes(3000))
    status, text = verify(tmp_path)
    assert status == 1 and "zero_tail" in text
    with PartitionLog.open(tmp_path, CONFIG) as log:
        kinds = [a.kind for a in log.last_recovery.actions]
        assert ZERO_TAIL_CUT in kinds and not log.last_recovery.lost_data
        assert log.log_end_offset == len(bodies)
    assert verify(tmp_path)[0] == 0


def test_it_cuts_the_preallocated_tail_after_a_crash(tmp_path: Path) -> None:
    config = CONFIG.replace(preallocate=True)
    log = PartitionLog.open(tmp_path, config)
    log.append([PendingEvent(b"x" * 100)] * 3)
    active = log.segments[-1]
    assert active.log_path.stat().st_size == config.segment_bytes
    log.state.release_dir_lock()  # kill -9: no trim, no clean flag
    for segment in log.segments:
        segment.close()
    status, text = verify(tmp_path)
    assert status == 0 and "note:" in text and "zero bytes" in text
    with PartitionLog.open(tmp_path, config) as log:
        [cut] = [a for a in log.last_recovery.actions if a.kind == ZERO_TAIL_CUT]
        assert cut.bytes_dropped == config.segment_bytes - cut.position
        assert not log.last_recovery.lost_data and log.log_end_offset == 3


def test_it_recovers_everything_when_log_state_is_corrupt(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    state = tmp_path / "log.state"
    state.write_bytes(b"WLST" + os.urandom(40))
    status, text = verify(tmp_path)
    assert status == 1 and "log.state" in text
    with PartitionLog.open(tmp_path, CONFIG) as log:
        report = log.last_recovery
        assert report.state_problem is not None
        assert report.segments_scanned == report.segments and not report.lost_data
        assert [e.body for e in log.iter_events(0)] == bodies
    assert verify(tmp_path)[0] == 0


def test_verify_names_the_file_and_position_of_a_bad_magic(tmp_path: Path) -> None:
    fill(tmp_path)
    first = segment_logs(tmp_path)[0]
    position = batch_positions(first)[3]
    with open(first, "r+b") as f:
        f.seek(position + 16)
        f.write(b"\x07")
    status, text = verify(tmp_path)
    assert status == 1 and f"{first}: byte {position}: corrupt: magic 7" in text


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_a_read_of_compressed_records_that_do_not_decode_raises_corrupt_record_error(
        tmp_path: Path, codec: str) -> None:
    """The CRC-32C holds (restamped over the damaged bytes) but the compressed stream does
    not decode: an engine error naming the file and byte, never the codec's raw error."""
    config = LogConfig(compression=codec)
    with PartitionLog.open(tmp_path, config) as log:
        log.append([PendingEvent(f"event {i} ".encode() * 8) for i in range(20)])
        path = log.segments[0].log_path
    batch = bytearray(path.read_bytes())
    batch[len(batch) - 6] ^= 0x40  # in the compressed stream or its checksum
    batch[17:21] = rb.compute_crc(batch).to_bytes(4, "big")
    path.write_bytes(bytes(batch))
    with PartitionLog.open(tmp_path, config) as log:
        for read in (lambda: log.read(0), lambda: list(log.iter_events(0))):
            with pytest.raises(CorruptRecordError, match="records do not decode") as caught:
                read()
            assert caught.value.path == str(path) and caught.value.position == 0


def test_a_read_ending_before_a_damaged_header_reports_the_damage_only_when_it_is_read(
    tmp_path: Path,
) -> None:
    # a read stops after the batch that reaches its end offset, without reading the next
    # header (segment_reader.read_batches): the damage there is the next read's to report
    fill(tmp_path)
    middle = segment_logs(tmp_path)[1]
    position = batch_positions(middle)[1]
    flip_byte(middle, position + 16)  # the magic byte: the header itself is damaged
    base = int(middle.name[:20])
    trusting = CONFIG.replace(verify_on_open=False)
    with PartitionLog.open(tmp_path, trusting) as log:
        events = log.read(base, end_offset=base + 5)
        assert [e.offset for e in events] == list(range(base, base + 5))
        assert log.take_new_losses() == []
        assert log.stats()["read_damage"] == {"places": 0, "offsets_lost": 0}
        events = log.read(base + 5, max_events=10)
        assert [e.offset for e in events] == list(range(base + 10, base + 20))
        [lost] = log.take_new_losses()
        assert (lost.start, lost.end, lost.path, lost.position) == \
            (base + 5, base + 10, str(middle), position)
        assert log.read(base + 5, max_events=10) == events
        assert log.take_new_losses() == []  # reported once
        assert log.stats()["read_damage"] == {"places": 1, "offsets_lost": 5}

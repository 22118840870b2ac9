"""Opening a partition directory: what log_loader does with leftovers, lost files and
damage that a clean shutdown marker does not cover."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from channel_engine import LogConfig, PartitionLog, PendingEvent
from channel_engine.filenames import segment_file
from channel_engine.log.known_end import index_evidence_end as evidence_end
from channel_engine.log.recovery import (
    DAMAGE_SPLIT,
    GAP,
    INDEX_REBUILT,
    SEGMENT_DELETED,
    STRAY_FILE_DELETED,
    TRUNCATED,
    ZERO_TAIL_CUT,
)
from channel_engine.tools.verify import verify_partition

CONFIG = LogConfig(segment_bytes=2048)


def write(directory: Path, n: int, config: LogConfig = CONFIG) -> PartitionLog:
    log = PartitionLog.open(directory, config)
    for i in range(n):
        log.append([PendingEvent(b"e%03d" % i * 12, timestamp=1_000 + i)])
    return log


def crash(log: PartitionLog) -> None:
    """What kill -9 leaves: no trim, no clean flag, the OS drops the lock."""
    log.state.release_dir_lock()
    for segment in log.segments:
        segment.close()


def patch(path: Path, position: int, new: bytes) -> None:
    """Overwrite the bytes of a file at `position` with `new`."""
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(new)


def flip(path: Path, position: int, bits: int) -> None:
    """XOR the byte of a file at `position` with `bits`."""
    with open(path, "rb") as f:
        f.seek(position)
        old = f.read(1)[0]
    patch(path, position, bytes([old ^ bits]))


def second_batch(path: Path) -> int:
    """The position of the second batch of a .log written by this module."""
    with open(path, "rb") as f:
        return int(struct.unpack(">i", f.read(12)[8:])[0]) + 12


def damaged_where_only_a_crc_sees(directory: Path) -> None:
    """A clean log of 40 events with a bit flipped inside the records of its first
    segment's second batch (offset 1): only the batch's CRC-32C tells."""
    write(directory, 40).close()
    first = sorted(directory.glob("*.log"))[0]
    flip(first, second_batch(first) + 70, 0x01)


def test_it_continues_after_a_lost_last_segment_without_reusing_offsets(tmp_path: Path) -> None:
    log = write(tmp_path, 40)
    log.checkpoint_recovery_point()
    known = log.recovery_point
    crash(log)
    last = sorted(tmp_path.glob("*.log"))[-1]
    for suffix in (".log", ".index", ".timeindex"):
        last.with_suffix(suffix).unlink()
    with PartitionLog.open(tmp_path, CONFIG) as log:
        report = log.last_recovery
        assert report.lost_data and any(a.kind == GAP for a in report.actions)
        assert log.log_end_offset == known
        assert log.append([PendingEvent(b"new")]).first_offset == known


def test_it_reports_missing_offsets_between_log_start_and_the_first_segment(
    tmp_path: Path,
) -> None:
    write(tmp_path, 40).close()
    first = sorted(tmp_path.glob("*.log"))[0]
    for suffix in (".log", ".index", ".timeindex"):
        first.with_suffix(suffix).unlink()
    with PartitionLog.open(tmp_path, CONFIG) as log:
        [gap] = [a for a in log.last_recovery.actions if a.kind == GAP]
        assert gap.first_offset_lost == 0 and gap.next_offset_kept == log.segments[0].base_offset


def test_it_finishes_a_retention_that_crashed_after_raising_the_log_start(
    tmp_path: Path,
) -> None:
    log = write(tmp_path, 40)
    second = log.segments[1].base_offset
    log.state.log_start_offset = second  # log.state written, files not yet renamed: then kill -9
    log.state.write_state(clean=False)
    crash(log)
    with PartitionLog.open(tmp_path, CONFIG) as log:
        # the active segment's zeros written ahead (fsync durability) are cut as well
        assert [a.kind for a in log.last_recovery.actions] == [ZERO_TAIL_CUT, SEGMENT_DELETED]
        assert log.log_start_offset == second and log.segments[0].base_offset == second
        assert next(log.iter_events(second)).offset == second


def test_it_deletes_leftover_files(tmp_path: Path) -> None:
    write(tmp_path, 40).close()
    (tmp_path / "00000000000000000000.log.deleted").write_bytes(b"old")
    (tmp_path / "log.state.tmp").write_bytes(b"half")
    (tmp_path / "00000000000000999999.index").write_bytes(b"")
    with PartitionLog.open(tmp_path, CONFIG) as log:
        stray = [a.path for a in log.last_recovery.actions if a.kind == STRAY_FILE_DELETED]
        assert len(stray) == 2 and log.log_end_offset == 40  # log.state.tmp: replaced by use
    assert not list(tmp_path.glob("*.deleted")) and not list(tmp_path.glob("*.tmp"))


def test_a_rebuilt_index_that_meets_a_bad_batch_recovers_and_reports_it(tmp_path: Path) -> None:
    write(tmp_path, 6, LogConfig()).close()
    log_file = tmp_path / "00000000000000000000.log"
    patch(log_file, second_batch(log_file) + 16, b"\x09")  # magic of the second batch
    (tmp_path / "00000000000000000000.index").unlink()
    with PartitionLog.open(tmp_path, LogConfig()) as log:
        kinds = [a.kind for a in log.last_recovery.actions]
        assert INDEX_REBUILT in kinds and DAMAGE_SPLIT in kinds and log.last_recovery.lost_data
        assert [(r.start, r.end) for r in log.last_recovery.lost_ranges] == [(1, 2)]
        assert [e.offset for e in log.iter_events(0)] == [0, 2, 3, 4, 5]
        assert log.append([PendingEvent(b"new")]).first_offset == 6


def test_a_read_only_open_changes_nothing(tmp_path: Path) -> None:
    log = write(tmp_path, 40, CONFIG.replace(preallocate=True))
    crash(log)
    before = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    with PartitionLog.open(tmp_path, CONFIG, read_only=True) as reader:
        assert [e.offset for e in reader.iter_events(0)] == list(range(40))
    after = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert before == after
    assert os.path.exists(tmp_path / "log.state")


def test_force_recovery_keeps_the_known_log_end(tmp_path: Path) -> None:
    log = write(tmp_path, 40)
    log.close()
    last = sorted(tmp_path.glob("*.log"))[-1]
    os.truncate(last, 0)  # every batch of the last segment gone
    with PartitionLog.open(tmp_path, CONFIG, force_recovery=True) as log:
        assert log.log_end_offset == 40
        assert [(r.start, r.end) for r in log.take_new_losses()] == \
            [(int(last.name[:20]), 40)]
        assert log.append([PendingEvent(b"new")]).first_offset == 40


def test_a_repair_marker_makes_the_next_writable_open_check_every_crc(tmp_path: Path) -> None:
    damaged_where_only_a_crc_sees(tmp_path)
    trusting = CONFIG.replace(verify_on_open=False)
    with PartitionLog.open(tmp_path, trusting) as log:  # clean, unchecked: damage unseen
        assert not log.last_recovery.actions
    marker = tmp_path / "00000000000000000000.repair"
    marker.write_bytes(b"")
    with PartitionLog.open(tmp_path, trusting, read_only=True) as reader:
        assert [a.kind for a in reader.last_recovery.actions] == [DAMAGE_SPLIT]
    assert marker.exists()  # a reader writes nothing
    with PartitionLog.open(tmp_path, trusting) as log:
        assert [a.kind for a in log.last_recovery.actions] == [DAMAGE_SPLIT]
        assert [(r.start, r.end) for r in log.take_new_losses()] == [(1, 2)]
    assert not marker.exists()


def test_files_kept_aside_survive_every_open(tmp_path: Path) -> None:
    write(tmp_path, 10).close()
    kept = [tmp_path / "00000000000000000000.log.damaged-77", tmp_path / "x.stray"]
    for path in kept:
        path.write_bytes(b"keep me")
    for _ in range(2):
        with PartitionLog.open(tmp_path, CONFIG) as log:
            assert not log.last_recovery.actions and log.log_end_offset == 10
    assert all(path.read_bytes() == b"keep me" for path in kept)


# -- damage an open must count: a clean log's bytes, and the active segment after a kill ---
def last_batch(path: Path) -> tuple[int, int]:
    """(position, size) of the last batch of a .log written by this module."""
    data, position, last = path.read_bytes(), 0, (0, 0)
    while position + 12 <= len(data) and any(data[position:position + 12]):
        size = struct.unpack_from(">i", data, position + 8)[0] + 12
        last, position = (position, size), position + size
    return last


def killed_with_ten_events(directory: Path) -> tuple[Path, int, int]:
    """A log of 10 events killed; its active segment and the (position, size) of that
    segment's last batch."""
    crash(write(directory, 10))
    active = sorted(directory.glob("*.log"))[-1]
    return (active, *last_batch(active))


def test_it_checks_every_crc_of_a_clean_log_at_open(tmp_path: Path) -> None:
    damaged_where_only_a_crc_sees(tmp_path)
    with PartitionLog.open(tmp_path, CONFIG) as log:
        assert [a.kind for a in log.last_recovery.actions] == [DAMAGE_SPLIT]
        assert [(r.start, r.end) for r in log.take_new_losses()] == [(1, 2)]


def test_it_counts_a_damaged_last_batch_after_a_kill_and_never_reuses_its_offsets(
    tmp_path: Path,
) -> None:
    active, position, size = killed_with_ten_events(tmp_path)
    flip(active, position + size - 3, 0x10)  # a complete batch, damaged: it was written whole
    with PartitionLog.open(tmp_path, CONFIG) as log:
        [cut] = [a for a in log.last_recovery.actions if a.kind == TRUNCATED]
        assert (cut.first_offset_lost, cut.next_offset_kept) == (9, 10)
        assert [(r.start, r.end) for r in log.take_new_losses()] == [(9, 10)]
        assert log.append([PendingEvent(b"new")]).first_offset == 10


def test_it_counts_a_last_batch_whose_length_field_alone_is_damaged(tmp_path: Path) -> None:
    active, position, _size = killed_with_ten_events(tmp_path)
    patch(active, position + 8, struct.pack(">i", 0x7F00_0000))  # outside the CRC-32C
    with PartitionLog.open(tmp_path, CONFIG) as log:
        assert [(r.start, r.end) for r in log.take_new_losses()] == [(9, 10)]
        assert log.log_end_offset == 10


def test_it_counts_offsets_the_active_index_names_past_a_cut_after_a_kill(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=64)
    crash(write(tmp_path, 30, config))
    active = sorted(tmp_path.glob("*.log"))[-1]
    index = active.with_suffix(".index").read_bytes()
    relative, position = struct.unpack_from(">ii", index, len(index) - 8)
    os.truncate(active, position - 7)  # the cut ends inside the batch before the entry's
    assert evidence_end(tmp_path) == relative + 1
    with PartitionLog.open(tmp_path, config) as log:
        assert log.log_end_offset >= relative + 1
        lost = log.take_new_losses()
        assert lost and lost[-1].end >= relative + 1
        assert log.append([PendingEvent(b"new")]).first_offset >= relative + 1


def test_it_cuts_without_counting_a_torn_write_whose_lost_sectors_are_zeros(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=1 << 20, preallocate=True)
    log = PartitionLog.open(tmp_path, config)
    for i in range(20):
        log.append([PendingEvent(b"e%03d" % i * 12, timestamp=1_000 + i)])
    # spans a sector boundary; written, its fsync (the commit) never returned
    log.append_batch(log.build_batch([PendingEvent(bytes(range(1, 256)) * 4)]),
                     defer_flush=True)
    crash(log)
    active = sorted(tmp_path.glob("*.log"))[-1]
    position, size = last_batch(active)
    boundary = (position // 512 + 1) * 512
    assert position < boundary < position + size
    with open(active, "r+b") as f:  # the sector after the boundary never reached the disk
        f.seek(boundary)
        f.write(bytes(min(512, position + size - boundary)))
    with PartitionLog.open(tmp_path, config) as log:
        [cut] = [a for a in log.last_recovery.actions if a.kind == TRUNCATED]
        assert cut.first_offset_lost == 20 and cut.next_offset_kept is None
        assert log.take_new_losses() == [] and log.log_end_offset == 20


# -- a destroyed active segment after a kill: its batches no index entry names -------------
def destroy(path: Path, how: str) -> None:
    """What an operator's mistake or a failing disk may do to a file."""
    if how == "truncate_zero":
        os.truncate(path, 0)
        return
    path.unlink()
    if how == "replace_dir":
        path.mkdir()


def killed_with_unindexed_tail(directory: Path, config: LogConfig,
                               one_batch: bool) -> tuple[int, int]:
    """A log killed with an active segment whose every batch lies past log.state's ends
    (written at open only) and past every index entry (the first batch of a segment is
    never indexed; the others are not within index_interval_bytes either). Returns the
    active segment's (base, end)."""
    log = write(directory, 40, config)
    if one_batch:
        log.roll()
        log.append([PendingEvent(b"only %d" % i, timestamp=2_000) for i in range(3)])
    else:
        while len(log.segments[-1].offset_index) or log.segments[-1].next_offset \
                - log.segments[-1].base_offset < 3:
            log.append([PendingEvent(b"more", timestamp=2_000)])
    active = log.segments[-1]
    assert len(active.offset_index) == 0
    base, end = active.base_offset, log.log_end_offset
    crash(log)
    return base, end


@pytest.mark.parametrize("durability", ["fsync", "policy"])
@pytest.mark.parametrize("how", ["delete", "truncate_zero", "replace_dir"])
@pytest.mark.parametrize("one_batch", [True, False], ids=["one_batch", "batches"])
def test_it_counts_a_destroyed_active_segment_after_a_kill_and_never_reuses_its_offsets(
    tmp_path: Path, durability: str, how: str, one_batch: bool,
) -> None:
    config = CONFIG.replace(durability=durability, flush_messages=10**6)
    base, end = killed_with_unindexed_tail(tmp_path, config, one_batch)
    assert verify_partition(tmp_path).ok, "a kill alone is no damage"
    destroy(segment_file(tmp_path, base, ".log"), how)
    assert not verify_partition(tmp_path).ok  # verify sees the loss before any open
    with PartitionLog.open(tmp_path, config) as log:
        assert [(r.start, r.end) for r in log.take_new_losses()] == [(base, end)]
        assert log.last_recovery.lost_data
        assert log.log_end_offset == end
        assert log.append([PendingEvent(b"new")]).first_offset == end
    with PartitionLog.open(tmp_path, config) as log:  # the hole stays a hole
        assert log.log_end_offset == end + 1
        assert [e.offset for e in log.iter_events(base - 1)] == [base - 1, end]

"""Zero-fill ahead (segment_file.py, commit_journal.py): in fsync durability zeros are kept
written ahead of the append point, bounded and counted, and every reader and recovery
takes them for preallocated space, never for data or loss."""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from channel_helpers import crash, make_config

from channel_engine import Channel, LogConfig, PartitionLog, PendingEvent
from channel_engine.log import record_batch as rb
from channel_engine.log import segment_file, zero_fill
from channel_engine.log.recovery import TRUNCATED, ZERO_TAIL_CUT
from channel_engine.log.segment import LogSegment, SegmentConfig
from channel_engine.queue import commit_journal as cj
from channel_engine.tools.verify import verify_partition

AHEAD = segment_file.ZERO_FILL_BYTES + segment_file.PAGE  # the most zeros ever ahead


def events(count: int, tag: str = "e") -> list[PendingEvent]:
    return [PendingEvent(f"{tag}{i}".encode() * 20) for i in range(count)]


def tail(path: Path, start: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read()


def test_it_keeps_zeros_ahead_of_an_fsync_segment_bounded_and_counted(tmp_path: Path) -> None:
    with PartitionLog.open(tmp_path, LogConfig()) as log:
        for _ in range(50):
            log.append(events(100))
            active = log.segments[-1]
            file_size = active.log_path.stat().st_size
            assert active.size < file_size == active.file_size <= active.size + AHEAD
            assert file_size - active.size >= segment_file.ZERO_FILL_BYTES // 2
            assert not tail(active.log_path, active.size).strip(b"\0")
        assert log.stats()["preallocated_bytes"] == active.file_size - active.size > 0
        assert log.stats()["size_bytes"] == active.size
        [info] = log.segment_infos()
        assert info.preallocated and info.file_size == active.file_size
        path, size = active.log_path, active.size
    assert path.stat().st_size == size  # a clean close trims them


def test_it_trims_the_zeros_of_a_segment_it_rolls(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=64 * 1024)
    with PartitionLog.open(tmp_path, config) as log:
        while len(log.segments) < 3:
            log.append(events(50))
        for sealed in log.segments[:-1]:
            assert sealed.log_path.stat().st_size == sealed.size == sealed.file_size
        active = log.segments[-1]
        assert active.size < active.file_size <= config.segment_bytes  # never past it
        assert log.stats()["preallocated_bytes"] == active.file_size - active.size


def test_it_writes_no_zeros_ahead_in_policy_durability(tmp_path: Path) -> None:
    with PartitionLog.open(tmp_path, LogConfig(durability="policy", flush_ms=1000)) as log:
        log.append(events(100))
        active = log.segments[-1]
        assert active.log_path.stat().st_size == active.size
        assert log.stats()["preallocated_bytes"] == 0


def test_it_recovers_every_acked_batch_and_no_loss_from_a_crash_with_zeros_ahead(
        tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig())
    for i in range(20):
        log.append(events(100, tag=f"b{i}-"))
    expected = list(log.iter_events(0))
    end = log.log_end_offset
    log.state.release_dir_lock()  # the process dies: no close, the zeros stay
    for seg in log.segments:
        seg.close()
    with PartitionLog.open(tmp_path, LogConfig()) as log:
        report = log.last_recovery
        assert not report.lost_data and report.bytes_dropped == 0, report.summary()
        assert [a.kind for a in report.actions] == [ZERO_TAIL_CUT]
        assert log.log_end_offset == end and list(log.iter_events(0)) == expected
        log.append(events(1, tag="after"))  # appends land at the valid end, zeros ahead
        assert [e.body for e in log.iter_events(end)] == [b"after0" * 20]


def test_a_crash_between_a_rolls_create_and_its_trim_is_no_log_end_mismatch(
        tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig())
    for i in range(5):
        log.append(events(100, tag=f"b{i}-"))
    expected, end = list(log.iter_events(0)), log.log_end_offset
    log.checkpoint_recovery_point()  # log.state: everything up to `end` is on disk
    old = log.segments[-1]
    assert old.file_size > old.size  # its zeros ahead, which the roll would trim
    new = LogSegment.create(tmp_path, end, SegmentConfig.of(LogConfig()))  # then the kill
    new.close()
    log.state.release_dir_lock()
    for seg in log.segments:
        seg.close()
    with PartitionLog.open(tmp_path, LogConfig()) as log:
        report = log.last_recovery
        assert [a.kind for a in report.actions] == [ZERO_TAIL_CUT], report.summary()
        assert not report.lost_data and list(log.iter_events(0)) == expected


def test_a_write_a_kill_cut_short_into_the_zeros_ahead_is_torn_not_lost(
        tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig())
    for i in range(3):
        log.append(events(100, tag=f"b{i}-"))
    expected, end = list(log.iter_events(0)), log.log_end_offset
    active = log.segments[-1]
    batch = log.build_batch(events(100, tag="torn-"))
    rb.set_base_offset(batch, end)
    batch_end = active.size + len(batch)
    # a kill stops a write between the file's pages: the rest, from a page boundary on,
    # never written
    cut = (batch_end - 1) // segment_file.PAGE * segment_file.PAGE - active.size
    assert 12 < cut < len(batch)
    assert active.size + len(batch) < active.file_size  # it lands in the zeros ahead
    with open(active.log_path, "r+b") as f:  # the kill came in the middle of its pwrite
        f.seek(active.size)
        f.write(bytes(batch[:cut]))
    log.state.release_dir_lock()
    for seg in log.segments:
        seg.close()
    with PartitionLog.open(tmp_path, LogConfig()) as log:
        report = log.last_recovery
        assert report.lost_ranges == [], report.summary()  # never acknowledged: no loss
        assert [a.kind for a in report.actions] == [TRUNCATED], report.summary()
        assert log.log_end_offset == end and list(log.iter_events(0)) == expected


def zero_writes_fail(monkeypatch: pytest.MonkeyPatch, free: list[int]) -> list[int]:
    """While `free[0]` is 0 (the bytes statvfs reports free), make every pwrite of zeros
    (the fill, never a batch or record) fail with ENOSPC; returns the fill's tries."""
    tries: list[int] = []
    real = os.pwrite

    def pwrite(fd: int, data: Any, position: int) -> int:
        if not free[0] and len(data) > 64 and not bytes(data).strip(b"\0"):
            tries.append(position)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, position)

    monkeypatch.setattr(zero_fill.os, "pwrite", pwrite)
    monkeypatch.setattr(zero_fill, "free_bytes_of", lambda fd: free[0])
    return tries


def test_it_appends_without_zeros_when_the_disk_cannot_hold_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    free = [0]
    tries = zero_writes_fail(monkeypatch, free)
    with PartitionLog.open(tmp_path, LogConfig()) as log:
        result = log.append(events(10))
        active = log.segments[-1]
        assert active.log_path.stat().st_size == active.size == active.file_size
        assert [e.offset for e in log.iter_events(0)] == list(range(result.next_offset))
        assert len(tries) == 1
        for _ in range(20):  # within a second, and the disk still full: no try
            log.append(events(10))
        monkeypatch.setattr(zero_fill, "RETRY_SECONDS", 0.0)
        log.append(events(10))
        assert len(tries) == 1  # statvfs says full: still no try
        free[0] = 1 << 40  # the disk has room again: the next append fills
        log.append(events(10))
        active = log.segments[-1]
        assert active.file_size > active.size and len(tries) == 1
        assert not tail(active.log_path, active.size).strip(b"\0")


def test_the_journal_stops_filling_while_the_disk_is_full(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    free = [0]
    tries = zero_writes_fail(monkeypatch, free)
    journal = cj.CommitJournal(tmp_path, 0, zero_fill=8192)
    for take in range(50):
        journal.sync(journal.append(cj.TAKE, take, [(0, take, take + 1)]))
    assert len(tries) == 1 and journal.preallocated_bytes == 0
    assert journal.path.stat().st_size == 16 + 41 * 50
    monkeypatch.setattr(zero_fill, "RETRY_SECONDS", 0.0)
    free[0] = 1 << 40
    journal.append(cj.TAKE, 50, [(0, 50, 51)])
    assert journal.preallocated_bytes == journal.path.stat().st_size - 16 - 41 * 51 > 0
    journal.close()
    assert [c.commit_id for c in cj.replay(journal.path)[0]] == list(range(51))


def test_the_journal_writes_all_its_zeros_through_short_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.pwrite

    def short(fd: int, data: Any, position: int) -> int:  # pwrite may write less
        return real(fd, bytes(data)[:1000], position)

    monkeypatch.setattr(zero_fill.os, "pwrite", short)
    journal = cj.CommitJournal(tmp_path, 0, zero_fill=8192)
    journal.append(cj.TAKE, 1, [(0, 0, 1)])
    size = journal.path.stat().st_size
    assert size >= 16 + 41 + 8192 and journal.preallocated_bytes == size - 16 - 41
    assert not tail(journal.path, 16 + 41).strip(b"\0")
    journal.close()



def test_a_channel_keeps_zeros_ahead_of_its_journal_and_reopens_after_a_crash_clean(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1)
    channel = Channel.open(config)
    with channel.put() as tx:
        tx.put_all(events(30))
    for _ in range(3):
        with channel.take() as tx:
            assert len(tx.take(5)) == 5
    journal = channel.owner.state.live_journal()
    assert journal.path.stat().st_size >= cj.ZERO_FILL_BYTES  # zeros ahead of 3 records
    status = channel.status()
    assert status["journal_bytes_preallocated"] == journal.path.stat().st_size - 16 - 3 * 41
    assert status["bytes_on_disk"] == status["partitions"][0]["size_bytes"] \
        + status["bytes_preallocated"] and status["bytes_preallocated"] > 0
    crash(channel)
    with Channel.open(config) as channel:
        recovery = channel.status()["recovery"]
        assert recovery["journal_bytes_ignored"] == 0 and not recovery["problems"]
        assert recovery["journals_unknown"] == []
        assert channel.status()["health"] == "healthy"
        with channel.take() as tx:
            assert [e.offset for e in tx.take(100)] == list(range(15, 30))


def test_a_policy_channel_keeps_no_zeros_ahead_of_its_journal(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1, durability="policy", flush_ms=1000)
    with Channel.open(config) as channel:
        with channel.put() as tx:
            tx.put_all(events(3))
        with channel.take() as tx:
            tx.take(3)
        journal = channel.owner.state.live_journal()
        assert journal.path.stat().st_size < 1024
        status = channel.status()
        assert status["journal_bytes_preallocated"] == status["bytes_preallocated"] == 0


def test_an_open_reports_zeros_ending_a_policy_durability_journal(tmp_path: Path) -> None:
    """A take commit returns before its fdatasync in policy durability: zeros where its
    record should be (a power loss kept the file's length, not the append) are a loss
    that is reported, not preallocated space (that journal keeps no zeros ahead)."""
    config = make_config(tmp_path, partitions=1, durability="policy", flush_ms=1000)
    channel = Channel.open(config)
    with channel.put() as tx:
        tx.put_all(events(10))
    with channel.take() as tx:
        tx.take(3)
    path = channel.owner.state.live_journal().path
    crash(channel)
    with open(path, "ab") as f:
        f.write(bytes(41 + 4096))
    with Channel.open(config) as channel:
        recovery = channel.status()["recovery"]
        assert recovery["journal_bytes_ignored"] == 41 + 4096
        assert any(str(path) in problem for problem in recovery["problems"])
        assert [j["path"] for j in recovery["journals_unknown"]] == [str(path)]


def test_a_last_batch_ending_in_zeros_with_a_flipped_byte_is_lost_not_torn(
        tmp_path: Path) -> None:
    """The reviewer's case: a body that ends in 65 zero bytes, a byte flipped elsewhere,
    the last batch before the zeros ahead and past the end log.state knows. No page (or
    sector) boundary falls in its trailing zeros, so no kill or power loss tore it: it
    was written whole, its commit may have returned: damage, its offsets counted lost."""
    log = PartitionLog.open(tmp_path, LogConfig())
    log.append(events(30, tag="a-"))
    while True:  # a filler batch that puts no sector boundary in the batch's zeros
        active = log.segments[-1]
        batch = log.build_batch([PendingEvent(b"z" * 100 + bytes(65))])
        batch_end = active.size + len(batch)
        if (batch_end - 70) // 512 == (batch_end - 1) // 512:
            break
        log.append([PendingEvent(b"f" * 37)])
    end = log.log_end_offset
    state_before = (tmp_path / "log.state").read_bytes()
    log.append([PendingEvent(b"z" * 100 + bytes(65))])
    # log.state as before it (its in-place rewrite not durable): the bytes alone decide
    (tmp_path / "log.state").write_bytes(state_before)
    expected = list(log.iter_events(0))[:end]
    position = active.size - len(batch)
    assert active.size == batch_end and active.file_size > batch_end  # zeros ahead follow
    with open(active.log_path, "r+b") as f:  # a flipped byte inside the body's "z"s
        f.seek(batch_end - 120)
        assert f.read(1) == b"z"
        f.seek(batch_end - 120)
        f.write(b"Z")
    assert position < batch_end - 120
    log.state.release_dir_lock()
    for seg in log.segments:
        seg.close()
    with PartitionLog.open(tmp_path, LogConfig()) as log:
        report = log.last_recovery
        assert [(r.start, r.end, r.position) for r in report.lost_ranges] == [
            (end, end + 1, position)], report.summary()
        assert list(log.iter_events(0)) == expected


@pytest.mark.parametrize("gap", [0, 5])
def test_verify_notes_a_roll_stopped_before_its_trim_as_the_loader_takes_it(
        tmp_path: Path, gap: int) -> None:
    log = PartitionLog.open(tmp_path, LogConfig())
    for i in range(3):
        log.append(events(100, tag=f"b{i}-"))
    end = log.log_end_offset
    log.checkpoint_recovery_point()
    old = log.segments[-1]
    LogSegment.create(tmp_path, end + gap, SegmentConfig.of(LogConfig())).close()  # the kill
    log.state.release_dir_lock()
    for seg in log.segments:
        seg.close()
    found = verify_partition(tmp_path, "fsync")
    untrimmed = [d for d in found.damages if d.path == str(old.log_path)]
    notes = [n for n in found.notes if "a roll stopped before its trim" in n]
    if gap:  # its batches do not reach the next segment: no roll's leftovers
        assert untrimmed and not notes
    else:
        assert not untrimmed and len(notes) == 1 and str(old.log_path) in notes[0]

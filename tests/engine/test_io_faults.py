"""Faults from the disk: a full disk refuses the batch and changes nothing; a failed fsync
takes the log offline; a reopen recovers without losing what was committed; a partition
directory deleted, replaced or read-only under a running log acknowledges nothing
(LogDirectoryError) and takes the log offline."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from channel_engine import (
    DiskFullError,
    LogConfig,
    LogOfflineError,
    PartitionLog,
    PendingEvent,
    StorageError,
)
from channel_engine.errors import LogDirectoryError
from channel_engine.log import segment_file


def events(n: int, tag: str = "e") -> list[PendingEvent]:
    return [PendingEvent(f"{tag}{i}".encode() * 20, timestamp=1_000) for i in range(n)]


def files(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir() if p.name != ".lock"}


def fail_once(monkeypatch: pytest.MonkeyPatch, name: str, code: int) -> None:
    real = getattr(os, name)
    calls = {"n": 0}

    def failing(*args: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(code, os.strerror(code))
        return real(*args)

    monkeypatch.setattr(os, name, failing)


@pytest.mark.parametrize("preallocate", [False, True])
def test_a_full_disk_refuses_the_batch_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preallocate: bool
) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(preallocate=preallocate, segment_bytes=1 << 20))
    log.append(events(3, "a"))
    before = (files(tmp_path), log.log_end_offset, log.segments[-1].size)
    fail_once(monkeypatch, "pwrite", errno.ENOSPC)
    with pytest.raises(DiskFullError, match="appending a batch"):
        log.append(events(3, "b"))
    assert (files(tmp_path), log.log_end_offset, log.segments[-1].size) == before
    log.append(events(2, "c"))
    log.close()
    with PartitionLog.open(tmp_path) as log:
        bodies = [e.body for e in log.iter_events(0)]
    assert bodies == [e.body for e in events(3, "a") + events(2, "c")]


def test_a_failed_roll_leaves_the_log_usable(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    config = LogConfig(segment_bytes=1000, preallocate=True)
    log = PartitionLog.open(tmp_path, config)
    log.append(events(1, "a"))
    log.append(events(1, "b"))
    fail_once(monkeypatch, "posix_fallocate", errno.ENOSPC)
    with pytest.raises(DiskFullError, match="rolling to a new segment"):
        for _ in range(10):
            log.append(events(1, "c"))
    assert len(list(tmp_path.glob("*.log"))) == 1, "no half-made segment is left behind"
    end = log.log_end_offset
    log.append(events(1, "d"))  # the fault cleared: this one rolls
    assert len(log.segments) == 2 and log.log_end_offset == end + 1
    log.close()
    with PartitionLog.open(tmp_path, config) as log:
        assert log.log_end_offset == end + 1 and not log.last_recovery.actions


def test_a_roll_that_cannot_open_files_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(segment_bytes=400))
    log.append(events(5))
    real_open = os.open

    def no_descriptors(path: object, *args: object) -> int:
        if str(path).endswith(".log"):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", no_descriptors)
    with pytest.raises(StorageError, match="Too many open files"):
        log.append(events(5))
    monkeypatch.setattr(os, "open", real_open)
    log.append(events(5))
    assert log.log_end_offset == 10 and len(log.segments) == 2
    log.close()


def test_a_failed_fsync_takes_the_log_offline_and_a_reopen_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog.open(tmp_path)
    log.append(events(4, "a"))
    fail_once(monkeypatch, "fdatasync", errno.EIO)
    with pytest.raises(LogOfflineError, match="Input/output error"):
        log.append(events(4, "b"))
    with pytest.raises(LogOfflineError):
        log.append(events(1, "c"))
    assert log.stats()["offline"]
    log.close()  # no clean flag: the next open recovers
    with PartitionLog.open(tmp_path) as log:
        bodies = [e.body for e in log.iter_events(0)]
        assert not log.last_recovery.clean_shutdown
    # the committed batch survives; the one whose fsync failed was cut, never half there
    assert bodies == [e.body for e in events(4, "a")]


def test_a_failed_fsync_after_a_roll_never_cuts_a_committed_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = LogConfig(preallocate=True, segment_bytes=4096)
    log = PartitionLog.open(tmp_path, config)
    for i in range(5):
        log.append([PendingEvent(b"x%d" % i * 100, timestamp=1_000)])
    fail_once(monkeypatch, "fdatasync", errno.EIO)  # the roll's first sync: the sealed segment
    with pytest.raises(LogOfflineError):
        log.append([PendingEvent(b"y" * 3000, timestamp=1_000)])
    log.close()
    with PartitionLog.open(tmp_path, config) as log:
        assert [e.body for e in log.iter_events(0)] == [b"x%d" % i * 100 for i in range(5)]
        assert not log.last_recovery.lost_data


def test_a_failed_truncation_takes_the_log_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog.open(tmp_path)
    for i in range(4):
        log.append(events(1, f"t{i}"))
    monkeypatch.setattr("channel_engine.log.log_truncate.fsync_directory",
                        lambda path: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))
    with pytest.raises(LogOfflineError):
        log.truncate_to(2)
    with pytest.raises(LogOfflineError):
        log.append(events(1, "late"))
    monkeypatch.undo()
    log.close()
    with PartitionLog.open(tmp_path) as log:
        offsets = [e.offset for e in log.iter_events(0)]
        assert offsets == list(range(len(offsets))) and offsets[:2] == [0, 1]


def test_close_racing_appenders_leaves_a_clean_log_with_every_acknowledged_event(
    tmp_path: Path,
) -> None:
    import threading

    log = PartitionLog.open(tmp_path, LogConfig(segment_bytes=8192))
    acknowledged: list[int] = []
    stop = threading.Event()

    def appender(tag: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                result = log.append(events(3, f"{tag}-{n}-"))
            except Exception:  # closed under us: what matters is what was acknowledged
                return
            acknowledged.extend(range(result.first_offset, result.last_offset + 1))
            n += 1

    threads = [threading.Thread(target=appender, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    while len(acknowledged) < 300:
        pass
    log.close()
    stop.set()
    for thread in threads:
        thread.join()
    with PartitionLog.open(tmp_path, LogConfig(segment_bytes=8192)) as log:
        assert log.last_recovery.clean_shutdown and not log.last_recovery.actions
        present = {e.offset for e in log.iter_events(0)}
    assert set(acknowledged) <= present


# -- the directory itself goes away or refuses writes -----------------------------------------


def policy_or_fsync(durability: str) -> LogConfig:
    return LogConfig(durability=durability,
                     flush_messages=1000 if durability == "policy" else None)


def assert_refused_and_offline(log: PartitionLog, directory: Path, match: str) -> None:
    with pytest.raises(LogDirectoryError, match=match) as info:
        log.append(events(1, "lost"))
    assert info.value.directory == str(directory) and str(directory) in str(info.value)
    assert isinstance(info.value, LogOfflineError)  # callers handling offline logs see it
    assert log.stats()["offline"]
    with pytest.raises(LogDirectoryError, match=match):  # every later call, same error
        log.append(events(1, "later"))
    with pytest.raises(LogDirectoryError):
        log.flush()


@pytest.mark.parametrize("durability", ["fsync", "policy"])
def test_a_deleted_partition_directory_acknowledges_nothing(tmp_path: Path,
                                                            durability: str) -> None:
    directory = tmp_path / "p0"
    log = PartitionLog.open(directory, policy_or_fsync(durability))
    log.append(events(3, "a"))
    shutil.rmtree(directory)
    assert_refused_and_offline(log, directory, "no longer exists")
    log.close()


@pytest.mark.parametrize("durability", ["fsync", "policy"])
def test_a_replaced_partition_directory_acknowledges_nothing(tmp_path: Path,
                                                             durability: str) -> None:
    # moved away (or unmounted) and another directory at its path: the open files still
    # have names, only the directory's identity tells
    directory = tmp_path / "p0"
    log = PartitionLog.open(directory, policy_or_fsync(durability))
    log.append(events(3, "a"))
    directory.rename(tmp_path / "moved")
    directory.mkdir()
    assert_refused_and_offline(log, directory, "another directory is at this path")
    log.close()
    assert not list(directory.iterdir())  # nothing written into the new one


@pytest.mark.parametrize("replace", [False, True])
def test_an_active_segment_file_deleted_or_replaced_acknowledges_nothing(
        tmp_path: Path, replace: bool) -> None:
    log = PartitionLog.open(tmp_path)
    log.append(events(3, "a"))
    active = log.segments[-1].log_path
    active.unlink()
    if replace:
        active.write_bytes(b"")
    assert_refused_and_offline(log, tmp_path, f"{active.name} was deleted or replaced")
    log.close()


@pytest.mark.parametrize("durability", ["fsync", "policy"])
def test_an_append_checks_the_segments_identity_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str) -> None:
    # policy: before the write (acknowledged on return); fsync: after the group fsync,
    # which covers every write before it
    log = PartitionLog.open(tmp_path / "p0", policy_or_fsync(durability))
    log.append(events(1, "a"))
    checks: list[bytes] = []
    real = segment_file.path_identity

    def counted(path: bytes) -> tuple[int, int]:
        checks.append(path)
        return real(path)

    monkeypatch.setattr(segment_file, "path_identity", counted)
    log.append(events(1, "b"))
    assert len(checks) == 1
    log.close()


def test_a_roll_in_fsync_durability_never_makes_a_segment_in_a_replaced_directory(
        tmp_path: Path) -> None:
    directory = tmp_path / "p0"
    log = PartitionLog.open(directory, LogConfig(segment_bytes=2048))
    log.append([PendingEvent(b"a" * 1000)])
    directory.rename(tmp_path / "moved")
    directory.mkdir()
    with pytest.raises(LogDirectoryError, match="another directory is at this path"):
        log.append([PendingEvent(b"b" * 1000)])  # does not fit: a roll first
    log.close()
    assert not list(directory.iterdir())  # nothing made in the new one


def test_a_directory_deleted_during_the_commit_fsync_fails_that_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the append's own check passed; the directory went while its fsync ran
    directory = tmp_path / "p0"
    log = PartitionLog.open(directory)
    log.append(events(2, "a"))
    real = os.fdatasync

    def deleting(fd: int) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", deleting)
    with pytest.raises(LogDirectoryError, match="no longer exists"):
        log.append(events(1, "b"))
    assert log.recovery_point == 2 and log.high_watermark == 2  # never acknowledged
    monkeypatch.undo()
    assert_refused_and_offline(log, directory, "no longer exists")
    log.close()


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.EPERM])
def test_a_directory_refusing_writes_takes_the_log_offline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    log = PartitionLog.open(tmp_path)
    log.append(events(2, "a"))
    fail_once(monkeypatch, "pwrite", code)
    with pytest.raises(LogDirectoryError, match="refuses writes") as info:
        log.append(events(1, "b"))
    assert os.strerror(code) in str(info.value) and str(tmp_path) in str(info.value)
    assert log.stats()["offline"]
    with pytest.raises(LogDirectoryError, match="refuses writes"):
        log.append(events(1, "c"))
    log.close()
    with PartitionLog.open(tmp_path) as log:  # reopening recovers, as after any offline
        assert [e.body for e in log.iter_events(0)] == [e.body for e in events(2, "a")]


@pytest.mark.parametrize("durability", ["fsync", "policy"])
def test_a_read_only_directory_failing_the_fsync_is_a_directory_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str) -> None:
    log = PartitionLog.open(tmp_path, policy_or_fsync(durability))
    log.append(events(2, "a"))
    fail_once(monkeypatch, "fdatasync", errno.EROFS)
    with pytest.raises(LogDirectoryError, match="refuses writes .* while flushing"):
        log.append(events(1, "b"))
        log.flush()
    assert log.stats()["offline"]
    log.close()


def test_a_roll_into_a_read_only_directory_is_a_directory_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(segment_bytes=400))
    log.append(events(5))
    real_open = os.open

    def read_only(path: object, *args: object) -> int:
        if str(path).endswith(".log"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_open(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(LogDirectoryError, match="while rolling"):
        log.append(events(5))
    monkeypatch.undo()
    assert log.stats()["offline"]
    log.close()


def test_a_deleted_data_dir_makes_channel_puts_fail_and_health_unhealthy(
        tmp_path: Path) -> None:
    from channel_helpers import make_config

    from channel_engine import Channel

    config = make_config(tmp_path, partitions=1)
    with Channel.open(config) as channel:
        with channel.put() as tx:
            tx.put(b"kept")
        shutil.rmtree(config.data_dirs[0])
        with pytest.raises(LogDirectoryError, match="data-a"), channel.put() as tx:
            tx.put(b"lost")
        status = channel.status()
        assert status["health"] == "unhealthy" and "offline" in status["health_reason"]
        assert status["counters"]["put_errors"] >= 1


def test_an_explicit_roll_in_fsync_durability_acknowledges_nothing_of_a_replaced_directory(
        tmp_path: Path) -> None:
    # a put's batch written, its fsync deferred (Puts.begin), then a roll before it: the
    # group fsync's check looks at the new active segment only, so the roll checks
    directory = tmp_path / "p0"
    log = PartitionLog.open(directory, LogConfig())
    log.append(events(1, "a"))
    directory.rename(tmp_path / "moved")
    directory.mkdir()
    written = log.append_batch(log.build_batch(events(1, "b")), defer_flush=True)
    with pytest.raises(LogDirectoryError, match="another directory is at this path"):
        log.roll()
    with pytest.raises(LogDirectoryError):
        log.flush_to(written.next_offset)  # never acknowledged
    assert log.recovery_point == 1
    log.close()
    assert not list(directory.iterdir())  # nothing made in the new one

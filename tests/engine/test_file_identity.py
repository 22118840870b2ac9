"""path_identity (log/file_identity.py): the (st_dev, st_ino) a path names, from a statx that
reads no timestamp, with os.stat as the fallback and os.stat's errors. Each test runs on
both ways of calling statx: the compiled module (_statx.c) and libc's through ctypes."""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from codec_helpers import compiled_module

from channel_engine import LogConfig, PartitionLog, PendingEvent
from channel_engine.log import file_identity
from channel_engine.log.file_identity import path_identity


def stat_of(path: Path) -> tuple[int, int]:
    found = os.stat(path)
    return found.st_dev, found.st_ino


@pytest.fixture(params=["compiled", "ctypes"])
def statx_call(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which way path_identity calls statx in this test (a refusal the test fakes, which
    turns both off for the process, is undone after it)."""
    monkeypatch.setattr(file_identity, "_statx", file_identity._statx)
    if request.param == "compiled":
        monkeypatch.setattr(file_identity, "_native",
                            compiled_module("_statx", "statx call").identity)
    else:
        monkeypatch.setattr(file_identity, "_native", None)
    return str(request.param)


def refusing_statx(code: int) -> Any:
    """A stand-in for libc's statx that fails with `code`, counting its calls."""
    def statx(*args: object) -> int:
        statx.calls += 1  # type: ignore[attr-defined]
        ctypes.set_errno(code)
        return -1
    statx.calls = 0  # type: ignore[attr-defined]
    return statx


def refusing_native(code: int) -> Any:
    """A stand-in for _statx.identity that fails with `code`, counting its calls."""
    def identity(path: bytes) -> None:
        identity.calls += 1  # type: ignore[attr-defined]
        raise OSError(code, os.strerror(code), path)
    identity.calls = 0  # type: ignore[attr-defined]
    return identity


def refuse(monkeypatch: pytest.MonkeyPatch, statx_call: str, code: int) -> Any:
    """Make the statx of this way of calling fail with `code`; the stand-in (its calls)."""
    if statx_call == "compiled":
        fake = refusing_native(code)
        monkeypatch.setattr(file_identity, "_native", fake)
    else:
        fake = refusing_statx(code)
        monkeypatch.setattr(file_identity, "_statx", fake)
    return fake


def test_it_names_the_file_a_path_names_and_sees_it_replaced(tmp_path: Path,
                                                             statx_call: str) -> None:
    path, other = tmp_path / "00000000000000000000.log", tmp_path / "other"
    path.write_bytes(b"a")
    other.write_bytes(b"b")
    assert path_identity(path) == stat_of(path)
    assert path_identity(str(path)) == stat_of(path)
    was = path_identity(path)
    os.replace(other, path)
    assert path_identity(path) == stat_of(path) != was


def test_it_raises_file_not_found_for_a_missing_path(tmp_path: Path, statx_call: str) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        path_identity(tmp_path / "gone.log")
    assert caught.value.filename == str(tmp_path / "gone.log")


@pytest.mark.skipif(sys.platform != "linux", reason="statx(2) is Linux's")
def test_it_asks_statx_not_stat_on_linux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         statx_call: str) -> None:
    assert file_identity._statx is not None  # found in the process's own C library
    path = tmp_path / "f"
    path.write_bytes(b"x")
    expected = stat_of(path)

    def no_stat(*args: object, **kwargs: object) -> None:
        raise AssertionError("os.stat called: it marks the timestamps queried")
    monkeypatch.setattr(file_identity.os, "stat", no_stat)
    assert path_identity(path) == expected


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EPERM], ids=["ENOSYS", "EPERM"])
def test_it_falls_back_to_stat_for_good_when_the_kernel_refuses_statx(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        code: int, statx_call: str) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    fake = refuse(monkeypatch, statx_call, code)
    with caplog.at_level(logging.INFO, logger=file_identity.__name__):
        assert path_identity(path) == stat_of(path)
        assert file_identity._statx is None  # remembered: never asked again
        assert file_identity._native is None
        assert path_identity(path) == stat_of(path) and fake.calls == 1
        with pytest.raises(FileNotFoundError):  # os.stat's error for what it finds
            path_identity(tmp_path / "missing")
    assert fake.calls == 1
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and os.strerror(code) in said[0], said


def test_it_raises_other_errors_naming_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 statx_call: str) -> None:
    refuse(monkeypatch, statx_call, errno.EACCES)
    with pytest.raises(PermissionError) as caught:
        path_identity(tmp_path / "f")
    assert caught.value.errno == errno.EACCES and caught.value.filename == str(tmp_path / "f")


@pytest.mark.skipif(sys.platform != "linux", reason="statx(2) is Linux's")
def test_it_finds_statx_without_looking_for_the_library_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes.util  # a minimal image has no ldconfig: find_library finds nothing there
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert file_identity._load_statx() is not None


def test_it_refuses_a_path_holding_a_nul_byte_as_stat_does(tmp_path: Path, statx_call: str) -> None:
    (tmp_path / "a").write_bytes(b"x")  # what a C string cut at the NUL would name
    with pytest.raises(ValueError):
        os.stat(f"{tmp_path}/a\0b")
    with pytest.raises(ValueError, match="null byte"):
        path_identity(f"{tmp_path}/a\0b")


def test_it_asks_statx_not_to_automount_as_stat_does_not(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # through ctypes, where the flags can be seen (_statx.c passes the same constant)
    monkeypatch.setattr(file_identity, "_native", None)
    path = tmp_path / "f"
    path.write_bytes(b"x")
    flags: list[int] = []
    real = file_identity._statx
    if real is None:
        pytest.skip("no statx here")

    def recording(dirfd: int, name: bytes, flag: int, mask: int, buffer: Any) -> int:
        flags.append(flag)
        return real(dirfd, name, flag, mask, buffer)
    monkeypatch.setattr(file_identity, "_statx", recording)
    assert path_identity(path) == stat_of(path)
    assert flags == [file_identity.AT_NO_AUTOMOUNT] == [0x800]


def mtime_updates(path: Path, check: Any, rounds: int = 100) -> int:
    """How often a write made right after `check` sets a new mtime: later than a clock read
    taken after the write before it (a coarse tick within those microseconds is rare)."""
    updated = 0
    fd = os.open(path, os.O_WRONLY)
    try:
        for _ in range(rounds):
            os.stat(path)  # queried: the next write takes a fine-grained time
            os.pwrite(fd, b"a", 0)
            between = time.time_ns()
            check(path)
            os.pwrite(fd, b"b", 0)
            updated += os.stat(path).st_mtime_ns > between
    finally:
        os.close(fd)
    return updated


def test_it_leaves_the_timestamps_unqueried_so_writes_keep_coarse_mtimes(
        tmp_path: Path, statx_call: str) -> None:
    # On a kernel with multigrain timestamps (Linux 6.13+, ext4), a write after os.stat gets
    # a new fine-grained mtime, an inode update per write; after path_identity it keeps the
    # mtime it had until the coarse clock ticks
    path = tmp_path / "f"
    path.write_bytes(b"x")
    after_stat = mtime_updates(path, os.stat)
    after_identity = mtime_updates(path, path_identity)
    if after_stat <= 80:
        pytest.skip(f"no multigrain timestamps on this kernel ({os.uname().release}): a write "
                    f"after os.stat set a new mtime {after_stat} times in 100")
    assert after_identity < after_stat // 2, (after_identity, after_stat)


def test_the_commit_path_checks_its_segment_without_reading_timestamps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stated: list[str] = []
    real_stat = os.stat

    def recording_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        stated.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)
    with PartitionLog.open(tmp_path, LogConfig(durability="fsync")) as log:
        monkeypatch.setattr(os, "stat", recording_stat)
        for _ in range(3):
            log.append([PendingEvent(b"x" * 200)] * 10)
        monkeypatch.undo()
        assert log.log_end_offset == 30
    assert not [path for path in stated if path.endswith(".log")], stated


def test_it_asks_stat_when_statx_gives_no_inode_number(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       statx_call: str) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    if statx_call == "compiled":
        monkeypatch.setattr(file_identity, "_native", lambda name: None)  # _statx.c's word
        assert path_identity(path) == stat_of(path)
        return

    def statx_without_ino(dirfd: int, name: bytes, flags: int, mask: int, buffer: Any) -> int:
        return 0  # success, stx_mask 0: nothing filled in (the buffer stays zeros)
    monkeypatch.setattr(file_identity, "_statx", statx_without_ino)
    assert path_identity(path) == stat_of(path)


def test_it_takes_a_path_encoded_once_and_names_it_as_text_in_errors(
        tmp_path: Path, statx_call: str) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    assert path_identity(os.fsencode(path)) == stat_of(path)
    with pytest.raises(FileNotFoundError) as info:
        path_identity(os.fsencode(tmp_path / "gone"))
    assert info.value.filename == str(tmp_path / "gone")  # not b'...' in any message
    assert "b'" not in str(info.value)

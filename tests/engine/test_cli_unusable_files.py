"""Every operator tool on a home or partition whose lock file, checkpoint, partition
directory or segment is something else (a directory, a file, a symlink loop): a clear
message naming the path and exit 1 when it cannot work, never a traceback or an errno;
verify reports what the other tools meet, and recover (or a writable open) moves a
non-regular lock or socket aside instead of failing (issue 12, point 6)."""
from __future__ import annotations

import io
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from channel_helpers import small_channel

from channel_engine import Channel, ChannelConfig
from channel_engine.tools import cli

TOOLS = ("produce", "dump", "verify", "stat", "recover")


def replace_by_dir(path: Path) -> None:
    if path.exists():
        path.unlink()
    path.mkdir()


def lock_loop(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.symlink(path, path)


def part_is_file(path: Path) -> None:
    shutil.rmtree(path)
    path.write_bytes(b"not a directory")


def first_segment(config: ChannelConfig) -> Path:
    return sorted(config.partition_dir(0).glob("*.log"))[0]


# what is broken -> (the broken path, how), the exit status of each tool on the home
BREAKS: dict[str, tuple[Callable[[ChannelConfig], Path], Callable[[Path], None],
                        dict[str, int]]] = {
    "lock is a directory": (lambda c: c.home / ".lock", replace_by_dir,
                            {"produce": 0, "dump": 0, "verify": 1, "stat": 0, "recover": 0}),
    "lock is a symlink loop": (lambda c: c.home / ".lock", lock_loop,
                               {"produce": 0, "dump": 0, "verify": 1, "stat": 0,
                                "recover": 0}),
    "checkpoint is a directory": (lambda c: c.home / "checkpoint", replace_by_dir,
                                  {"produce": 0, "dump": 1, "verify": 1, "stat": 0,
                                   "recover": 0}),
    "partition dir is a file": (lambda c: c.partition_dir(0), part_is_file,
                                {"produce": 1, "dump": 0, "verify": 1, "stat": 1,
                                 "recover": 1}),
    "partition lock is a directory": (lambda c: c.partition_dir(0) / ".lock", replace_by_dir,
                                      {"produce": 0, "dump": 0, "verify": 1, "stat": 0,
                                       "recover": 0}),
    "segment is a directory": (first_segment, replace_by_dir,
                               {"produce": 0, "dump": 0, "verify": 1, "stat": 0,
                                "recover": 0}),
    "owner socket is a directory": (lambda c: c.home / "owner.sock", replace_by_dir,
                                    {"produce": 0}),
}


def run(tool: str, path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a\nb\n")))
    out = io.StringIO()
    status = cli.main([tool, str(path)], out)  # raises on a traceback
    return status, out.getvalue() + capsys.readouterr().err


def broken_channel(root: Path, broken: str) -> tuple[ChannelConfig, Path]:
    """A small channel under `root` with one of BREAKS done to it; (config, broken path)."""
    where, breaking, _ = BREAKS[broken]
    config = small_channel(root)
    path = where(config)
    breaking(path)
    return config, path


def check_exit(tool: str, status: int, want: int, text: str, path: Path) -> None:
    """The tool exited `want`, with no traceback or bare errno, naming `path` if it failed."""
    assert status == want, f"{tool}: {text}"
    assert "[Errno" not in text and "Traceback" not in text, f"{tool}: {text}"
    if status:
        assert str(path) in text, f"{tool}: {text}"


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_it_names_an_unusable_file_and_exits_nonzero(
    tmp_path: Path, broken: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for tool, want in BREAKS[broken][2].items():
        config, path = broken_channel(tmp_path / tool, broken)
        status, text = run(tool, config.home, capsys, monkeypatch)
        check_exit(tool, status, want, text, path)
        if tool == "recover" and status == 0:
            assert run("verify", config.home, capsys, monkeypatch)[0] == 0 or \
                "unacknowledged" in run("verify", config.home, capsys, monkeypatch)[1]


@pytest.mark.parametrize("broken", ["partition lock is a directory", "segment is a directory"])
def test_the_tools_on_a_partition_directory_name_what_is_unusable(
    tmp_path: Path, broken: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for tool in TOOLS:
        config, path = broken_channel(tmp_path / tool, broken)
        status, text = run(tool, config.partition_dir(0), capsys, monkeypatch)
        want = 1 if tool == "verify" or (tool == "dump" and path.suffix == ".log") else 0
        check_exit(tool, status, want, text, path)


def test_recover_moves_a_directory_in_place_of_the_lock_aside_and_reports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = small_channel(tmp_path)
    (config.home / ".lock").unlink()
    (config.home / ".lock").mkdir()
    status, text = run("recover", config.home, capsys, monkeypatch)
    assert status == 0 and f"moved aside: {config.home / '.lock'} -> " \
        f"{config.home / '.lock.stray'} (not a regular file" in text
    assert (config.home / ".lock").is_file() and (config.home / ".lock.stray").is_dir()
    with Channel.open(config) as opened:
        assert opened.status()["events_untaken"] == 4


@pytest.mark.parametrize("tool", ["produce", "recover"])
def test_an_unreadable_lock_file_is_named_with_the_reason(
    tmp_path: Path, tool: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = small_channel(tmp_path)
    lock = config.home / ".lock"
    real_open = os.open

    def refusing_open(path: object, flags: int, *args: int, **kwargs: object) -> int:
        if str(path) == str(lock):  # mode 000 refuses even root nothing: refuse here
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing_open)
    status, text = run(tool, config.home, capsys, monkeypatch)
    assert status == 1 and f"{lock}: cannot be used as the channel's lock file: permission " \
        "denied; move it aside (or fix it) and retry" in text, text

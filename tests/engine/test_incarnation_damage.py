"""A partition's incarnation is never lost silently (log/incarnation.py): an empty
directory in place of a vanished one is still missing until the operator's recreate; an
incarnation file that is no regular file, or only an older engine's `incarnation.stray`
copy of it, is damage (the open refuses, verify reports it), never the original storage;
`recover` repairs what verify reports."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from test_incarnation import _vanished_after_old_checkpoint

from channel_engine import (
    Channel,
    ChannelConfig,
    ChannelGoneError,
    StorageMissingError,
    recreate_temp_dir,
)
from channel_engine.errors import ChannelEngineError, CorruptStateError
from channel_engine.filenames import INCARNATION_FILE
from channel_engine.incarnations import ORIGINAL
from channel_engine.log import incarnation as incarnation_file
from channel_engine.queue.channel_owner import ChannelOwner
from channel_engine.tools import cli
from channel_engine.tools.recover import repair
from channel_engine.tools.verify import verify_channel, verify_partition


def _recreated(tmp_path: Path) -> tuple[ChannelConfig, str, int]:
    """A channel whose partition 1 was recreated: (config, its incarnation, its start)."""
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    with Channel.open(config, existed=True) as channel:
        made = channel.incarnations()[1].incarnation
        with channel.put() as tx:
            for i in range(6):
                tx.put(f"new-{i}".encode(), key=str(i).encode())
    return config, made, checkpointed


# -- an empty directory in place of a vanished one -----------------------------------------

def test_an_empty_directory_in_place_of_a_vanished_one_is_still_missing(
        tmp_path: Path) -> None:
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    directory = config.partition_dir(1)
    directory.mkdir()  # provisioning made the tree again, or a volume is not mounted
    assert Channel.missing_places(config) == [directory]
    with pytest.raises(StorageMissingError, match="orders-1|ch-1"):
        Channel.open(config, create=False)  # a drain, the appliance's open: refused
    with pytest.raises(ChannelGoneError, match="partition directory empty"):
        ChannelOwner.open(config, create=False)  # an owner re-elected: refused too
    assert os.listdir(directory) == []  # nothing written into it
    with Channel.open(config, existed=True) as channel:  # the operator's recreate
        part = channel.incarnations()[1]
        assert part.incarnation != ORIGINAL and part.start_offset == checkpointed
    assert Channel.missing_places(config) == []


def test_an_empty_partition_directory_of_a_new_channel_is_used_as_is(tmp_path: Path) -> None:
    """Only a channel that was there before has directories to go missing."""
    config, _, _ = _vanished_after_old_checkpoint(tmp_path / "old")
    fresh = ChannelConfig("fresh", [str(tmp_path / "d")], str(tmp_path / "h"), partitions=1)
    fresh.partition_dir(0).mkdir(parents=True)
    with Channel.create(fresh) as channel:
        assert channel.incarnations()[0].incarnation == ORIGINAL
    assert config.partitions == 2


# -- an incarnation file that is no regular file ---------------------------------------------

def test_a_directory_in_place_of_the_incarnation_file_is_damage_not_a_stray(
        tmp_path: Path) -> None:
    config, _, _ = _recreated(tmp_path)
    directory = config.partition_dir(1)
    path = directory / INCARNATION_FILE
    path.unlink()
    path.mkdir()
    with pytest.raises(CorruptStateError, match="not a regular file"):
        Channel.open(config)
    assert path.is_dir() and not list(directory.glob("incarnation*.stray"))
    [damage] = verify_partition(directory).damages  # once, as damage, not as a stray
    assert damage.path == str(path) and "not a regular file" in damage.reason
    assert "recover" in damage.reason


def test_an_older_engines_stray_copy_without_the_file_is_refused(tmp_path: Path) -> None:
    config, _, _ = _recreated(tmp_path)
    directory = config.partition_dir(1)
    stray = directory / "incarnation.stray"
    os.rename(directory / INCARNATION_FILE, stray)  # as an engine older than the file does
    with pytest.raises(CorruptStateError, match="kept aside .* original storage"):
        Channel.open(config)
    assert [d.path for d in verify_partition(directory).damages] == [str(stray)]


# -- recover repairs what verify reports -----------------------------------------------------

def test_recover_keeps_a_damaged_file_aside_and_starts_a_new_incarnation_at_the_log_start(
        tmp_path: Path) -> None:
    config, made, checkpointed = _recreated(tmp_path)
    directory = config.partition_dir(1)
    path = directory / INCARNATION_FILE
    data = bytearray(path.read_bytes())
    data[30] ^= 0xFF
    path.write_bytes(bytes(data))
    assert not verify_partition(directory).ok

    report = repair(config.home)
    kept = directory / "incarnation.damaged"
    assert kept.read_bytes() == bytes(data)
    assert {"path": str(path), "kept_as": str(kept)}.items() <= report.moved_aside[0].items()
    [rewritten] = [r for r in report.rewritten if r["path"] == str(path)]
    assert f"starting at the log start, offset {checkpointed}" in rewritten["why"]
    assert verify_partition(directory).ok
    with Channel.open(config) as channel:
        part = channel.incarnations()[1]
        assert part.incarnation not in (made, ORIGINAL)
        assert part.start_offset == checkpointed  # the recreated log starts there
        assert rewritten["why"].startswith(f"a new incarnation {part.incarnation} ")


def test_recover_puts_an_older_engines_intact_copy_back(tmp_path: Path) -> None:
    config, made, checkpointed = _recreated(tmp_path)
    directory = config.partition_dir(1)
    os.rename(directory / INCARNATION_FILE, directory / "incarnation.stray")
    repair(config.home)
    saved = incarnation_file.read(directory)
    assert (saved.id, saved.start_offset) == (made, checkpointed)


def test_recover_replaces_a_directory_in_place_of_the_file(tmp_path: Path) -> None:
    config, made, _ = _recreated(tmp_path)
    directory = config.partition_dir(1)
    path = directory / INCARNATION_FILE
    path.unlink()
    path.mkdir()
    repair(config.home)
    assert path.is_file() and (directory / "incarnation.damaged").is_dir()
    assert incarnation_file.read(directory).id not in (made, ORIGINAL)


@pytest.mark.parametrize("kept", ["file", "directory"])
def test_a_recover_cut_short_after_keeping_the_file_aside_is_refused_then_finished(
        tmp_path: Path, kept: str) -> None:
    """Whatever was in the file's place, kept aside: the partition never turns original."""
    config, made, _ = _recreated(tmp_path)
    directory = config.partition_dir(1)
    if kept == "directory":
        (directory / INCARNATION_FILE).unlink()
        (directory / "incarnation.damaged").mkdir()
    else:
        os.rename(directory / INCARNATION_FILE, directory / "incarnation.damaged")
    with pytest.raises(CorruptStateError, match="recover"):
        Channel.open(config)
    repair(config.home)
    assert incarnation_file.read(directory).id not in (made, ORIGINAL)


# -- a recreate cut short keeps the operator's next offsets -----------------------------------

def test_a_recreate_cut_short_is_finished_by_the_operators_with_its_next_offsets(
        tmp_path: Path) -> None:
    """Killed between writing the pending incarnation and settling it: no other open
    settles it (it counts as missing), so the operator's retry still applies its next
    offset."""
    config, checkpointed, real_end = _vanished_after_old_checkpoint(tmp_path)
    directory = config.partition_dir(1)
    directory.mkdir()
    pending = incarnation_file.begin(directory)
    assert Channel.missing_places(config) == [directory]
    with pytest.raises(StorageMissingError):
        Channel.open(config, create=False)
    with pytest.raises(ChannelGoneError, match="recreate cut short"):
        ChannelOwner.open(config, create=False)
    assert incarnation_file.read(directory).pending
    with Channel.open(config, existed=True, next_offsets={1: real_end}) as channel:
        part = channel.incarnations()[1]
        assert (part.incarnation, part.start_offset) == (pending.id, real_end)
    assert checkpointed < real_end and Channel.missing_places(config) == []


def test_verify_lists_the_directory_a_recreate_cut_short_left(tmp_path: Path) -> None:
    config, _, _ = _vanished_after_old_checkpoint(tmp_path)
    left = recreate_temp_dir(config.partition_dir(1))
    left.mkdir()
    found = verify_channel(config.home)
    assert any(f"partition 1: {left}: left by a recreate cut short" in note
               for note in found["notes"]), found["notes"]


def test_stat_says_a_recreate_cut_short_has_no_start_yet(tmp_path: Path) -> None:
    config, _, _ = _vanished_after_old_checkpoint(tmp_path)
    directory = config.partition_dir(1)
    directory.mkdir()
    pending = incarnation_file.begin(directory)
    out = io.StringIO()
    assert cli.main(["stat", str(directory)], out) == 0
    assert (f"recreated storage (id {pending.id}), start not recorded: recreate cut short"
            in out.getvalue()), out.getvalue()
    assert "from offset" not in out.getvalue()


def test_a_recreate_in_place_removes_an_earlier_recreates_temp_directory(
        tmp_path: Path) -> None:
    """A recreate killed before its rename left the temp one; the directory was then made
    again by someone, so the next recreate works in place: the temp one goes."""
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    directory = config.partition_dir(1)
    left = recreate_temp_dir(directory)
    left.mkdir()
    incarnation_file.begin(left)
    directory.mkdir()
    with Channel.open(config, existed=True) as channel:
        assert channel.incarnations()[1].start_offset == checkpointed
    assert not left.exists()
    assert not any(str(left) in note for note in verify_channel(config.home)["notes"])


def test_a_temp_directory_holding_more_than_its_file_is_left_alone(tmp_path: Path) -> None:
    config, _, _ = _vanished_after_old_checkpoint(tmp_path)
    directory = config.partition_dir(1)
    left = recreate_temp_dir(directory)
    left.mkdir()
    (left / "notes.txt").write_text("an operator's")
    directory.mkdir()
    with Channel.open(config, existed=True):
        pass
    assert (left / "notes.txt").is_file()


def _older_copy(made_at_ms: int, start: int, made_id: str = "cd" * 16) -> bytes:
    return incarnation_file.encode(incarnation_file.Incarnation(made_id, start, False,
                                                                made_at_ms))


def test_recover_puts_back_the_newest_stray_copy_not_the_first_by_name(
        tmp_path: Path) -> None:
    """`incarnation.1.stray` sorts before `incarnation.stray`: the time it was made decides."""
    config, made, checkpointed = _recreated(tmp_path)
    directory = config.partition_dir(1)
    current = incarnation_file.read(directory)
    os.rename(directory / INCARNATION_FILE, directory / "incarnation.stray")
    (directory / "incarnation.1.stray").write_bytes(_older_copy(current.made_at_ms - 60_000, 0))
    repair(config.home)
    saved = incarnation_file.read(directory)
    assert (saved.id, saved.start_offset) == (made, checkpointed)


def test_recover_refuses_stray_copies_that_disagree(tmp_path: Path) -> None:
    config, _, _ = _recreated(tmp_path)
    directory = config.partition_dir(1)
    current = incarnation_file.read(directory)
    os.rename(directory / INCARNATION_FILE, directory / "incarnation.stray")
    (directory / "incarnation.1.stray").write_bytes(_older_copy(current.made_at_ms, 0))
    with pytest.raises(ChannelEngineError, match="disagree"):
        repair(config.home)
    assert not (directory / INCARNATION_FILE).exists()  # nothing chosen


def test_recover_says_why_an_intact_stray_is_not_put_back_over_a_damaged_file(
        tmp_path: Path) -> None:
    config, made, _ = _recreated(tmp_path)
    directory = config.partition_dir(1)
    (directory / "incarnation.stray").write_bytes(_older_copy(1, 0))
    (directory / INCARNATION_FILE).write_bytes(b"torn")
    report = repair(config.home)
    why = next(r["why"] for r in report.rewritten
               if r["path"] == str(directory / INCARNATION_FILE))
    assert "the intact incarnation.stray left aside, not put back" in why
    assert incarnation_file.read(directory).id not in (made, "cd" * 16, ORIGINAL)

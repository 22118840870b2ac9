"""Only a partition of a channel that existed gets a new incarnation (log/incarnation.py,
home_files.existed_partitions): a partition no checkpoint copy records — a first open
after config.save(), a create or a raise of the partition count killed while making its
directory — is original, used as it is by any open; a partition a checkpoint records
that vanished still needs the operator's recreate, which gives it a new incarnation."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from channel_helpers import make_config
from test_incarnation import _put, _vanished_after_old_checkpoint

from channel_engine import Channel, ChannelConfig
from channel_engine.filenames import INCARNATION_FILE, LOCK_FILE
from channel_engine.incarnations import ORIGINAL
from channel_engine.log import incarnation as incarnation_file
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue.channel_owner import ChannelOwner


def _no_incarnation_files(config: ChannelConfig) -> bool:
    return not any((config.partition_dir(p) / INCARNATION_FILE).exists()
                   for p in range(config.partitions))


def _killed_while_making(config: ChannelConfig, partitions: range) -> None:
    """What an open killed after channel.json was saved and the directories of
    `partitions` made, before their first segment, leaves: a .lock alone in each."""
    config.save()
    for p in partitions:
        directory = config.partition_dir(p)
        directory.mkdir(parents=True)
        (directory / LOCK_FILE).touch()


def test_a_first_open_after_the_config_was_saved_makes_original_partitions(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=3)
    config.save()  # as tests/engine/channel_worker.py and an operator's script do
    with Channel.open(config) as channel:
        assert {p.incarnation for p in channel.incarnations()} == {ORIGINAL}
    assert _no_incarnation_files(config)


def test_a_killed_first_create_reopens_as_a_drain_would(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    _killed_while_making(config, range(2))
    assert Channel.missing_places(config) == []
    with Channel.open(config, create=False) as channel:  # a drain, cli_produce
        _put(channel, 4, "e")
        assert {p.incarnation for p in channel.incarnations()} == {ORIGINAL}
    assert _no_incarnation_files(config)


def test_a_killed_first_create_reopens_as_its_owner_would(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    _killed_while_making(config, range(2))
    ChannelOwner.open(config, create=False).close()  # an owner re-elected by a client
    with Channel.open(config) as channel:
        assert {p.incarnation for p in channel.incarnations()} == {ORIGINAL}
    assert _no_incarnation_files(config)


def test_a_killed_raise_of_the_partition_count_keeps_the_new_one_original(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1)
    with Channel.open(config) as channel:
        _put(channel, 3, "e")
    grown = make_config(tmp_path, partitions=2)
    _killed_while_making(grown, range(1, 2))
    assert Channel.missing_places(grown) == []
    with Channel.open(grown, create=False) as channel:
        assert {p.incarnation for p in channel.incarnations()} == {ORIGINAL}
    with Channel.open(grown) as channel:
        assert {p.incarnation for p in channel.incarnations()} == {ORIGINAL}
    assert _no_incarnation_files(grown)


def test_a_partition_only_the_backup_checkpoint_records_still_existed(
        tmp_path: Path) -> None:
    """Either copy says which partitions existed: a lost primary changes nothing."""
    config = make_config(tmp_path, partitions=2, use_dual_checkpoints=True,
                         backup_checkpoint_dir=str(tmp_path / "backup"))
    with Channel.open(config) as channel:
        _put(channel, 6, "e")
    (config.home / checkpoint_file.FILE_NAME).unlink()
    shutil.rmtree(config.partition_dir(1))
    config.partition_dir(1).mkdir()
    assert Channel.missing_places(config) == [config.partition_dir(1)]


def test_a_recreate_after_a_real_loss_still_gets_its_incarnation(tmp_path: Path) -> None:
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    config.partition_dir(1).mkdir()  # emptied, not gone
    assert Channel.missing_places(config) == [config.partition_dir(1)]
    with Channel.open(config, existed=True) as channel:
        part = channel.incarnations()[1]
        assert part.incarnation != ORIGINAL and part.start_offset == checkpointed


def test_an_unreadable_directory_is_not_taken_for_an_empty_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PermissionError or EIO listing it is for the open to report, not missing_places."""
    def refuse(path: object) -> list[str]:
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(incarnation_file.os, "listdir", refuse)
    assert incarnation_file.made_again(tmp_path) is False

"""Missing partition storage is no damage recover repairs (tools/missing_storage.py):
recover refuses before changing anything, naming the paths and the recreate command;
verify says what it is and what the operator does."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from test_incarnation import _vanished_after_old_checkpoint

from channel_engine import Channel, ChannelConfig
from channel_engine.errors import RepairRefusedError
from channel_engine.filenames import INCARNATION_FILE
from channel_engine.log import incarnation as incarnation_file
from channel_engine.tools import cli
from channel_engine.tools.recover import repair
from channel_engine.tools.verify import verify_channel


def _home_listing(config: ChannelConfig) -> list[str]:
    return sorted(os.listdir(config.home))


def test_recover_refuses_an_empty_directory_and_writes_nothing(tmp_path: Path) -> None:
    config, _, _ = _vanished_after_old_checkpoint(tmp_path)
    directory = config.partition_dir(1)
    directory.mkdir()  # a bare mount point
    before = _home_listing(config)
    with pytest.raises(RepairRefusedError, match="recreate_channel ch --yes") as refused:
        repair(config.home)
    assert str(directory) in str(refused.value) and "missing (empty)" in str(refused.value)
    assert os.listdir(directory) == [] and _home_listing(config) == before
    out = io.StringIO()
    assert cli.main(["recover", str(config.home)], out) != 0
    assert os.listdir(directory) == []


def test_recover_refuses_a_vanished_directory(tmp_path: Path) -> None:
    config, _, _ = _vanished_after_old_checkpoint(tmp_path)
    with pytest.raises(RepairRefusedError, match="mount its volume or put the directory"):
        repair(config.home)
    assert not config.partition_dir(1).exists()


def test_recover_leaves_a_recreate_cut_short_to_the_operators_next_offsets(
        tmp_path: Path) -> None:
    config, _, real_end = _vanished_after_old_checkpoint(tmp_path)
    directory = config.partition_dir(1)
    directory.mkdir()
    pending = incarnation_file.begin(directory)
    with pytest.raises(RepairRefusedError, match="recreate again with the same next"):
        repair(config.home)
    assert incarnation_file.read(directory) == pending  # not settled at the checkpoint
    with Channel.open(config, existed=True, next_offsets={1: real_end}) as channel:
        assert channel.incarnations()[1].start_offset == real_end


def test_verify_names_missing_storage_with_the_way_out(tmp_path: Path) -> None:
    config, _, _ = _vanished_after_old_checkpoint(tmp_path)
    directory = config.partition_dir(1)
    directory.mkdir()
    found = verify_channel(config.home)
    assert found["problems"] == [f"partition 1: {directory}: missing (empty): recreate "
                                 "(manage.py recreate_channel ch --yes); if it is the mount "
                                 "point of a volume not mounted, mount the volume instead"]
    assert found["partitions"][1] is None
    incarnation_file.begin(directory)
    found = verify_channel(config.home)
    assert any("partition 1:" in p and "recreate cut short: recreate again with the same "
               "next offsets" in p for p in found["problems"]), found["problems"]
    assert (directory / INCARNATION_FILE).is_file()


def test_recover_still_repairs_a_channel_with_all_its_storage(tmp_path: Path) -> None:
    config, _, _ = _vanished_after_old_checkpoint(tmp_path)
    with Channel.open(config, existed=True):  # the operator's recreate
        pass
    assert repair(config.home).channel == config.name

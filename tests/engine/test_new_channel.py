"""A new channel is made by Channel.create, the creator's word: it reports no missing
checkpoint and is healthy. An open that finds no checkpoint of a channel that existed (its
home wiped, its volume wiped) reports it and is not healthy until an operator acknowledges
it; the events the backup checkpoint knew of are counted lost."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from channel_helpers import make_config

from channel_engine import Channel, ChannelConfig, ChannelExistsError
from channel_engine.queue import checkpoint as checkpoint_file


def _fill(channel: Channel, events: int = 6, take: int = 2) -> None:
    with channel.put() as tx:
        for i in range(events):
            tx.put(b"e%d" % i, key=b"k%d" % i)
    with channel.take() as tx:
        assert len(tx.take(take)) == take


def _dual(tmp_path: Path) -> ChannelConfig:
    return make_config(tmp_path, partitions=2, use_dual_checkpoints=True,
                       backup_checkpoint_dir=str(tmp_path / "backup"))


def _wipe(config: ChannelConfig, data: bool) -> None:
    shutil.rmtree(config.home)
    if data:
        for directory in config.data_dirs:
            shutil.rmtree(directory)


def _state_records(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in status["losses"]["records"] if r["partition"] == -3]


def test_a_new_channel_reports_no_recovery_problem_and_is_healthy(tmp_path: Path) -> None:
    config = _dual(tmp_path)
    with Channel.create(config) as channel:
        status = channel.status()
        assert status["recovery"]["problems"] == [] and status["recovery"]["created"]
        assert (status["health"], status["losses"]["records"]) == ("healthy", [])
        # its first checkpoint is on disk at once: no later open finds none
        for place in (config.home, tmp_path / "backup"):
            assert checkpoint_file.read(place / checkpoint_file.FILE_NAME).partitions
    with Channel.open(config) as channel:
        status = channel.status()
        assert status["recovery"]["problems"] == [] and not status["recovery"]["created"]
        assert status["health"] == "healthy"


def test_create_refuses_where_a_channel_is_and_writes_nothing(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.create(config) as channel:
        _fill(channel)
        with pytest.raises(ChannelExistsError, match="owned by"):
            Channel.create(config)
    saved = (config.home / checkpoint_file.FILE_NAME).read_bytes()
    with pytest.raises(ChannelExistsError, match="channel.json"):
        Channel.create(config)
    assert (config.home / checkpoint_file.FILE_NAME).read_bytes() == saved
    other = make_config(tmp_path / "other", partitions=2)
    stray = other.partition_dir(1)
    stray.mkdir(parents=True)
    (stray / "00000000000000000000.log").write_bytes(b"x")
    with pytest.raises(ChannelExistsError, match=str(stray)):
        Channel.create(other)
    assert not (other.home / "channel.json").exists()


def test_a_wiped_home_of_a_channel_with_events_is_reported_until_acknowledged(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.create(config) as channel:
        _fill(channel, 6, 2)
    _wipe(config, data=False)  # the logs are left: their events are queued again
    for reopened in (False, True):  # recorded durably: a reopen is not healthy either
        with Channel.open(config) as channel:
            status = channel.status()
            problems = status["recovery"]["problems"]
            assert reopened or any("no valid checkpoint" in p for p in problems), problems
            assert len(_state_records(status)) == 1, status["losses"]
            assert status["health"] == "degraded" and "queue state" in status["health_reason"]
            assert status["events_untaken"] == 6  # the 2 taken come back: at least once
    with Channel.open(config) as channel:
        assert channel.acknowledge_losses() == 1
        assert channel.status()["health"] == "healthy"


def test_a_wiped_volume_counts_the_events_its_backup_checkpoint_knew_as_lost(
        tmp_path: Path) -> None:
    config = _dual(tmp_path)
    with Channel.create(config) as channel:
        _fill(channel, 6, 2)
    _wipe(config, data=True)  # the backup lives on another volume
    with Channel.open(config) as channel:
        status = channel.status()
        assert status["recovery"]["checkpoint_source"] == "backup"
        assert any("missing" in p for p in status["recovery"]["problems"])
        assert status["losses"]["events_lost"] == status["recovery"]["lost_events"] == 4
        assert status["health"] == "degraded"


def test_a_wiped_volume_is_reported_and_not_healthy_when_the_caller_knows_it_existed(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.create(config) as channel:
        _fill(channel)
    _wipe(config, data=True)
    with Channel.open(config, existed=True) as channel:  # the appliance's database knows
        status = channel.status()
        assert any("no valid checkpoint" in p for p in status["recovery"]["problems"])
        assert len(_state_records(status)) == 1 and status["health"] == "degraded"
    with Channel.open(config) as channel:  # still, after a restart
        assert channel.status()["health"] == "degraded"


def test_an_open_that_cannot_tell_new_from_wiped_still_reports_the_missing_checkpoint(
        tmp_path: Path) -> None:
    """Channel.open(create=True) on an empty place: a new channel, or a wiped one whose
    caller does not say; the report names the missing checkpoint either way."""
    with Channel.open(make_config(tmp_path)) as channel:
        problems = channel.status()["recovery"]["problems"]
        assert any("no valid checkpoint" in p for p in problems), problems


def _failing_first_checkpoint(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """The disk fails the first write of the checkpoint file (ENOSPC, EIO)."""
    import errno
    import os

    from channel_engine.queue import checkpoint as module

    real = module.write_atomically

    def failing(path: Path, data: bytes) -> None:
        if path.name == checkpoint_file.FILE_NAME:
            raise OSError(code, os.strerror(code), str(path))
        real(path, data)

    assert code in (errno.ENOSPC, errno.EIO)
    monkeypatch.setattr(module, "write_atomically", failing)


@pytest.mark.parametrize("code", [28, 5])  # ENOSPC, EIO
def test_a_create_whose_first_checkpoint_fails_leaves_nothing_to_block_a_retry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    config = _dual(tmp_path)
    _failing_first_checkpoint(monkeypatch, code)
    with pytest.raises(Exception, match="checkpoint") as failed:
        Channel.create(config)
    assert not isinstance(failed.value, ChannelExistsError)
    # nothing of it is left: not its directories (none were there), nor channel.json
    assert not any(tmp_path.iterdir()), sorted(tmp_path.rglob("*"))
    monkeypatch.undo()
    with Channel.create(config) as channel:  # the retry is a create like any other
        _fill(channel)
        status = channel.status()
        assert (status["recovery"]["problems"], status["health"]) == ([], "healthy")


def test_a_failed_create_keeps_the_directories_that_were_there_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(tmp_path, partitions=2)
    for place in (config.home, *map(Path, config.data_dirs)):
        place.mkdir(parents=True)  # an operator's mount points
    _failing_first_checkpoint(monkeypatch, 28)
    with pytest.raises(Exception, match="checkpoint"):
        Channel.create(config)
    for place in (config.home, *map(Path, config.data_dirs)):
        assert place.is_dir() and not any(place.iterdir()), sorted(place.iterdir())
    monkeypatch.undo()
    Channel.create(config).close()


def test_a_create_whose_owner_socket_fails_leaves_nothing_to_block_a_retry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from channel_engine.owner import server

    def no_socket(self: object) -> None:
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(server.OwnerServer, "start", no_socket)
    config = make_config(tmp_path, partitions=2)
    with pytest.raises(OSError, match="in use"):
        Channel.create(config)
    assert not any(tmp_path.iterdir()), sorted(tmp_path.rglob("*"))
    monkeypatch.undo()
    Channel.create(config).close()

"""A damaged (not missing) queue checkpoint with no readable copy: the open rebuilds the
queue from the logs, so takes committed before come back (delivered again). That is
recorded in the loss ledger (partition -3, cause state_damaged, bounded by the events the
rebuilt queue holds): health is degraded until an operator acknowledges it, across
reopens. One readable copy left: nothing comes back, nothing is recorded."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from channel_helpers import make_config

from channel_engine import Channel, ChannelConfig
from channel_engine.queue import checkpoint as checkpoint_file


def _channel(tmp_path: Path) -> ChannelConfig:
    """Dual checkpoints; 6 events put, 4 of them taken and committed; closed cleanly."""
    config = make_config(tmp_path, partitions=2, use_dual_checkpoints=True,
                         backup_checkpoint_dir=str(tmp_path / "backup"))
    with Channel.create(config) as channel:
        with channel.put() as tx:
            for i in range(6):
                tx.put(b"e%d" % i, key=b"k%d" % i)
        with channel.take() as tx:
            assert len(tx.take(4)) == 4
    return config


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the body: the CRC no longer matches
    path.write_bytes(bytes(data))


def _copies(config: ChannelConfig, tmp_path: Path) -> list[Path]:
    return [config.home / checkpoint_file.FILE_NAME,
            tmp_path / "backup" / checkpoint_file.FILE_NAME]


def _state_records(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in status["losses"]["records"] if r["partition"] == -3]


def test_both_copies_damaged_records_the_takes_that_may_come_back(tmp_path: Path) -> None:
    config = _channel(tmp_path)
    damaged = {}
    for path in _copies(config, tmp_path):
        _flip(path)
        damaged[path] = path.read_bytes()
    with Channel.open(config) as channel:
        status = channel.status()
        problems = status["recovery"]["problems"]
        assert any("no valid checkpoint" in p for p in problems), problems
        assert status["events_untaken"] == 6  # the 4 taken come back: at least once
        assert status["recovery"]["events_may_come_back_at_most"] == 6
        [record] = _state_records(status)
        assert record["cause"].startswith("state_damaged") and record["events"] == 0
        assert "up to 6 events may be delivered again" in record["cause"]
        assert str(_copies(config, tmp_path)[0]) in record["cause"]
        assert status["health"] == "degraded" and "checkpoints were damaged" in \
            status["health_reason"]
    for path, data in damaged.items():  # kept for the operator, never overwritten
        aside = path.with_name(path.name + ".damaged")
        assert aside.read_bytes() == data and str(aside) in record["cause"]
        assert checkpoint_file.read(path).sequence  # the open's own, new checkpoint
    with Channel.open(config) as channel:  # recorded durably: a reopen is not healthy
        status = channel.status()
        assert len(_state_records(status)) == 1 and status["health"] == "degraded"
        assert channel.acknowledge_losses() == 1
        assert channel.status()["health"] == "healthy"


def test_one_readable_copy_left_records_nothing(tmp_path: Path) -> None:
    config = _channel(tmp_path)
    _flip(_copies(config, tmp_path)[0])
    with Channel.open(config) as channel:
        status = channel.status()
        assert status["recovery"]["checkpoint_source"] == "backup"
        assert status["events_untaken"] == 2  # no committed take comes back
        assert (_state_records(status), status["health"]) == ([], "healthy")

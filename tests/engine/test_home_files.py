"""A channel home's strangers: a writable open moves them aside (never deleting them) and
reports them; read-only opens and the engine's own files are left alone."""
from __future__ import annotations

from pathlib import Path

import pytest
from channel_helpers import make_config

from channel_engine import Channel, ChannelConfig, ConfigError
from channel_engine.filenames import is_kept_aside as kept_aside
from channel_engine.queue.home_files import find_strays, not_regular
from channel_engine.tools.recover import repair
from channel_engine.tools.verify import verify_channel


def test_it_moves_a_stray_aside_at_open_and_reports_it(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as channel, channel.put() as tx:
        tx.put(b"kept")
    (config.home / "notes.txt").write_text("an operator's")
    (config.home / "checkpoint.orig").write_bytes(b"")
    with Channel.open(config) as channel:
        problems = channel.status()["recovery"]["problems"]
        assert [p for p in problems if "stray" in p] == [
            f"{config.home / name}: a stray file the engine did not write, moved aside to "
            f"{config.home / name}.stray" for name in ("checkpoint.orig", "notes.txt")]
        assert channel.status()["events_untaken"] == 1
    assert (config.home / "notes.txt.stray").read_text() == "an operator's"
    assert find_strays(config.home, config).strays == []


def test_it_leaves_the_engines_files_kept_aside_files_and_directories_alone(
        tmp_path: Path) -> None:
    config = make_config(tmp_path)
    Channel.open(config).close()
    (config.home / "losses.json.damaged-17").write_text("{")
    (config.home / "mount").mkdir()
    found = find_strays(config.home, config)
    assert found.strays == [] and len(found.notes) == 2
    assert kept_aside("checkpoint.damaged") and kept_aside("x.stray")
    assert not kept_aside("checkpoint")


def test_a_drain_id_being_made_is_not_a_stranger(tmp_path: Path) -> None:
    """A drain makes the channel's id through a temp file of its own while another process
    may open the channel: moving that file aside failed the drain (a Kafka sink's first
    run, as a producer's process opened the channel)."""
    config = make_config(tmp_path)
    Channel.open(config).close()
    (config.home / "export.id.0123abcd.tmp").write_text("{}")
    (config.home / "export.id.nothex!.tmp").write_text("{}")
    found = find_strays(config.home, config)
    assert found.strays == [config.home / "export.id.nothex!.tmp"]
    assert any("export.id.0123abcd.tmp" in note for note in found.notes)


def test_a_read_only_open_moves_nothing(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    Channel.open(config).close()
    (config.home / "notes.txt").write_text("x")
    with Channel.open(config, read_only=True):
        pass
    assert (config.home / "notes.txt").exists()


@pytest.mark.parametrize("name", ["channel.json", "checkpoint", "losses.json", "backup"])
def test_a_directory_in_place_of_an_engine_file_is_moved_aside_and_the_file_written(
        tmp_path: Path, name: str) -> None:
    config = make_config(tmp_path, use_dual_checkpoints=True,
                         backup_checkpoint_dir=str(tmp_path / "backup"))
    with Channel.open(config) as channel, channel.put() as tx:
        tx.put(b"kept")
    path = (tmp_path / "backup" / "checkpoint" if name == "backup"
            else config.home / name)
    if path.exists():
        path.unlink()
    (path / "inside").mkdir(parents=True)
    assert not_regular(config) == [path]
    with Channel.open(config) as channel:  # the appliance's config, as channel_tool has it
        problems = channel.status()["recovery"]["problems"]
        assert f"{path}: not a regular file, moved aside to {path}.stray; the engine " \
               "writes a new one" in problems
        assert channel.status()["events_untaken"] == 1
        if name == "losses.json":
            channel.acknowledge_losses()  # the ledger writes its file when it changes
    assert (path.with_name(path.name + ".stray") / "inside").is_dir()  # never deleted
    if name != "losses.json":
        assert path.is_file()
    assert not_regular(config) == []
    assert verify_channel(config.home)["ok"], verify_channel(config.home)["problems"]


def test_recover_moves_a_directory_in_place_of_the_backup_checkpoint_aside(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, use_dual_checkpoints=True,
                         backup_checkpoint_dir=str(tmp_path / "backup"))
    Channel.open(config).close()
    path = tmp_path / "backup" / "checkpoint"
    path.unlink()
    path.mkdir()
    assert not verify_channel(config.home)["ok"]
    report = repair(config.home)
    assert {"path": str(path), "kept_as": f"{path}.stray",
            "why": "not a regular file (the engine writes a new one)"} in report.moved_aside
    assert path.is_file() and verify_channel(config.home)["ok"]


def test_an_open_with_the_config_keeps_a_damaged_channel_json_aside(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    Channel.open(config).close()
    path = config.home / "channel.json"
    path.write_text(path.read_text().replace('"capacity": 1000000', '"capacity": 1000001'))
    with pytest.raises(ConfigError, match=f"{path}: settings do not match"):
        Channel.open(config.home)
    Channel.open(config).close()
    assert "1000001" in (config.home / "channel.json.damaged").read_text()
    assert ChannelConfig.load(config.home) == config

"""A channel home's strangers: a writable open moves them aside (never deleting them) and
reports them; read-only opens and the engine's own files are left alone."""
from __future__ import annotations

from pathlib import Path

from channel_helpers import make_config

from channel_engine import Channel
from channel_engine.home_files import find_strays, kept_aside


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


def test_a_read_only_open_moves_nothing(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    Channel.open(config).close()
    (config.home / "notes.txt").write_text("x")
    with Channel.open(config, read_only=True):
        pass
    assert (config.home / "notes.txt").exists()

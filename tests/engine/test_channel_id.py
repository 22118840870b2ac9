"""channel_id.py: a channel's drain id, made once and kept; a damaged one stops the run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from channel_engine.channel_id import EXPORT_ID_FILE, channel_id
from channel_engine.errors import ExportError


def test_it_makes_the_id_once_and_keeps_it(tmp_path: Path) -> None:
    first = channel_id(tmp_path)
    assert channel_id(tmp_path) == first and len(first) == 32
    assert json.loads((tmp_path / EXPORT_ID_FILE).read_text()) == {
        "format": "weir-export-id", "version": 1, "id": first}


@pytest.mark.parametrize("text", ["{not json", '{"format": "weir-export-id", "version": 2,'
                                  ' "id": "ab"}', '["weir-export-id"]'])
def test_it_refuses_a_damaged_id_without_replacing_it(tmp_path: Path, text: str) -> None:
    (tmp_path / EXPORT_ID_FILE).write_text(text)
    with pytest.raises(ExportError, match=EXPORT_ID_FILE):
        channel_id(tmp_path)
    assert (tmp_path / EXPORT_ID_FILE).read_text() == text


def test_drains_starting_at_once_agree_on_one_id(tmp_path: Path) -> None:
    # the export and the Kafka sink may make the id at the same moment: never two ids
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: channel_id(tmp_path), range(64)))
    assert len(ids) == 1
    assert [p.name for p in tmp_path.iterdir()] == [EXPORT_ID_FILE]  # no temp file left


def test_a_temp_file_moved_away_before_its_link_is_written_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    real_link, moved = os.link, []

    def link_after_a_sweep(src: str, dst: str) -> None:
        if not moved:  # as an older engine's open moved a stranger aside
            moved.append(Path(src).rename(Path(src).with_name(Path(src).name + ".stray")))
        real_link(src, dst)
    monkeypatch.setattr(os, "link", link_after_a_sweep)
    made = channel_id(tmp_path)
    assert len(moved) == 1 and channel_id(tmp_path) == made

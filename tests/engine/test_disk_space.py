"""The disk guard names the short directory and the numbers."""
from __future__ import annotations

from pathlib import Path

import pytest

from channel_engine.disk_space import check_free_space, free_bytes
from channel_engine.errors import DiskSpaceError


def test_it_reads_real_free_space(tmp_path: Path) -> None:
    assert free_bytes(tmp_path) > 0


def test_it_passes_when_every_dir_has_room(tmp_path: Path) -> None:
    check_free_space([tmp_path, tmp_path], 1, lambda d: 10)
    check_free_space([tmp_path], 0, lambda d: 0)  # 0 turns the guard off


def test_it_names_the_first_short_dir_and_the_numbers(tmp_path: Path) -> None:
    full = tmp_path / "full"
    free = {tmp_path: 1_000_000, full: 4_096}
    with pytest.raises(DiskSpaceError) as caught:
        check_free_space([tmp_path, full], 500_000, free.__getitem__)
    error = caught.value
    assert (error.directory, error.free, error.required) == (str(full), 4_096, 500_000)
    assert "4096 bytes free, below minimum_required_space=500000" in str(error)


def test_it_refuses_on_a_real_filesystem_asking_for_more_than_exists(tmp_path: Path) -> None:
    with pytest.raises(DiskSpaceError):
        check_free_space([tmp_path], free_bytes(tmp_path) * 4 + 1)

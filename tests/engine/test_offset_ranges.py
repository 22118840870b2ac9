"""offset_ranges.py: the export's offset ranges [start, end), merged and subtracted."""
from __future__ import annotations

from channel_engine.offset_ranges import merge, subtract


def test_it_merges_touching_and_overlapping_ranges_in_order() -> None:
    assert merge([(20, 30), (0, 10), (10, 15), (25, 40), (50, 60)]) == [
        (0, 15), (20, 40), (50, 60)]
    assert merge([]) == []


def test_it_subtracts_what_is_done_leaving_the_gaps() -> None:
    assert subtract((0, 100), [(10, 20), (50, 60)]) == [(0, 10), (20, 50), (60, 100)]
    assert subtract((0, 100), [(0, 100)]) == []
    assert subtract((10, 20), [(0, 5), (30, 40)]) == [(10, 20)]
    assert subtract((10, 20), [(0, 15)]) == [(15, 20)]

"""output_layout.py without Spark: time paths as Spark patterns, pieces and their bounds."""
from __future__ import annotations

import pytest

from channel_engine.errors import ExportError
from channel_engine.spark.export_settings import ExportSettings
from channel_engine.spark.output_layout import PIECE_ROWS, Pieces, piece_rows, spark_pattern


def test_it_turns_flume_escapes_into_a_spark_pattern_with_quoted_literals() -> None:
    assert spark_pattern("%Y/%m/%d/%H") == "yyyy'/'MM'/'dd'/'HH"
    assert spark_pattern("day=%j/it's") == "'day='DDD'/it''s'"


def test_it_refuses_an_unknown_escape() -> None:
    with pytest.raises(ValueError, match="unknown escape %q"):
        spark_pattern("%Y/%q")


def test_it_bounds_a_piece_by_the_range_and_the_next_multiple() -> None:
    pieces = Pieces(10, [(0, (5, 32)), (1, (0, 10))])
    assert pieces.bounds(0, 5) == (5, 9)  # a range's first piece starts at the range
    assert pieces.bounds(0, 20) == (20, 29)
    assert pieces.bounds(0, 30) == (30, 31)  # its last piece ends with the range
    assert pieces.bounds(1, 0) == (0, 9)
    with pytest.raises(ExportError, match="partition 1: chunk 10 lies in no range"):
        pieces.bounds(1, 10)


def test_it_sizes_pieces_by_rows_bytes_and_the_task_cap() -> None:
    status = {"partitions": [
        {"log_start_offset": 0, "log_end_offset": 100, "size_bytes": 10_000},  # 100 B each
        {"log_start_offset": 5, "log_end_offset": 5, "size_bytes": 0}]}
    settings = ExportSettings("home", "file:///out", roll_rows=1_000, roll_bytes=50 << 10)
    assert piece_rows(settings, status) == 512  # 50 KiB of 100-byte events
    settings = ExportSettings("home", "file:///out", roll_rows=300)
    assert piece_rows(settings, status) == 300
    settings = ExportSettings("home", "file:///out")
    assert piece_rows(settings, status) == PIECE_ROWS

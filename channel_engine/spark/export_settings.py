"""What one export run is told to do: ExportSettings, each setting with its default and
its validation; a bad value is a ValueError naming it. The job's command line (export.py,
where appliance/exports.py passes a channel row's export settings) is turned into one.
"""
from __future__ import annotations

from dataclasses import dataclass

from channel_engine import DEFAULT_SUBSCRIPTION, check_subscription_name
from channel_engine.spark.file_formats import (
    FORMATS,
    MAX_OPEN_FILES,
    MAX_OPEN_FILES_LIMIT,
    check_schema_version,
)
from channel_engine.spark.output_layout import spark_pattern


@dataclass
class ExportSettings:
    """What one export run does (from the CLI, or from the appliance's channel row)."""

    home: str
    output: str
    format: str = "parquet"
    path: str = "%Y/%m/%d/%H"
    roll_rows: int = 1_000_000  # the most events in one file
    max_events: int = 10_000_000
    read_url: str | None = None  # executors read over the appliance's HTTP API
    read_token: str | None = None
    roll_bytes: int = 256 << 20  # the most log bytes of events in one file (estimated)
    progress_s: float = 2.0  # a progress line this often while Spark writes
    subscription: str = DEFAULT_SUBSCRIPTION  # the queue it drains (made at earliest if new)
    # the columns' layout (file_formats.py); None: that of the files in the folders of
    # `path` (commit records), else of the output's newest commit record, else
    # file_formats.LATEST_SCHEMA (exporter.py: another version than the folders hold is
    # refused)
    schema_version: int | None = None
    # the most files one Spark task holds open; None: the format's (MAX_OPEN_FILES)
    max_open_files: int | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {self.format!r}")
        if not 1 <= self.roll_rows <= 2**31 - 1:
            raise ValueError(f"roll_rows must be from 1 to 2**31-1, not {self.roll_rows}")
        if not 1 << 10 <= self.roll_bytes <= 1 << 40:
            raise ValueError(f"roll_bytes must be from 1 KiB to 1 TiB, not {self.roll_bytes}")
        if not 0.05 <= self.progress_s <= 3600:
            raise ValueError(f"progress_s must be from 0.05 to 3600, not {self.progress_s}")
        if not 1 <= self.max_events <= 2**40:
            raise ValueError(f"max_events must be positive, not {self.max_events}")
        spark_pattern(self.path)  # raises on an unknown escape
        check_subscription_name(self.subscription)
        if self.schema_version is not None:
            check_schema_version(self.schema_version)
        if self.max_open_files is not None and \
                not 1 <= self.max_open_files <= MAX_OPEN_FILES_LIMIT:
            raise ValueError(f"max_open_files must be from 1 to {MAX_OPEN_FILES_LIMIT}, not "
                             f"{self.max_open_files}")

    @property
    def open_files(self) -> int:
        """The most files one Spark task of the run holds open at once."""
        return self.max_open_files or MAX_OPEN_FILES[self.format]

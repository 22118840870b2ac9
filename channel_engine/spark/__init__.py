"""Spark jobs over Weir channels: the "weir" data source (source.py) and the exactly-once
export: the job (export.py, its entry point) and its parts, one job each (exporter.py, the
protocol; output_layout.py, commit_records.py, file_formats.py, export_settings.py,
export_report.py, export_lock.py, dfs.py; export_driver.py, a warm driver running the
job, and driver_protocol.py, how it is asked; the channel's id and offset ranges are the
engine's: channel_id.py, offset_ranges.py, shared with the Kafka sink).

WeirSource and register are loaded on first use, so importing this package (as the
appliance does for file_formats.py's and output_layout.py's names) does not import PySpark.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from channel_engine.spark.source import WeirSource, register

__all__ = ["WeirSource", "register"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from channel_engine.spark import source

        return getattr(source, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

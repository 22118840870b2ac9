"""Spark jobs over Weir channels: the "weir" data source (source.py) and the exactly-once
export (export.py).

WeirSource and register are loaded on first use, so importing this package (as the
appliance does for export.py's constants) does not import PySpark.
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

"""The one place where a Channel row becomes the engine's ChannelConfig, and where
this process keeps its open engine channels.

to_config() checks a row the way the engine does (every setting, naming the
field) plus what only the appliance knows: directories must lie inside
WEIR_DATA_ROOT. open_channel() opens each channel once per process (as its
owner or as a client of the owner, see channel_engine/channel.py) and reopens
it when its row changed; after fork (gunicorn, Celery prefork) the child opens
its own.
"""
from __future__ import annotations

import atexit
import os
import re
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError

from appliance.models import Channel
from channel_engine import Channel as EngineChannel
from channel_engine import ChannelConfig, ConfigError

SETTINGS = tuple(ChannelConfig.__dataclass_fields__)
# Settings only the appliance uses (the scheduler's), with their allowed range.
SCHEDULE_SETTINGS = {"retention_check_interval_ms": (1_000, 86_400_000),
                     "export_interval_ms": (10_000, 7 * 86_400_000),
                     "export_roll_rows": (1, 2**31 - 1),
                     "export_roll_bytes": (1 << 10, 1 << 40)}
EXPORT_SETTINGS = ("export_format", "export_path")
_open: dict[str, tuple[Any, EngineChannel]] = {}  # name -> ((pk, updated_at), channel)
_open_pid = os.getpid()
_lock = threading.Lock()


def to_config(row: Channel) -> ChannelConfig:
    """The engine's config for a row; ValidationError naming the field if it is wrong."""
    values = {name: getattr(row, name) for name in SETTINGS}
    values["data_dirs"] = tuple(values["data_dirs"] or ())
    try:
        config = ChannelConfig(**values)
    except ConfigError as exc:
        raise ValidationError({exc.field: exc.reason}) from exc
    except TypeError as exc:
        raise ValidationError({"__all__": str(exc)}) from exc
    _check_roots(config)
    for name, (low, high) in SCHEDULE_SETTINGS.items():
        value = getattr(row, name)
        if value is None and name == "export_interval_ms":
            continue
        if type(value) is not int or not low <= value <= high:
            raise ValidationError({name: f"must be an integer from {low} to {high}"})
    _check_export(row)
    return config


# One directory of export_path: Flume's %-escapes and characters every filesystem Spark
# writes to (local, HDFS, S3) takes as they are; never "-" first (it would read as an
# option of the export job's command line) nor "." first (hidden, or "..").
_EXPORT_DIR = r"(?:%[YmdHMSyj]|[A-Za-z0-9_=+])(?:%[YmdHMSyj]|[A-Za-z0-9._=+-])*"
EXPORT_PATH = rf"^{_EXPORT_DIR}(?:/{_EXPORT_DIR})*/?$"  # for the OpenAPI schema too


def _check_export(row: Channel) -> None:
    from channel_engine.spark.export import FORMATS, spark_pattern

    if row.export_format not in FORMATS:
        raise ValidationError({"export_format": f"must be one of {', '.join(FORMATS)}"})
    path = row.export_path
    try:
        if not isinstance(path, str) or not path.strip("/"):
            raise ValueError("must be a non-empty relative path")
        if path.startswith("/") or ".." in path.split("/"):
            raise ValueError("must stay under the channel's export directory")
        for part in path.removesuffix("/").split("/"):
            if not re.fullmatch(_EXPORT_DIR, part):
                spark_pattern(part)  # names an unknown escape first
                raise ValueError(f"directory {part!r}: use letters, digits, _ = + . - and "
                                 "%-escapes, not starting with '-' or '.'")
    except ValueError as exc:
        raise ValidationError({"export_path": str(exc).removeprefix("path: ")}) from exc


def _check_roots(config: ChannelConfig) -> None:
    roots = [Path(root).resolve() for root in settings.WEIR_DATA_ROOTS]
    places = [("data_dirs", d) for d in config.data_dirs]
    places.append(("checkpoint_dir", config.checkpoint_dir))
    if config.backup_checkpoint_dir:
        places.append(("backup_checkpoint_dir", config.backup_checkpoint_dir))
    for field, directory in places:
        resolved = Path(directory).resolve()
        if not any(resolved == root or root in resolved.parents for root in roots):
            allowed = ", ".join(str(root) for root in roots)
            raise ValidationError({field: f"{directory} is outside WEIR_DATA_ROOT ({allowed})"})


def open_channel(row: Channel) -> EngineChannel:
    """This process's engine channel for a row, opened on first use or after a change."""
    global _open_pid
    with _lock:
        if os.getpid() != _open_pid:  # forked: the parent's handles are not ours
            _open.clear()
            _open_pid = os.getpid()
        known = _open.get(row.name)
        version = (row.pk, row.updated_at)  # a deleted and recreated channel is another
        if known is not None and known[0] == version:
            return known[1]
        if known is not None:
            known[1].close()  # writes nothing if the channel was deleted (ChannelGoneError)
        channel = EngineChannel.open(to_config(row))
        _open[row.name] = (version, channel)
        return channel


def close_channel(name: str) -> None:
    """Close this process's handle on a channel (before deleting it, say)."""
    with _lock:
        known = _open.pop(name, None)
    if known is not None:
        known[1].close()


def close_all() -> None:
    """Close every channel this process opened (tests, shutdown)."""
    with _lock:
        known = list(_open.values())
        _open.clear()
    for _, channel in known:
        channel.close()


atexit.register(close_all)  # a worker that exits normally checkpoints and hands over cleanly

"""The one place where a Channel row becomes the engine's ChannelConfig, and where
this process keeps its open engine channels.

to_config() checks a row the way the engine does (every setting, naming the
field) plus what only the appliance knows: directories lie inside WEIR_DATA_ROOT
and clear of the appliance's own files (appliance.channel_dirs; the checks against
other channels need the database and run in appliance.manage_channels), and the key
file is a name in WEIR_KEY_DIR, made a path here (appliance.keys). open_channel()
opens each channel once per process (as its owner or as a client of the owner, see
channel_engine/channel.py) and reopens it when its row changed; after fork
(gunicorn, Celery prefork) the child opens its own.
"""
from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from django.core.exceptions import ValidationError

from appliance import channel_dirs, keys
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
    if values["encryption_key_file"] is not None:
        values["encryption_key_file"] = str(keys.key_path(values["encryption_key_file"]))
    try:
        config = ChannelConfig(**values)
    except ConfigError as exc:
        raise ValidationError({exc.field: exc.reason}) from exc
    except TypeError as exc:
        raise ValidationError({"__all__": str(exc)}) from exc
    channel_dirs.check_paths(config)
    keys.check_keys(config)
    for name, (low, high) in SCHEDULE_SETTINGS.items():
        value = getattr(row, name)
        if value is None and name == "export_interval_ms":
            continue
        if type(value) is not int or not low <= value <= high:
            raise ValidationError({name: f"must be an integer from {low} to {high}"})
    _check_export(row)
    return config


def _check_export(row: Channel) -> None:
    from channel_engine.spark.export import FORMATS, spark_pattern

    if row.export_format not in FORMATS:
        raise ValidationError({"export_format": f"must be one of {', '.join(FORMATS)}"})
    try:
        if not isinstance(row.export_path, str) or not row.export_path.strip("/"):
            raise ValueError("path: must be a non-empty relative path")
        if ".." in row.export_path.split("/") or row.export_path.startswith("/"):
            raise ValueError("path: must stay under the channel's export directory")
        spark_pattern(row.export_path)
    except ValueError as exc:
        raise ValidationError({"export_path": str(exc).removeprefix("path: ")}) from exc


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

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

A deleted or recreated channel is let go of in every process at once, requests or
not: a process that has channels open runs the row cache's generation watch
(appliance/row_cache.py: one thread per process, which reads the shared generation that
every save or delete of a channel replaces, every WEIR_CHANNEL_WATCH_S, 0.5 s; 0 turns
it off), and this module's channel watcher, called with each reading in that thread,
asks the database which of its open channels still exist as the rows it opened when the
generation changed (or every row_cache.MAX_AGE_S, or every tick while the generation
cannot be read).
It reads on a database connection of its own, so a row saved in a transaction not yet
committed (the API's create opens the channel before its commit; a test's transaction)
is not there for it: a handle opened inside a transaction is left alone until that
transaction commits, or ends without committing (rolled back: its row is gone for good).
A handle whose row is gone or was recreated (another pk) is closed: an owner releases
the lock and its files (the deleted files' space is freed), a client its connection. A
changed row of the same pk is reopened by the next request that reads it, as before. A
handle is only ever opened for a row that still exists (ChannelGoneError otherwise), its
directories made only by the API's create and change or, for a row without files, under
channel_dirs.lock() after checking the row again (never by an open racing a delete, nor
by the engine's re-election of an owner: see channel_engine/channel.py), and deleted()
tells a view whether an engine error came from a channel deleted under its request,
which the API answers with 404 like any channel that does not exist. Only the create
(manage_channels) makes a channel (Channel.create: it reports nothing missing).

Storage that vanished. A row whose channel's files are missing (its home or channel.json,
a partition directory, or one found empty: Channel.missing_places) is never made again by
an open: a volume not mounted (yet, or for a moment) would get a fresh, empty channel
written on the root filesystem, hidden once the volume is back. The open raises
StorageMissing naming the missing paths instead, and writes nothing: puts, takes and
reads answer 503 channel-storage-missing, the channel list and /metrics show the channel
unhealthy with the reason, its page says what to do. Nothing is read either, even where
one of several data dirs is intact: the engine opens a channel whole (a partition of it missing, it
cannot say what the checkpoint's positions mean), and every intact file stays untouched,
so a volume mounted again brings the channel back as it was, at its next request. Only the
operator's word makes it again, empty where files are missing (recreate_storage, behind
the API's, the UI's and manage.py's recreate): the engine is told the channel existed, so
the loss of what was missing is recorded in the loss ledger and health is degraded until
acknowledged. A partition directory made again is a new incarnation of the partition,
going on at the end its checkpoint knew, or higher at the operator's next offset
(next_offsets): the drains refuse offsets they had sent beyond that start
(channel_engine/incarnations.py).

status_of() is what views of many channels use (the channel list, /metrics, the
dashboard): a channel that cannot be opened or asked (its home unreadable, its key
file unusable, any error of the engine's open) gives its reason instead of a status,
and the others answer as usual.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from appliance import channel_dirs, keys, row_cache
from appliance.models import Channel
from channel_engine import Channel as EngineChannel
from channel_engine import (
    ChannelConfig,
    ChannelGoneError,
    ConfigError,
    LogDirectoryError,
    check_subscription_name,
)
from channel_engine.spark.file_formats import MAX_OPEN_FILES_LIMIT

SETTINGS = tuple(ChannelConfig.__dataclass_fields__)
# Settings only the appliance uses (the scheduler's), with their allowed range.
SCHEDULE_SETTINGS = {"retention_check_interval_ms": (1_000, 86_400_000),
                     "export_interval_ms": (10_000, 7 * 86_400_000),
                     "export_roll_rows": (1, 2**31 - 1),
                     "export_roll_bytes": (1 << 10, 1 << 40),
                     "export_max_open_files": (1, MAX_OPEN_FILES_LIMIT),
                     "kafka_interval_ms": (1_000, 86_400_000)}
# null: only when asked (an interval), the format's own (export_max_open_files)
OPTIONAL_SCHEDULES = ("export_interval_ms", "kafka_interval_ms", "export_max_open_files")
EXPORT_SETTINGS = ("export_format", "export_schema_version", "export_path",
                   "export_subscription")
KAFKA_SETTINGS = ("kafka_topic", "kafka_bootstrap", "kafka_subscription",
                  "kafka_partitioning", "kafka_compression", "kafka_create_topic",
                  "kafka_security_protocol", "kafka_sasl_mechanism", "kafka_sasl_username",
                  "kafka_sasl_password_file", "kafka_ssl_cafile", "kafka_ssl_certfile",
                  "kafka_ssl_keyfile")
# Every setting a create or a change may send, wherever it comes from: the API (POST,
# PATCH), the UI's forms, manage.py create_channel --set.
SETTABLE = frozenset(SETTINGS) | frozenset(SCHEDULE_SETTINGS) | frozenset(EXPORT_SETTINGS) \
    | frozenset(KAFKA_SETTINGS) | {"puts_paused"}
_open: dict[str, tuple[Any, EngineChannel]] = {}  # name -> ((pk, updated_at), channel)
_open_pid = os.getpid()
_lock = threading.Lock()
_seen: list[Any] = [None, 0.0]  # the generation close_stale() last ran under, when
# name -> (version, the opening thread's database connection, its on_commit hook) for a
# handle opened inside a transaction: its row may not be committed yet, so the watcher,
# which reads on a connection of its own, cannot tell "not yet there" from "deleted"
# (module doc).
_uncommitted: dict[str, tuple[Any, Any, Callable[[], None]]] = {}
log = logging.getLogger(__name__)
T = TypeVar("T")


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
        if value is None and name in OPTIONAL_SCHEDULES:
            continue
        if type(value) is not int or not low <= value <= high:
            raise ValidationError({name: f"must be an integer from {low} to {high}"})
    _check_export(row)
    _check_kafka(row, config)
    return config


def _check_kafka(row: Channel, config: ChannelConfig) -> None:
    """The Kafka sink's settings, checked as its job checks them (the field named)."""
    from appliance.kafka_sinks import sink_settings

    if row.kafka_interval_ms is not None and not row.kafka_topic:
        raise ValidationError({"kafka_interval_ms": "needs kafka_topic (the sink is off)"})
    sink_settings(row, config)  # ValidationError naming the kafka_ field


# One directory of export_path: Flume's %-escapes and characters every filesystem Spark
# writes to (local, HDFS, S3) takes as they are; never "-" first (it would read as an
# option of the export job's command line) nor "." first (hidden, or "..").
_EXPORT_DIR = r"(?:%[YmdHMSyj]|[A-Za-z0-9_=+])(?:%[YmdHMSyj]|[A-Za-z0-9._=+-])*"
EXPORT_PATH = rf"^{_EXPORT_DIR}(?:/{_EXPORT_DIR})*/?$"  # for the OpenAPI schema too


def _check_export(row: Channel) -> None:
    from channel_engine.spark.file_formats import FORMATS, SCHEMA_VERSIONS
    from channel_engine.spark.output_layout import spark_pattern

    if row.export_format not in FORMATS:
        raise ValidationError({"export_format": f"must be one of {', '.join(FORMATS)}"})
    if type(row.export_schema_version) is not int or \
            row.export_schema_version not in SCHEMA_VERSIONS:
        raise ValidationError({"export_schema_version": "must be one of "
                               f"{', '.join(map(str, SCHEMA_VERSIONS))}"})
    try:
        check_subscription_name(row.export_subscription)
    except ValueError as exc:
        raise ValidationError({"export_subscription": str(exc)}) from exc
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


class StorageMissing(Exception):
    """A channel's row is there and some of its files are not (module doc): nothing was
    opened or written."""

    def __init__(self, name: str, paths: list[Path]) -> None:
        self.name, self.paths = name, [str(p) for p in paths]
        super().__init__(f"channel {name!r}: its storage is missing: {', '.join(self.paths)} "
                         "(a volume not mounted, a directory removed or emptied, or a "
                         "recreate cut short); nothing is written there until then. "
                         f"{STORAGE_ADVICE}")


STORAGE_ADVICE = ("Mount the volume back (the channel comes back as it was), or recreate the "
                  "channel empty, recording the loss.")


class RecreateBlocked(StorageMissing):
    """A recreate found the channel owned by another process, which does not make missing
    files again (only an owner's own open does): nothing was made."""

    def __init__(self, name: str, paths: list[Path], owner_pid: int | None) -> None:
        super().__init__(name, paths)
        who = f"another process (pid {owner_pid})" if owner_pid else "another process"
        self.args = (f"{who} still has channel {name!r} open, so its missing files "
                     f"({', '.join(self.paths)}) were not made again. That "
                     "process must let go of the channel first: a web or task worker does at "
                     "its next request or task on the channel, any other process when it "
                     "stops. Then recreate it again.",)


def open_channel(row: Channel, create: bool = False, new: bool = False) -> EngineChannel:
    """This process's engine channel for a row, opened on first use or after a change;
    ChannelGoneError if the row was deleted (or its channel recreated) meanwhile,
    StorageMissing if its files are missing (module doc). `create` (the API's change,
    under channel_dirs.lock(), once its files were found there) makes missing directories;
    `new` (the create of manage_channels, under that lock) makes the channel
    (Channel.create)."""
    try:
        # a saved row's channel existed (made by its create): a change's open that finds
        # its files gone reports the lost state
        return _open_row(row, create or row.pk is None, new,
                         existed=row.pk is not None and not new)
    except ChannelGoneError:
        if create or new or row.pk is None or deleted(row):
            raise
    missing = EngineChannel.missing_places(to_config(row))
    if not missing:  # back meanwhile (a volume mounted again)
        return _open_row(row, False, existed=True)
    raise StorageMissing(row.name, missing)


def recreate_storage(row: Channel, next_offsets: dict[int, int] | None = None) -> list[Path]:
    """The operator's word: make a channel whose files are missing again, empty where they
    are missing, and open it; return what was missing (nothing: nothing done). The engine
    is told the channel existed, so it records the loss in the loss ledger. Under the
    directory lock, so never racing a delete. next_offsets: partition -> the offset a
    partition made again goes on at the least (a new incarnation: channel_engine/
    incarnations.py); ValidationError naming it for a partition whose files are there."""
    close_channel(row.name)
    with transaction.atomic():
        channel_dirs.lock()
        if deleted(row):
            raise ChannelGoneError(f"channel {row.name!r} was deleted")
        config = to_config(row)
        missing = EngineChannel.missing_places(config)
        there = sorted(p for p in next_offsets or {} if config.partition_dir(p) not in missing)
        if missing and there:
            raise ValidationError({"next_offsets": [
                f"partition {there[0]}: its directory {config.partition_dir(there[0])} is "
                "there; only a partition made again goes on at a next offset (move its "
                "directory aside first to recreate it)"]})
        handle = _open_row(row, True, existed=True, next_offsets=next_offsets) \
            if missing else None
    still = EngineChannel.missing_places(config)
    if still:  # another process owns it and makes nothing: it must let go first
        owner = _owner_pid(handle)
        close_channel(row.name)
        raise RecreateBlocked(row.name, still, owner)
    return missing


def _owner_pid(handle: EngineChannel | None) -> int | None:
    """The pid of the process owning a channel this process is a client of, if it says."""
    try:
        return None if handle is None else int(handle.status()["owner_pid"])
    except Exception:  # noqa: BLE001 -- only for the message: its owner may be going away
        return None


def _open_row(row: Channel, create: bool, new: bool = False, existed: bool = False,
              next_offsets: dict[int, int] | None = None) -> EngineChannel:
    global _open_pid
    with _lock:
        if os.getpid() != _open_pid:  # forked: the parent's handles are not ours
            _open.clear()
            _uncommitted.clear()
            _open_pid = os.getpid()
            _seen[0] = None  # the child's watcher checks its own handles at its first tick
        known = _open.get(row.name)
        version = (row.pk, row.updated_at)  # a deleted and recreated channel is another
        if known is not None and known[0] == version:
            return known[1]
        if known is not None:
            _close(known[1])
            del _open[row.name]
        if row.pk is not None and deleted(row):  # never resurrect a deleted channel's files
            raise ChannelGoneError(f"channel {row.name!r} was deleted")
        # not create: a delete may have removed the files since the check above
        channel = EngineChannel.create(to_config(row)) if new else \
            EngineChannel.open(to_config(row), create=create, existed=existed,
                               next_offsets=next_offsets)
        _open[row.name] = (version, channel)
        _uncommitted.pop(row.name, None)
        if connection.in_atomic_block:
            name = row.name

            def committed() -> None:
                _committed(name, version)
            _uncommitted[name] = (version, connections[DEFAULT_DB_ALIAS], committed)
            transaction.on_commit(committed)
    row_cache.watch()
    return channel


def _committed(name: str, version: Any) -> None:
    with _lock:
        if _uncommitted.get(name, (None,))[0] == version:
            del _uncommitted[name]


def _maybe_uncommitted(name: str, version: Any) -> bool:
    """Whether the handle was opened in a transaction that is still open or committing (call
    under _lock). One that ended without its on_commit hook was rolled back: its row is gone
    for good."""
    known = _uncommitted.get(name)
    if known is None or known[0] != version:
        return False
    _, opener, hook = known
    # Django leaves the atomic block before it commits: while the hook is still queued the
    # commit may be under way (a rollback empties the queue), and the watcher's own
    # connection would not see the row yet
    if opener.in_atomic_block or any(entry[1] is hook for entry in list(opener.run_on_commit)):
        return True
    del _uncommitted[name]
    return False


def status_of(row: Channel, segments: bool = False) -> tuple[dict[str, Any] | None, str]:
    """The engine's status of a channel, or None and why it cannot be had (whatever the
    open or the status raised: one broken channel must not break a page of them all)."""
    status, why, _ = status_detail(row, segments)
    return status, why


def status_detail(row: Channel, segments: bool = False
                  ) -> tuple[dict[str, Any] | None, str, list[str]]:
    """status_of, and the paths missing when the reason is storage missing (else [])."""
    return _asked(row, "status", lambda channel: channel.status(segments=segments))


def offsets_of(row: Channel) -> tuple[list[tuple[int, int]] | None, str]:
    """Each partition's (log start offset, last stable offset), or None and why (as
    status_of): what a reader of the channel may see, without its whole status."""
    offsets, why, _ = _asked(row, "offsets", lambda channel: channel.list_offsets())
    return offsets, why


def _asked(row: Channel, what: str, ask: Callable[[EngineChannel], T]
           ) -> tuple[T | None, str, list[str]]:
    try:
        return ask(open_channel(row)), "", []
    except ValidationError as exc:  # the row's settings are no longer allowed
        return None, "; ".join(exc.messages), []
    except StorageMissing as exc:  # expected until the operator acts: no traceback
        return None, str(exc), exc.paths
    except Exception as exc:
        log.warning("channel %r: no %s", row.name, what, exc_info=True)
        return None, f"{type(exc).__name__}: {exc}", []


def missing_storage(row: Channel) -> list[str]:
    """missing_now as text, for manage.py's recreate."""
    return [str(p) for p in missing_now(row)]


def deleted(row: Channel) -> bool:
    """Whether the row is gone from the database (deleted, or its channel recreated)."""
    return not Channel.objects.filter(pk=row.pk, name=row.name).exists()


def _close(channel: EngineChannel) -> None:
    try:
        channel.close()  # writes nothing if the channel was deleted (ChannelGoneError)
    except Exception:  # a handle on a deleted channel: nothing of it is worth keeping
        log.warning("closing channel %r failed", channel.name, exc_info=True)


def missing_now(row: Channel) -> list[Path]:
    """The row's channel files missing now (Channel.missing_places); none for a row whose
    settings are no longer allowed (its open says that)."""
    try:
        config = to_config(row)
    except ValidationError:
        return []
    return EngineChannel.missing_places(config)


def let_go_if_gone(row: Channel, exc: BaseException) -> list[Path]:
    """After an engine error on this process's handle of a row's channel: the files missing
    now. The handle is let go of when some are, or when the error says the channel went or
    was made again under it (ChannelGoneError), so that the next use opens it afresh and
    the operator's recreate is not refused for this process holding it; an error of a
    directory that is all there (read-only, permissions: LogDirectoryError) keeps it."""
    if not isinstance(exc, (ChannelGoneError, LogDirectoryError)):
        return []
    missing = missing_now(row)
    if missing or isinstance(exc, ChannelGoneError):
        close_channel(row.name)
    return missing


def close_channel(name: str) -> None:
    """Close this process's handle on a channel (before deleting it, say)."""
    with _lock:
        known = _open.pop(name, None)
        _uncommitted.pop(name, None)
    if known is not None:
        _close(known[1])


def _watcher(generation: bytes | None) -> None:
    """The channel watcher (module doc), called by the row cache's generation watch."""
    if generation is not None and generation == _seen[0] and \
            time.monotonic() - _seen[1] < row_cache.MAX_AGE_S:
        return
    _seen[:] = [generation, time.monotonic()]
    try:
        close_stale()
    except Exception:  # the database away: try again at the next tick
        log.warning("channel watcher: cannot check open channels", exc_info=True)
    finally:
        connection.close()  # the watch thread's own; reopened at its next check


def close_stale() -> list[str]:
    """Close this process's handles on channels whose row is gone or was recreated; return
    their names."""
    with _lock:
        if os.getpid() != _open_pid:
            return []
        opened = {name: version[0] for name, (version, _) in _open.items()
                  if not _maybe_uncommitted(name, version)}
    if not opened:
        return []
    live = dict(Channel.objects.filter(name__in=list(opened)).values_list("name", "pk"))
    stale = [name for name, pk in opened.items() if live.get(name) != pk]
    for name in stale:
        with _lock:
            known = _open.get(name)
            if known is None or known[0][0] != opened[name]:
                continue  # reopened meanwhile for the new row
            del _open[name]
        _close(known[1])
    return stale


def close_all() -> None:
    """Close every channel this process opened (tests, shutdown)."""
    with _lock:
        known = list(_open.values())
        _open.clear()
        _uncommitted.clear()
    for _, channel in known:
        _close(channel)


row_cache.subscribe(_watcher)
atexit.register(close_all)  # a worker that exits normally checkpoints and hands over cleanly

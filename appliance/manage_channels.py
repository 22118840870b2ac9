"""Channel management: create, change and delete a channel's record and files, for the
API (appliance/api/channels.py, channel.py), the UI and manage.py create_channel alike.

    create_channel(settings)     POST   /api/v1/channels
    change_channel(row, changes) PATCH  /api/v1/channels/{name}
    delete_channel(row, force)   DELETE /api/v1/channels/{name}?force=1
    recreate_channel(row, next_offsets)  POST /api/v1/channels/{name}/recreate

A refusal is Refused (errors by field, and the HTTP status the API answers it with:
appliance/api/handler.py makes it a problem; "error" is the key of what concerns no one
field). Creating needs an admin token for all channels (or a staff user); a token scoped
to channels may change and delete only those. Every create and change checks the
directories against every other channel under one lock (appliance.channel_dirs):
never the data root, the appliance's files, another channel's directory or one
nested with it; a new channel's directories are new or empty, and those it creates
are recorded as its own (Channel.owned_dirs).

A change is applied live: every process reopens its handle on the channel
when it sees the new settings, and ownership moves to a process that has
them (channel_engine/channel.py). Changes that would strand events are refused
with the reason: name, data_dirs and checkpoint_dir (the partition logs and the
home live there), fewer partitions (keys would move); any change while the channel's
files are missing (503 channel-storage-missing: its open would make them again).
Recreating a channel whose files are missing (appliance.channels, "Storage that vanished")
is the operator's explicit word, refused (409) when nothing is missing; it may name, per
partition made again, the offset it goes on at the least (next_offsets: above what a drain
sent beyond the channel's last checkpoint, which the drains refuse otherwise:
channel_engine/incarnations.py). A refused create or change
writes nothing: no record, and no directory it made is left. Deleting a channel
that holds untaken events is refused unless forced; a delete removes only the
directories the channel owns and no other channel uses (channel_dirs.removable).
The export drains a subscription of its own (export_subscription), and so does the Kafka
sink (kafka_subscription; scheduled: kafka_topic and kafka_interval_ms). Each is added when
its drain is scheduled (a create or change; else by the drain's first run) at "slowest",
where the subscription most behind stands, so that adding it never makes the channel
fuller (at "earliest" a log longer than the capacity would stop every put; a reset to
earliest is the operator's, on the channel page). When a drain's subscription changes,
the one it drained before is removed (never `default`, nor one the other drain reads):
nothing would drain it, and it would hold the channel's capacity; with takes open on it
the change is refused (409). An export folder never gets files of a second schema
version: appliance/export_schema.py refuses such a create or change (400); a change of
the schema version or the export path holds the channel's export-run lock while it is
checked and written, and is refused (409) while an export runs.
"""
from __future__ import annotations

import contextlib
import copy
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from appliance import channel_dirs, channels, exports
from appliance.export_schema import refuse_mixed_versions
from appliance.models import Channel
from channel_engine import (
    DEFAULT_SUBSCRIPTION,
    MAX_OFFSET,
    ChannelEngineError,
    ChannelExistsError,
    ConfigError,
    SubscriptionBusyError,
    SubscriptionExistsError,
)
from channel_engine import Channel as EngineChannel
from channel_engine.spark.path_overlap import folder

EXPORT_START = "slowest"  # where a new export subscription starts (module doc)

FIXED = {"name": "the partition directories are named after the channel",
         "data_dirs": "the partition logs live there",
         "checkpoint_dir": "the channel's home (channel.json, checkpoints, journals) lives "
                           "there"}
PATH_SETTINGS = ("data_dirs", "checkpoint_dir", "backup_checkpoint_dir")


class Refused(Exception):
    """A create, change or delete that was not done: errors by field, the HTTP status, and
    optionally the problem's slug and extension members (api/handler.py)."""

    def __init__(self, errors: dict[str, list[str]], status: int = 400,
                 slug: str | None = None, **extra: Any) -> None:
        super().__init__(errors)
        self.errors, self.status, self.slug, self.extra = errors, status, slug, extra


def _invalid(exc: ValidationError) -> Refused:
    return Refused({k: list(v) for k, v in exc.message_dict.items()})


def _cannot_open(name: str, exc: Exception) -> Refused:
    """The settings are valid but the disk cannot take them (say preallocate=true with more
    segment_bytes x partitions than there is free space): nothing is changed."""
    channels.close_channel(name)  # a handle closed on the way; the next use reopens it
    return Refused({"error": [f"channel {name!r} cannot be opened with these settings: "
                              f"{exc}"]}, status=503)


def _not_opened(row: Channel, exc: Exception, made: list[str]) -> Refused:
    """Why a create or change the engine could not open was refused; removes the
    directories it made (a refused create or change leaves nothing behind)."""
    name = row.name
    channels.close_channel(name)  # a handle opened on the way holds the files
    for directory in made:
        if isinstance(exc, ChannelExistsError):  # files of another are there: keep them
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        else:
            shutil.rmtree(directory, ignore_errors=True)
    if isinstance(exc, ConfigError):  # a setting only the open could judge
        return Refused({exc.field: [exc.reason]})
    if isinstance(exc, ChannelExistsError):
        return _exists(row, exc)
    return _cannot_open(name, exc)


def _exists(row: Channel, exc: ChannelExistsError) -> Refused:
    """A create that found a channel's files where the new one goes (put there after the
    directories were checked, or a channel of them still open elsewhere): 409 naming the
    path, under the setting whose directory holds it."""
    path = Path(exc.path).resolve()
    setting = next(("data_dirs" if name == "partitions" else name
                    for name, place in channel_dirs.dirs_of(row).own
                    if path.is_relative_to(place)), "error")
    return Refused({setting: [f"a channel's files are already at {exc.path} (nothing was "
                              "created): choose another directory, or delete that "
                              "channel first"]}, status=409, slug="channel-exists",
                   path=exc.path)


def create_channel(settings: dict[str, Any]) -> Channel:
    """Create a channel's record and files from typed settings, or raise Refused."""
    if Channel.objects.filter(name=settings.get("name")).exists():
        raise Refused({"name": ["a channel with this name exists"]}, status=409)
    row = Channel(**settings)
    made: list[str] = []
    try:
        channels.to_config(row)
        refuse_mixed_versions(row, None)
        with transaction.atomic():
            channel_dirs.lock()
            if Channel.objects.filter(name=row.name).exists():
                raise Refused({"name": ["a channel with this name exists"]}, status=409)
            channel_dirs.check_others(row)
            channel_dirs.fresh(row)
            made = row.owned_dirs = channel_dirs.missing(row)
            row.save()
            channels.open_channel(row, new=True)  # the files; an error rolls it back
            _follow_drains(row, None)
    except ValidationError as exc:
        raise _invalid(exc) from exc
    except (OSError, ChannelEngineError) as exc:
        raise _not_opened(row, exc, made) from exc
    return row


def change_channel(row: Channel, changes: dict[str, Any]) -> None:
    """Apply typed setting changes live, or raise Refused saying why (nothing changed)."""
    for field, why in FIXED.items():
        if field in changes and changes[field] != getattr(row, field):
            raise Refused({field: [f"cannot change: {why}; create a new channel to move "
                                   "it"]})
    if changes.get("partitions", row.partitions) < row.partitions:
        raise Refused({"partitions": [f"cannot shrink from {row.partitions}: keys would "
                                      "move and events be stranded"]})
    with _no_export_running(row, changes):
        _apply_change(row, changes)


@contextlib.contextmanager
def _no_export_running(row: Channel, changes: dict[str, Any]) -> Iterator[None]:
    """Hold the channel's export-run lock (exports.py) while a change of its schema version
    or export path is checked and written, so that no run starts with the old settings
    meanwhile; Refused (409, naming the field) while an export runs: its files, of the old
    settings, are not committed yet, so the check could not count them."""
    fields = [f for f in ("export_schema_version", "export_path") if f in changes
              and folder(str(changes[f])) != folder(str(getattr(row, f)))]
    if not fields:
        yield
        return
    busy = Refused({fields[0]: [f"an export of channel {row.name!r} is running: change "
                                f"{' and '.join(fields)} once it ends"]}, status=409)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(exports.held(
                channels.to_config(row).home / exports.LOCK_FILE, busy))
        except (FileNotFoundError, ValidationError):
            pass  # no home (its files missing) or settings refused: the change's checks say
        yield


def _apply_change(row: Channel, changes: dict[str, Any]) -> None:
    """Apply the checked-for-fixed-fields `changes` to `row` and the channel, or raise
    Refused with `row` as it was."""
    was = copy.copy(row)
    before = {field: getattr(row, field) for field in [*changes, "owned_dirs"]}
    for field, value in changes.items():
        setattr(row, field, value)
    made: list[str] = []
    try:
        channels.to_config(row)
        refuse_mixed_versions(row, was)
        with transaction.atomic():  # the change stands only if the channel opens with it
            channel_dirs.lock()
            _check_storage(was)
            channel_dirs.check_others(row)
            channel_dirs.fresh(row, was)
            made = [d for d in channel_dirs.missing(row) if d not in row.owned_dirs]
            row.owned_dirs = [*row.owned_dirs, *made]
            row.save()
            channels.open_channel(row, create=True)
            _follow_drains(row, was)
    except ValidationError as exc:
        _restore(row, before)
        raise _invalid(exc) from exc
    except SubscriptionBusyError as exc:  # a drain's old subscription has takes open
        _restore(row, before)
        field = ("kafka_subscription" if was.kafka_subscription != changes.get(
            "kafka_subscription", was.kafka_subscription) else "export_subscription")
        raise Refused({field: [str(exc)]}, status=409) from exc
    except channels.StorageMissing as exc:
        _restore(row, before)
        raise Refused({"error": [str(exc)]}, status=503, slug="channel-storage-missing",
                      paths=exc.paths) from exc
    except (OSError, ChannelEngineError) as exc:
        _restore(row, before)
        raise _not_opened(row, exc, made) from exc


def _check_storage(was: Channel) -> None:
    """Refuse a change of a channel whose files are missing: its open, which makes missing
    directories, would make them again without the operator's word."""
    try:
        config = channels.to_config(was)
    except ValidationError:
        return  # settings no longer allowed: the change's own checks say so
    missing = EngineChannel.missing_places(config)
    if missing:
        raise channels.StorageMissing(was.name, missing)


def recreate_channel(row: Channel, next_offsets: Any = None) -> list[Path]:
    """Make a channel whose files are missing again, empty, recording the loss (module
    doc); return the paths that were missing. Refused (409) when none is, (400) when
    `next_offsets` ({partition: offset}: where a partition made again goes on at the
    least) is malformed or names a partition whose files are there."""
    wanted = _next_offsets(row, next_offsets)
    try:
        missing = channels.recreate_storage(row, wanted)
    except ValidationError as exc:
        raise _invalid(exc) from exc
    if not missing:
        raise Refused({"error": [f"channel {row.name!r} has all its files: nothing to "
                                 "recreate"]}, status=409)
    return missing


def parse_next_offsets(text: str) -> dict[int, int]:
    """"P:N" pairs, separated by commas or spaces (manage.py's --next-offset, the UI's
    field), as {P: N}; Refused naming next_offsets when one is not such a pair."""
    wanted: dict[int, int] = {}
    for pair in text.replace(",", " ").split():
        partition, _, offset = pair.partition(":")
        if not (_digits(partition) and _digits(offset)):
            raise Refused({"next_offsets": [f"{pair!r}: give PARTITION:OFFSET, e.g. 1:5000"]})
        if int(partition) in wanted:
            raise Refused({"next_offsets": [f"partition {int(partition)} is given twice "
                                            f"({partition}:{wanted[int(partition)]} and "
                                            f"{pair}): give one next offset a partition"]})
        wanted[int(partition)] = int(offset)
    return wanted


def _digits(text: str) -> bool:
    """ASCII digits only: int() also takes '²' or '٣', and a sign or spaces."""
    return text.isascii() and text.isdigit()


def _next_offsets(row: Channel, value: Any) -> dict[int, int]:
    """A recreate's next offsets checked: {partition: offset} of the channel's partitions,
    offsets 0..MAX_OFFSET; Refused (400) naming next_offsets otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Refused({"next_offsets": ["an object of partition number: next offset"]})
    wanted: dict[int, int] = {}
    for key, offset in value.items():
        partition = int(key) if isinstance(key, int) or _digits(str(key)) else -1
        if not 0 <= partition < row.partitions:
            raise Refused({"next_offsets": [f"partition {key!r}: the channel has partitions "
                                            f"0 to {row.partitions - 1}"]})
        if partition in wanted:  # "1" and "01"
            raise Refused({"next_offsets": [f"partition {partition} is given twice: give "
                                            "one next offset a partition"]})
        if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
            raise Refused({"next_offsets": [f"partition {partition}: next offset {offset!r} "
                                            f"is not a whole number from 0 to {MAX_OFFSET}"]})
        wanted[partition] = offset
    return wanted


def _follow_drains(row: Channel, was: Channel | None) -> None:
    """After a create or change: each drain's subscription (the export's, the Kafka
    sink's) exists when the drain is scheduled, and the one it drained before is gone
    unless something else reads it (module doc)."""
    channel = channels.open_channel(row)
    names = channel.subscriptions()
    in_use = {DEFAULT_SUBSCRIPTION, row.export_subscription, row.kafka_subscription}
    drains = ((was.export_subscription if was else None, row.export_subscription,
               row.export_interval_ms is not None),
              (was.kafka_subscription if was else None, row.kafka_subscription,
               row.kafka_interval_ms is not None and bool(row.kafka_topic)))
    for before, now, scheduled in drains:
        if before is not None and before not in in_use and before in names:
            channel.remove_subscription(before)  # SubscriptionBusyError: the change is refused
        if scheduled and now not in names:
            try:
                channel.add_subscription(now, EXPORT_START)
            except SubscriptionExistsError:  # its job added it meanwhile
                pass
            names.append(now)


def _restore(row: Channel, before: dict[str, Any]) -> None:
    for field, value in before.items():
        setattr(row, field, value)


def delete_channel(row: Channel, force: bool) -> list[Path]:
    """Delete a channel's record and the directories it owns (channel_dirs.removable);
    return its directories left in place (not its own, or used by another channel).
    Refused (409) while events are untaken, unless forced. Forced, a channel the engine
    cannot open (its untaken events cannot be counted) goes too."""
    try:
        channels.to_config(row)
    except ValidationError as exc:
        if set(exc.message_dict) & set(PATH_SETTINGS):  # directories no longer allowed
            raise Refused({"error": ["not deleted: " + "; ".join(exc.messages)]},
                          status=409) from exc
    try:
        untaken = channels.open_channel(row).status()["events_untaken"]
    except (ChannelEngineError, OSError, ValidationError,
            channels.StorageMissing) as exc:  # a key file gone, say
        if not force:
            why = ("; ".join(exc.messages) if isinstance(exc, ValidationError)
                   else f"{type(exc).__name__}: {exc}")
            raise Refused({"error": [f"channel {row.name!r} cannot be opened ({why}), so "
                                     "its untaken events cannot be counted; delete with "
                                     "force (?force=true)"]}, status=409) from exc
        untaken = None
    if untaken and not force:
        raise Refused({"error": [f"channel {row.name!r} holds {untaken} untaken events; "
                                 "delete with force (?force=true) to drop them"]}, status=409)
    with transaction.atomic():
        channel_dirs.lock()
        places = [path for _, path in channel_dirs.dirs_of(row).own]
        row.delete()  # committed first: a put cut short by the closing below answers 404
    channels.close_channel(row.name)
    with transaction.atomic():  # removal under the lock, against the channels there are now
        channel_dirs.lock()
        trees, empties = channel_dirs.removable(row)
        channel_dirs.remove(trees, empties)
    return [path for path in places if path.exists() and path not in trees]

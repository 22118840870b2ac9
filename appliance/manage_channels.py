"""Channel management over the API (admin role).

    POST   /api/v1/channels                 create: the record and the files
    PATCH  /api/v1/channels/{name}          change settings
    DELETE /api/v1/channels/{name}?force=1  delete: the record and the files

Creating needs an admin token for all channels (or a staff user); a token scoped
to channels may change and delete only those. Every create and change checks the
directories against every other channel under one lock (appliance.channel_dirs):
never the data root, the appliance's files, another channel's directory or one
nested with it; a new channel's directories are new or empty, and those it creates
are recorded as its own (Channel.owned_dirs).

A change is applied live: every process reopens its handle on the channel
when it sees the new settings, and ownership moves to a process that has
them (channel_engine/channel.py). Changes that would strand events are refused
with the reason: name, data_dirs and checkpoint_dir (the partition logs and the
home live there), fewer partitions (keys would move). A refused create or change
writes nothing: no record, and no directory it made is left. Deleting a channel
that holds untaken events is refused unless forced; a delete removes only the
directories the channel owns and no other channel uses (channel_dirs.removable).
"""
from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channel_dirs, channels
from appliance.inspect import DETAIL, ChannelDetailView, ChannelListView, detail
from appliance.models import Channel
from appliance.permissions import allowed_everywhere
from appliance.produce import RequiredBodySchema, errors
from channel_engine import ChannelEngineError, ConfigError

SETTABLE = (set(channels.SETTINGS) | set(channels.SCHEDULE_SETTINGS)
            | set(channels.EXPORT_SETTINGS) | {"puts_paused"})
FIXED = {"name": "the partition directories are named after the channel",
         "data_dirs": "the partition logs live there",
         "checkpoint_dir": "the channel's home (channel.json, checkpoints, journals) lives "
                           "there"}
PATH_SETTINGS = ("data_dirs", "checkpoint_dir", "backup_checkpoint_dir")
FORCE_VALUES = ("",) + tuple(value for word in ("1", "0", "true", "false", "yes", "no")
                     for value in dict.fromkeys((word, word.capitalize(), word.upper())))


def _setting_schema(field: models.Field) -> dict[str, Any]:
    if field.name == "data_dirs":
        schema: dict[str, Any] = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    elif isinstance(field, models.BooleanField):
        schema = {"type": "boolean"}
    elif isinstance(field, models.IntegerField):  # BigIntegerField too
        schema = {"type": "integer"}
    else:
        schema = {"type": "string"}
        if field.choices:
            schema["enum"] = [value for value, _ in field.choices]
    if field.null:
        schema["nullable"] = True
    if field.help_text:
        schema["description"] = str(field.help_text)
    return schema


SETTING_SCHEMAS = {name: _setting_schema(Channel._meta.get_field(name))
                   for name in sorted(SETTABLE)}
SETTING_SCHEMAS["export_path"].update(pattern=channels.EXPORT_PATH, maxLength=200)
SETTING_SCHEMAS["name"].update(pattern=r"^[a-z0-9][a-z0-9_-]{0,199}$", maxLength=200)
CREATE_REQUEST = {"type": "object", "additionalProperties": False,
                  "required": ["name", "data_dirs", "checkpoint_dir"],
                  "properties": SETTING_SCHEMAS}
UPDATE_REQUEST = {"type": "object", "additionalProperties": False,
                  "properties": SETTING_SCHEMAS}
_TYPES = {"boolean": (bool,), "integer": (int,), "string": (str,), "array": (list,)}


def _type_error(field: str, value: Any) -> str | None:
    """Why `value` is not of the setting's JSON type (None: it is)."""
    schema = SETTING_SCHEMAS[field]
    if value is None:
        return None if schema.get("nullable") else "may not be null"
    kind = schema["type"]
    if not isinstance(value, _TYPES[kind]) or (kind == "integer" and isinstance(value, bool)):
        return f"must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    texts = value if kind == "array" else [value] if kind == "string" else []
    if not all(isinstance(text, str) for text in texts):
        return "must be a list of strings"
    if not all(_storable(text) for text in texts):
        return "may not contain NUL characters or lone surrogates"
    return None


def _storable(text: str) -> bool:
    """Can the database (PostgreSQL: no NUL) and the file system (UTF-8) take this text?"""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def _unknown(body: Any) -> Response | None:
    if not isinstance(body, dict):
        return Response({"__all__": ["expected a JSON object of settings"]}, status=400)
    unknown = sorted(set(body) - SETTABLE)
    if unknown:
        return Response({unknown[0]: ["unknown setting"]}, status=400)
    for field, value in body.items():
        reason = _type_error(field, value)
        if reason is not None:
            return Response({field: [reason]}, status=400)
    return None


class Refused(Exception):
    """A create, change or delete that was not done: errors by field, and the HTTP status."""

    def __init__(self, errors: dict[str, list[str]], status: int = 400) -> None:
        super().__init__(errors)
        self.errors, self.status = errors, status

    def response(self) -> Response:
        """The API's answer ({"error": "..."} for what concerns no one field)."""
        body: dict[str, Any] = dict(self.errors)
        if "error" in body:
            body["error"] = body["error"][0]
        return Response(body, status=self.status)


def _invalid(exc: ValidationError) -> Refused:
    return Refused({k: list(v) for k, v in exc.message_dict.items()})


def _cannot_open(name: str, exc: Exception) -> Refused:
    """The settings are valid but the disk cannot take them (say preallocate=true with more
    segment_bytes x partitions than there is free space): nothing is changed."""
    channels.close_channel(name)  # a handle closed on the way; the next use reopens it
    return Refused({"error": [f"channel {name!r} cannot be opened with these settings: "
                              f"{exc}"]}, status=503)


def _not_opened(name: str, exc: Exception, made: list[str]) -> Refused:
    """Why a create or change the engine could not open was refused; removes the
    directories it made (a refused create or change leaves nothing behind)."""
    channels.close_channel(name)  # a handle opened on the way holds the files
    for directory in made:
        shutil.rmtree(directory, ignore_errors=True)
    if isinstance(exc, ConfigError):  # a setting only the open could judge
        return Refused({exc.field: [exc.reason]})
    return _cannot_open(name, exc)


def create_channel(settings: dict[str, Any]) -> Channel:
    """Create a channel's record and files from typed settings, or raise Refused."""
    if Channel.objects.filter(name=settings.get("name")).exists():
        raise Refused({"name": ["a channel with this name exists"]}, status=409)
    row = Channel(**settings)
    made: list[str] = []
    try:
        channels.to_config(row)
        with transaction.atomic():
            channel_dirs.lock()
            if Channel.objects.filter(name=row.name).exists():
                raise Refused({"name": ["a channel with this name exists"]}, status=409)
            channel_dirs.check_others(row)
            channel_dirs.fresh(row)
            made = row.owned_dirs = channel_dirs.missing(row)
            row.save()
            channels.open_channel(row, create=True)  # the files; an error rolls it back
    except ValidationError as exc:
        raise _invalid(exc) from exc
    except (OSError, ChannelEngineError) as exc:
        raise _not_opened(row.name, exc, made) from exc
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
    was = copy.copy(row)
    before = {field: getattr(row, field) for field in [*changes, "owned_dirs"]}
    for field, value in changes.items():
        setattr(row, field, value)
    made: list[str] = []
    try:
        channels.to_config(row)
        with transaction.atomic():  # the change stands only if the channel opens with it
            channel_dirs.lock()
            channel_dirs.check_others(row)
            channel_dirs.fresh(row, was)
            made = [d for d in channel_dirs.missing(row) if d not in row.owned_dirs]
            row.owned_dirs = [*row.owned_dirs, *made]
            row.save()
            channels.open_channel(row, create=True)
    except ValidationError as exc:
        _restore(row, before)
        raise _invalid(exc) from exc
    except (OSError, ChannelEngineError) as exc:
        _restore(row, before)
        raise _not_opened(row.name, exc, made) from exc


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
    except (ChannelEngineError, OSError, ValidationError) as exc:  # a key file gone, say
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


_FIELD_CONFLICT = {"type": "object", "required": ["name"],
                   "properties": {"name": {"type": "array", "items": {"type": "string"}}}}


class ChannelsView(ChannelListView):
    """List channels, or create one."""

    schema = RequiredBodySchema()

    @extend_schema(operation_id="channel_create", request={"application/json": CREATE_REQUEST},
                   responses={201: DETAIL, **errors(400, 409, 415, 503, e409=_FIELD_CONFLICT)})
    def post(self, request: Request) -> Response:
        """Create a channel and its files."""
        if not allowed_everywhere(request, "admin"):
            self.permission_denied(request, "creating a channel needs an admin token for all "
                                            "channels (or a staff user)")
        bad = _unknown(request.data)
        if bad is not None:
            return bad
        try:
            row = create_channel(request.data)
        except Refused as refused:
            return refused.response()
        return Response(detail(row), status=201)


class ChannelView(ChannelDetailView):
    """Describe, change or delete one channel."""

    @extend_schema(operation_id="channel_update", request={"application/json": UPDATE_REQUEST},
                   responses={200: DETAIL, **errors(400, 404, 415, 503)})
    def patch(self, request: Request, name: str) -> Response:
        """Change settings (live), or say why a change cannot be made."""
        row = get_object_or_404(Channel, name=name)
        self.check_object_permissions(request, row)
        bad = _unknown(request.data)
        if bad is not None:
            return bad
        try:
            change_channel(row, request.data)
        except Refused as refused:
            return refused.response()
        return Response(detail(row))

    @extend_schema(operation_id="channel_delete",
                   parameters=[OpenApiParameter("force", {"type": "string",
                                                          "enum": list(FORCE_VALUES)},
                                                description="drop untaken events too")],
                   responses={204: None, **errors(400, 404, 409, 503)})
    def delete(self, request: Request, name: str) -> Response:
        """Delete a channel and its files (refused while events are untaken, unless forced)."""
        row = get_object_or_404(Channel, name=name)
        self.check_object_permissions(request, row)
        given = request.query_params.getlist("force")
        if len(given) > 1 or (given and given[0] not in FORCE_VALUES):
            return Response({"force": [f"expected one of {', '.join(FORCE_VALUES)}"]},
                            status=400)
        force = bool(given) and given[0].lower() in ("1", "true", "yes")
        try:
            delete_channel(row, force)
        except Refused as refused:
            return refused.response()
        return Response(status=204)

"""Channel management over the API (admin role).

    POST   /api/v1/channels                 create: the record and the files
    PATCH  /api/v1/channels/{name}          change settings
    DELETE /api/v1/channels/{name}?force=1  delete: the record and the files

A change is applied live: every process reopens its handle on the channel
when it sees the new settings, and ownership moves to a process that has
them (channel_engine/channel.py). Changes that would strand events are refused
with the reason: name and data_dirs (the partition logs live there), fewer
partitions (keys would move). Deleting a channel that holds untaken events is
refused unless forced.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from appliance import channels
from appliance.inspect import DETAIL, ChannelDetailView, ChannelListView, detail
from appliance.models import Channel
from appliance.produce import RequiredBodySchema, errors
from channel_engine import ChannelConfig, ChannelEngineError, StorageError

SETTABLE = (set(channels.SETTINGS) | set(channels.SCHEDULE_SETTINGS)
            | set(channels.EXPORT_SETTINGS) | {"puts_paused"})
FIXED = ("name", "data_dirs")
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


def _channel_dirs(config: ChannelConfig) -> list[Path]:
    """Every directory a channel's files live in."""
    dirs = [config.partition_dir(p) for p in range(config.partitions)]
    dirs.append(Path(config.checkpoint_dir))
    if config.backup_checkpoint_dir:
        dirs.append(Path(config.backup_checkpoint_dir))
    return dirs


def _cannot_open(name: str, exc: Exception) -> Refused:
    """The settings are valid but the disk cannot take them (say preallocate=true with more
    segment_bytes x partitions than there is free space): nothing is changed."""
    channels.close_channel(name)  # a handle closed on the way; the next use reopens it
    return Refused({"error": [f"channel {name!r} cannot be opened with these settings: "
                              f"{exc}"]}, status=503)


def create_channel(settings: dict[str, Any]) -> Channel:
    """Create a channel's record and files from typed settings, or raise Refused."""
    if Channel.objects.filter(name=settings.get("name")).exists():
        raise Refused({"name": ["a channel with this name exists"]}, status=409)
    row = Channel(**settings)
    try:
        config = channels.to_config(row)
    except ValidationError as exc:
        raise _invalid(exc) from exc
    created = [d for d in _channel_dirs(config) if not d.exists()]
    try:
        with transaction.atomic():
            row.save()
            channels.open_channel(row)  # the files; an error rolls the record back
    except (OSError, ChannelEngineError) as exc:
        channels.close_channel(row.name)
        for directory in created:  # a refused create leaves nothing behind
            shutil.rmtree(directory, ignore_errors=True)
        if isinstance(exc, OSError | StorageError):
            raise _cannot_open(row.name, exc) from exc
        raise
    return row


def change_channel(row: Channel, changes: dict[str, Any]) -> None:
    """Apply typed setting changes live, or raise Refused saying why (nothing changed)."""
    for field in FIXED:
        if field in changes and changes[field] != getattr(row, field):
            raise Refused({field: [f"cannot change: the partition logs of {row.name!r} "
                                   "live where they are"]})
    if changes.get("partitions", row.partitions) < row.partitions:
        raise Refused({"partitions": [f"cannot shrink from {row.partitions}: keys would "
                                      "move and events be stranded"]})
    before = {field: getattr(row, field) for field in changes}
    for field, value in changes.items():
        setattr(row, field, value)
    try:
        channels.to_config(row)
        with transaction.atomic():  # the change stands only if the channel opens with it
            row.save()
            channels.open_channel(row)
    except ValidationError as exc:
        _restore(row, before)
        raise _invalid(exc) from exc
    except OSError as exc:
        _restore(row, before)
        raise _cannot_open(row.name, exc) from exc


def _restore(row: Channel, before: dict[str, Any]) -> None:
    for field, value in before.items():
        setattr(row, field, value)


def delete_channel(row: Channel, force: bool) -> None:
    """Delete a channel's record and files; Refused (409) while events are untaken, unless
    forced. Forced, a channel the engine cannot open (its untaken events cannot be
    counted) goes too: its record and whatever files are where its directories belong."""
    config = channels.to_config(row)
    try:
        untaken = channels.open_channel(row).status()["events_untaken"]
    except (ChannelEngineError, OSError):
        if not force:
            raise
        untaken = None
    if untaken and not force:
        raise Refused({"error": [f"channel {row.name!r} holds {untaken} untaken events; "
                                 "delete with force (?force=true) to drop them"]}, status=409)
    channels.close_channel(row.name)
    row.delete()
    for path in _channel_dirs(config):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:  # a file where a directory belongs (damage that can stop an open)
            path.unlink(missing_ok=True)


_FIELD_CONFLICT = {"type": "object", "required": ["name"],
                   "properties": {"name": {"type": "array", "items": {"type": "string"}}}}


class ChannelsView(ChannelListView):
    """List channels, or create one."""

    schema = RequiredBodySchema()

    @extend_schema(operation_id="channel_create", request={"application/json": CREATE_REQUEST},
                   responses={201: DETAIL, **errors(400, 409, 415, 503, e409=_FIELD_CONFLICT)})
    def post(self, request: Request) -> Response:
        """Create a channel and its files."""
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
                   responses={204: None, **errors(400, 404, 409)})
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

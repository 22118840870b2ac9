"""The settings a channel create (POST /api/v1/channels) or change (PATCH .../{name})
may send, as JSON Schema for the OpenAPI document, and their check before anything is
done: known names, JSON types, text the database and the file system can store. What
only the whole can judge (directories, sizes) is appliance.manage_channels' to refuse.
"""
from __future__ import annotations

from typing import Any

from django.db import models

from appliance import channels
from appliance.manage_channels import Refused
from appliance.manage_subscriptions import NAME_PATTERN
from appliance.models import Channel

SETTABLE = channels.SETTABLE


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
SETTING_SCHEMAS["export_schema_version"].update(
    enum=[value for value, _ in Channel._meta.get_field("export_schema_version").choices])
SETTING_SCHEMAS["export_subscription"].update(pattern=NAME_PATTERN, maxLength=64)
SETTING_SCHEMAS["kafka_subscription"].update(pattern=NAME_PATTERN, maxLength=64)
SETTING_SCHEMAS["kafka_topic"].update(pattern=r"^[a-zA-Z0-9._-]{0,249}$", maxLength=249)
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


def check_settings(body: Any) -> dict[str, Any]:
    """The body, when it is an object of known settings of the right JSON types; else
    Refused naming the first field at fault (a 400 invalid-setting problem, as the
    refusals of appliance.manage_channels)."""
    if not isinstance(body, dict):
        raise Refused({"error": ["expected a JSON object of settings"]})
    unknown = sorted(set(body) - SETTABLE)
    if unknown:
        raise Refused({unknown[0]: ["unknown setting"]})
    for field, value in body.items():
        reason = _type_error(field, value)
        if reason is not None:
            raise Refused({field: [reason]})
    return body

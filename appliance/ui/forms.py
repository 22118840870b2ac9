"""The UI's forms: a channel's settings (create and change) and a new API token.

The settings form only converts text to typed values; every rule lives where the API's
requests meet it too (appliance.manage_channels and the engine's ChannelConfig), so the
browser and the API refuse the same things with the same words.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from django import forms
from django.conf import settings

from appliance.models import ROLES, Channel
from channel_engine import check_subscription_name

GROUPS = (
    ("Channel", ("name", "partitions", "capacity", "transaction_capacity", "keep_alive_ms",
                 "minimum_required_space")),
    ("Directories", ("data_dirs", "checkpoint_dir", "use_dual_checkpoints",
                     "backup_checkpoint_dir")),
    ("Checkpoints", ("checkpoint_interval_ms", "checkpoint_on_close")),
    ("Log and flush", ("durability", "flush_messages", "flush_ms", "segment_bytes",
                       "segment_ms", "index_interval_bytes", "preallocate", "compression")),
    ("Retention", ("retention_ms", "retention_bytes", "retention_check_interval_ms")),
    ("Encryption", ("encryption_key_file", "encryption_active_key")),
    ("Export", ("export_interval_ms", "export_subscription", "export_format",
                "export_schema_version", "export_path", "export_roll_rows",
                "export_roll_bytes", "export_max_open_files")),
    ("Kafka sink", ("kafka_topic", "kafka_bootstrap", "kafka_interval_ms", "kafka_subscription",
                    "kafka_partitioning", "kafka_compression", "kafka_create_topic",
                    "kafka_security_protocol", "kafka_sasl_mechanism", "kafka_sasl_username",
                    "kafka_sasl_password_file", "kafka_ssl_cafile", "kafka_ssl_certfile",
                    "kafka_ssl_keyfile")),
)
FIELDS = tuple(name for _, names in GROUPS for name in names)
# Settings fixed once a channel exists, and why (shown next to the field).
FIXED = {"name": "the partition directories are named after the channel",
         "data_dirs": "the partition logs live there; move them by creating a new channel",
         "checkpoint_dir": "the channel's home (its checkpoints) lives there; move it by "
                           "creating a new channel"}
COMPRESSION = ("none", "gzip", "snappy", "lz4", "zstd")
# Settings with a default that a form left empty keeps (a script posting only what it sets).
KEEP_WHEN_EMPTY = ("export_subscription", "export_schema_version", "kafka_subscription",
                   "kafka_partitioning", "kafka_compression", "kafka_security_protocol",
                   "kafka_sasl_mechanism")


class DirectoriesField(forms.CharField):
    """A list of directories, one per line."""

    widget = forms.Textarea(attrs={"rows": 2})

    def prepare_value(self, value: Any) -> Any:
        return "\n".join(value) if isinstance(value, list | tuple) else value

    def to_python(self, value: Any) -> list[str]:
        text = super().to_python(value)
        return [line.strip() for line in text.splitlines() if line.strip()]


class ChannelForm(forms.ModelForm):
    """Every setting of a channel; on an existing channel the fixed ones are read-only."""

    data_dirs = DirectoriesField(
        required=False, help_text=Channel._meta.get_field("data_dirs").help_text)
    compression = forms.ChoiceField(choices=[(c, c) for c in COMPRESSION])

    class Meta:
        model = Channel
        fields = FIELDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["checkpoint_dir"].required = False
        for name in KEEP_WHEN_EMPTY:  # empty: as it is (or its default, on a new channel)
            self.fields[name].required = False
        self.creating = self.instance.pk is None
        root = Path(settings.WEIR_DATA_ROOTS[0])
        if self.creating:
            self.fields["data_dirs"].widget.attrs["placeholder"] = str(root / "data")
            self.fields["checkpoint_dir"].widget.attrs["placeholder"] = str(
                root / "checkpoints" / "<name>")
        for name, why in FIXED.items():
            if not self.creating:
                self.fields[name].disabled = True
                self.fields[name].help_text = f"Fixed: {why}."
        self.changed_from_default = {name: default for name, _, default in self.differences()}

    def clean(self) -> dict[str, Any]:
        """Fill the directories an operator left empty with places under WEIR_DATA_ROOT."""
        cleaned = super().clean() or {}
        root = Path(settings.WEIR_DATA_ROOTS[0])
        if self.creating and not cleaned.get("data_dirs"):
            cleaned["data_dirs"] = [str(root / "data")]
        if self.creating and not cleaned.get("checkpoint_dir") and cleaned.get("name"):
            cleaned["checkpoint_dir"] = str(root / "checkpoints" / cleaned["name"])
        for name in KEEP_WHEN_EMPTY:
            if not cleaned.get(name):
                cleaned[name] = getattr(self.instance, name)
        for name in ("backup_checkpoint_dir", "encryption_key_file", "encryption_active_key"):
            if cleaned.get(name) == "":
                cleaned[name] = None
        return cleaned

    def _post_clean(self) -> None:
        pass  # the model's own checks run in manage_channels, with the engine's words

    def settings(self) -> dict[str, Any]:
        """The typed settings a create needs."""
        return {name: self.cleaned_data[name] for name in FIELDS}

    def changes(self) -> dict[str, Any]:
        """The typed settings the operator changed."""
        return {name: self.cleaned_data[name] for name in self.changed_data
                if name not in FIXED}

    def refuse(self, errors: dict[str, list[str]]) -> None:
        """Show a refusal next to the field it names (or above the form)."""
        for field, messages in errors.items():
            for message in messages:
                self.add_error(field if field in self.fields else None, message)

    def differences(self) -> list[tuple[str, str, str]]:
        """The saved settings that are not the defaults: (name, value, default), as text."""
        if self.creating:
            return []
        found = []
        for name in FIELDS:
            if name in FIXED:  # named after this channel: never a default's
                continue
            field = Channel._meta.get_field(name)
            default, value = field.get_default(), getattr(self.instance, name)
            if value != default:  # a choice by its label (say a schema version's)
                labels = dict(field.choices or ())
                found.append((name, setting_text(labels.get(value, value)),
                              setting_text(labels.get(default, default))))
        return found

    def groups(self) -> list[tuple[str, list[forms.BoundField]]]:
        """The fields in their groups, for the template."""
        return [(title, [self[name] for name in names]) for title, names in GROUPS]


def setting_text(value: Any) -> str:
    """A setting's value as the settings table shows it."""
    if value is None or value == "":
        return "not set"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value) or "none"
    return str(value)


class TokenForm(forms.Form):
    """A new API token on one channel."""

    name = forms.CharField(max_length=200, help_text="Who uses it (a producer, a job).")
    roles = forms.MultipleChoiceField(choices=[(r, r) for r in ROLES],
                                      widget=forms.CheckboxSelectMultiple,
                                      help_text="produce: put events; consume: take "
                                                "them; admin: everything.")
    subscriptions = forms.CharField(
        required=False, max_length=2000,
        help_text="Subscriptions its takes may name, separated by spaces or commas (empty: "
                  "any).")

    def clean_subscriptions(self) -> list[str]:
        """The names, each checked by the engine's rule."""
        names = [n for n in self.cleaned_data["subscriptions"].replace(",", " ").split() if n]
        for name in names:
            try:
                check_subscription_name(name)
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from exc
        return names

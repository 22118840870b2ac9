"""The appliance's records: channel configs and API tokens.

A Channel row holds every setting of the engine's ChannelConfig (same names,
defaults taken from the engine, so there is one source of truth for them);
`appliance.channels` is the one module that turns a row into the engine's
config and checks it, naming the field that is wrong.
"""
from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import models

from channel_engine import ChannelConfig

ROLES = ("produce", "consume", "admin")
_ENGINE = ChannelConfig.__dataclass_fields__


def _default(name: str) -> Any:
    return _ENGINE[name].default


def _help(name: str) -> str:
    return str(_ENGINE[name].metadata["doc"])


class Channel(models.Model):
    """A channel's settings as the operator set them (the engine's ChannelConfig)."""

    name = models.CharField(max_length=200, unique=True, help_text=_help("name"))
    data_dirs = models.JSONField(help_text=_help("data_dirs"))
    checkpoint_dir = models.CharField(max_length=4096, help_text=_help("checkpoint_dir"))
    partitions = models.IntegerField(default=_default("partitions"),
                                     help_text=_help("partitions"))
    capacity = models.BigIntegerField(default=_default("capacity"), help_text=_help("capacity"))
    transaction_capacity = models.IntegerField(default=_default("transaction_capacity"),
                                               help_text=_help("transaction_capacity"))
    keep_alive_ms = models.IntegerField(default=_default("keep_alive_ms"),
                                        help_text=_help("keep_alive_ms"))
    minimum_required_space = models.BigIntegerField(default=_default("minimum_required_space"),
                                                    help_text=_help("minimum_required_space"))
    checkpoint_interval_ms = models.BigIntegerField(default=_default("checkpoint_interval_ms"),
                                                    help_text=_help("checkpoint_interval_ms"))
    checkpoint_on_close = models.BooleanField(default=_default("checkpoint_on_close"),
                                              help_text=_help("checkpoint_on_close"))
    use_dual_checkpoints = models.BooleanField(default=_default("use_dual_checkpoints"),
                                               help_text=_help("use_dual_checkpoints"))
    backup_checkpoint_dir = models.CharField(max_length=4096, null=True, blank=True,
                                             help_text=_help("backup_checkpoint_dir"))
    durability = models.CharField(max_length=10, default=_default("durability"),
                                  choices=[("fsync", "fsync"), ("policy", "policy")],
                                  help_text=_help("durability"))
    flush_messages = models.BigIntegerField(null=True, blank=True,
                                            help_text=_help("flush_messages"))
    flush_ms = models.BigIntegerField(null=True, blank=True, help_text=_help("flush_ms"))
    segment_bytes = models.BigIntegerField(default=_default("segment_bytes"),
                                           help_text=_help("segment_bytes"))
    segment_ms = models.BigIntegerField(default=_default("segment_ms"),
                                        help_text=_help("segment_ms"))
    index_interval_bytes = models.IntegerField(default=_default("index_interval_bytes"),
                                               help_text=_help("index_interval_bytes"))
    preallocate = models.BooleanField(default=_default("preallocate"),
                                      help_text=_help("preallocate"))
    retention_ms = models.BigIntegerField(default=_default("retention_ms"),
                                          help_text=_help("retention_ms"))
    retention_bytes = models.BigIntegerField(default=_default("retention_bytes"),
                                             help_text=_help("retention_bytes"))
    compression = models.CharField(max_length=10, default=_default("compression"),
                                   help_text=_help("compression"))
    encryption_key_file = models.CharField(max_length=4096, null=True, blank=True,
                                           help_text=_help("encryption_key_file"))
    encryption_active_key = models.CharField(max_length=255, null=True, blank=True,
                                             help_text=_help("encryption_active_key"))
    puts_paused = models.BooleanField(default=False,
                                      help_text="Operators paused puts: producers get 503.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def hash_key(key: str) -> str:
    """How a token is stored: its SHA-256 (a token is a random secret, not a password)."""
    return hashlib.sha256(key.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token for producers, consumers and scripts: roles, and the channels it may
    use (all of them when all_channels). Only the hash of the key is stored."""

    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=12, unique=True)
    key_hash = models.CharField(max_length=64, unique=True)
    roles = models.JSONField(default=list)
    all_channels = models.BooleanField(default=False)
    channels = models.ManyToManyField(Channel, blank=True, related_name="tokens")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, name: str, roles: list[str], channels: list[Channel] | None = None
              ) -> tuple[ApiToken, str]:
        """Create a token; return it and its key (shown once, never stored)."""
        unknown = sorted(set(roles) - set(ROLES))
        if unknown or not roles:
            raise ValueError(f"roles must be some of {', '.join(ROLES)}, not {roles!r}")
        prefix = secrets.token_hex(4)
        key = f"weir_{prefix}_{secrets.token_urlsafe(32)}"
        token = cls.objects.create(name=name, prefix=prefix, key_hash=hash_key(key),
                                   roles=sorted(set(roles)), all_channels=channels is None)
        if channels:
            token.channels.set(channels)
        return token, key

    def allows(self, role: str, channel: Channel | None) -> bool:
        """May this token act in `role` on `channel` (None: on no channel in particular)?"""
        if self.revoked_at is not None or (role not in self.roles and "admin" not in self.roles):
            return False
        if channel is None or self.all_channels:
            return True
        return self.channels.filter(pk=channel.pk).exists()

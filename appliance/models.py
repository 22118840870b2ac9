"""The appliance's records: channel configs and API tokens.

A Channel row holds every setting of the engine's ChannelConfig (same names,
defaults taken from the engine, so there is one source of truth for them);
`appliance.channels` is the one module that turns a row into the engine's
config and checks it, naming the field that is wrong. Two differences: the row's
encryption_key_file is a name in WEIR_KEY_DIR (appliance.keys makes it the engine's
path), and owned_dirs records the directories the channel created, the only ones its
delete removes (appliance.channel_dirs, which DirectoryLock serialises).
"""
from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import models
from django.utils import timezone

from channel_engine import ChannelConfig, check_subscription_name
from channel_engine.spark.file_formats import LATEST_SCHEMA, SCHEMA_VERSIONS

ROLES = ("produce", "consume", "admin")
_ENGINE = ChannelConfig.__dataclass_fields__


def _help(name: str) -> str:
    return str(_ENGINE[name].metadata["doc"])


def _engine(name: str) -> dict[str, Any]:
    """The default and help text of an engine setting, for the model field of that name."""
    return {"default": _ENGINE[name].default, "help_text": _help(name)}


class Channel(models.Model):
    """A channel's settings as the operator set them (the engine's ChannelConfig)."""

    name = models.CharField(max_length=200, unique=True, help_text=_help("name"))
    data_dirs = models.JSONField(help_text=_help("data_dirs"))
    checkpoint_dir = models.CharField(max_length=4096, help_text=_help("checkpoint_dir"))
    partitions = models.IntegerField(**_engine("partitions"))
    capacity = models.BigIntegerField(**_engine("capacity"))
    transaction_capacity = models.IntegerField(**_engine("transaction_capacity"))
    keep_alive_ms = models.IntegerField(**_engine("keep_alive_ms"))
    minimum_required_space = models.BigIntegerField(**_engine("minimum_required_space"))
    checkpoint_interval_ms = models.BigIntegerField(**_engine("checkpoint_interval_ms"))
    checkpoint_on_close = models.BooleanField(**_engine("checkpoint_on_close"))
    use_dual_checkpoints = models.BooleanField(**_engine("use_dual_checkpoints"))
    backup_checkpoint_dir = models.CharField(max_length=4096, null=True, blank=True,
                                             help_text=_help("backup_checkpoint_dir"))
    durability = models.CharField(max_length=10, **_engine("durability"),
                                  choices=[("fsync", "fsync"), ("policy", "policy")])
    # in the operator's words, not the engine API's (its docs name None and flush_if_due())
    flush_messages = models.BigIntegerField(
        null=True, blank=True, help_text="Policy durability: fsync once this many events are "
        "unflushed (Kafka's flush.messages); unset: no count trigger.")
    flush_ms = models.BigIntegerField(
        null=True, blank=True, help_text="Policy durability: the flusher fsyncs once this many "
        "ms have passed since the last flush (Kafka's flush.ms); unset: no time trigger.")
    segment_bytes = models.BigIntegerField(**_engine("segment_bytes"))
    segment_ms = models.BigIntegerField(**_engine("segment_ms"))
    index_interval_bytes = models.IntegerField(**_engine("index_interval_bytes"))
    preallocate = models.BooleanField(**_engine("preallocate"))
    retention_ms = models.BigIntegerField(**_engine("retention_ms"))
    retention_bytes = models.BigIntegerField(**_engine("retention_bytes"))
    compression = models.CharField(max_length=10, **_engine("compression"))
    encryption_key_file = models.CharField(
        max_length=4096, null=True, blank=True,
        help_text="Name of a key file in the appliance's key directory (no slashes) for "
        "encryption at rest; empty: no encryption.")
    encryption_active_key = models.CharField(max_length=255, null=True, blank=True,
                                             help_text=_help("encryption_active_key"))
    puts_paused = models.BooleanField(default=False,
                                      help_text="Operators paused puts: producers get 503.")
    export_interval_ms = models.BigIntegerField(
        null=True, blank=True, help_text="Export this often, to the appliance's export "
        "location (unset: only when asked; 10 seconds to 7 days).")
    export_format = models.CharField(max_length=10, default="parquet",
                                     choices=[("parquet", "parquet"), ("json", "json"),
                                              ("avro", "avro")],
                                     help_text="File format of exported events.")
    export_schema_version = models.PositiveSmallIntegerField(
        default=LATEST_SCHEMA,
        choices=[(version, f"{version}: {what}") for version, what in SCHEMA_VERSIONS.items()],
        help_text="Layout of the exported files' columns. Channels exported before this upgrade "
        "keep 1, so that their folders never mix two layouts; to change it once files are "
        "exported, change the export path with it.")
    export_path = models.CharField(max_length=200, default="%Y/%m/%d/%H",
                                   help_text="Directories by event time, with Flume's escapes "
                                   "(%Y %m %d %H %M %S %y %j), in UTC.")
    export_subscription = models.CharField(
        max_length=64, default="export",
        help_text="The subscription the export drains (made at earliest when missing): its "
        "own, so that HTTP consumers and the export each see every event; 'default' shares "
        "the HTTP consumers' queue.")
    export_roll_rows = models.BigIntegerField(
        default=1_000_000, help_text="Most events per exported file (1 to 2,147,483,647).")
    export_roll_bytes = models.BigIntegerField(
        default=256 << 20, help_text="Most bytes of events (as stored in the log) per exported "
        "file (1 KiB to 1 TiB); a file ends at whichever roll limit comes first.")
    export_max_open_files = models.IntegerField(
        null=True, blank=True, help_text="Most exported files one Spark task keeps open at "
        "once (1 to 1,024); a task with more time folders sorts its remaining events and "
        "writes them one file at a time. Each open Parquet file buffers a row group "
        "(parquet.block.size, 128 MiB by default) on the executor's heap: up to its cores x "
        "this x 128 MiB per executor. Unset: 4 for Parquet, 16 for JSON and Avro.")
    kafka_topic = models.CharField(
        max_length=249, blank=True, default="",
        help_text="The Kafka topic the channel is forwarded into, exactly once (empty: no "
        "Kafka sink).")
    kafka_bootstrap = models.CharField(
        max_length=1000, blank=True, default="",
        help_text="Kafka's bootstrap.servers, host:port[,host:port] (empty: the appliance's "
        "default Kafka cluster).")
    kafka_interval_ms = models.BigIntegerField(
        null=True, blank=True, help_text="Forward to Kafka this often (unset: only when asked; "
        "1 second to 1 day).")
    kafka_subscription = models.CharField(
        max_length=64, default="kafka",
        help_text="The subscription the Kafka sink drains (made where the slowest one stands "
        "when missing): its own, so HTTP consumers and the export each see every event.")
    kafka_partitioning = models.CharField(
        max_length=10, default="key", choices=[("key", "key"), ("same", "same")],
        help_text="key: murmur2 of the key mod the topic's partitions (Kafka's default), a "
        "keyless event by its partition number; same: channel partition p to topic partition p.")
    kafka_compression = models.CharField(
        max_length=10, default="none",
        choices=[(c, c) for c in ("none", "gzip", "snappy", "lz4", "zstd")],
        help_text="compression.type of the batches the sink sends.")
    kafka_create_topic = models.BooleanField(
        default=False, help_text="Create the topic when it is missing (with as many partitions "
        "as the channel), instead of failing the run.")
    kafka_security_protocol = models.CharField(
        max_length=20, default="PLAINTEXT",
        choices=[(c, c) for c in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")],
        help_text="security.protocol of the connection to Kafka.")
    kafka_sasl_mechanism = models.CharField(
        max_length=20, default="PLAIN",
        choices=[(c, c) for c in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")],
        help_text="sasl.mechanism, with a SASL security protocol.")
    kafka_sasl_username = models.CharField(max_length=255, blank=True, default="",
                                           help_text="The SASL user name.")
    kafka_sasl_password_file = models.CharField(
        max_length=4096, blank=True, default="",
        help_text="Path of a file holding the SASL password (read at each run, never stored).")
    kafka_ssl_cafile = models.CharField(
        max_length=4096, blank=True, default="",
        help_text="Path of the CA certificates (PEM) to trust (empty: the system's).")
    kafka_ssl_certfile = models.CharField(
        max_length=4096, blank=True, default="",
        help_text="Path of a client certificate (PEM), for mutual TLS.")
    kafka_ssl_keyfile = models.CharField(max_length=4096, blank=True, default="",
                                         help_text="Path of the client certificate's key (PEM).")
    retention_check_interval_ms = models.BigIntegerField(
        default=300_000, help_text="How often the retention task runs for this channel "
        "(Kafka's log.retention.check.interval.ms; 1 second to 1 day).")
    owned_dirs = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="Directories this channel created (resolved paths): the only ones its "
        "delete may remove.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DirectoryLock(models.Model):
    """One row, updated at the start of every channel create, change and delete: the row
    lock (PostgreSQL) or write lock (SQLite) it takes serialises the checks that keep the
    directories of different channels apart (appliance.channel_dirs.lock)."""

    changes = models.BigIntegerField(default=0)


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
    subscriptions = models.JSONField(
        default=list, blank=True,
        help_text="The subscriptions its takes may name (empty: any); admin tokens any.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, name: str, roles: list[str], channels: list[Channel] | None = None,
              subscriptions: list[str] | None = None) -> tuple[ApiToken, str]:
        """Create a token; return it and its key (shown once, never stored)."""
        unknown = sorted(set(roles) - set(ROLES))
        if unknown or not roles:
            raise ValueError(f"roles must be some of {', '.join(ROLES)}, not {roles!r}")
        for subscription in subscriptions or ():
            check_subscription_name(subscription)
        if subscriptions and "admin" in roles:
            raise ValueError("an admin token may do everything: it cannot be scoped to "
                             "subscriptions")
        prefix = secrets.token_hex(4)
        key = f"weir_{prefix}_{secrets.token_urlsafe(32)}"
        token = cls.objects.create(name=name, prefix=prefix, key_hash=hash_key(key),
                                   roles=sorted(set(roles)), all_channels=channels is None,
                                   subscriptions=sorted(set(subscriptions or ())))
        if channels:
            token.channels.set(channels)
        return token, key

    def revoke(self) -> None:
        """Revoke the token from now on, in every web worker (the save announces it)."""
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])

    def allows(self, role: str, channel: Channel | None) -> bool:
        """May this token act in `role` on `channel` (None: on no channel in particular)?"""
        if self.revoked_at is not None or (role not in self.roles and "admin" not in self.roles):
            return False
        if channel is None or self.all_channels:
            return True
        ids = getattr(self, "channel_ids", None)  # loaded by row_cache
        if ids is not None:
            return channel.pk in ids
        return self.channels.filter(pk=channel.pk).exists()

    def allows_subscription(self, subscription: str) -> bool:
        """May this token's takes name `subscription` (Kafka's ACL on a consumer group)?"""
        return not self.subscriptions or "admin" in self.roles or \
            subscription in self.subscriptions


class TaskRun(models.Model):
    """One run of a background task for one channel (the flusher, the checkpointer, ...):
    what the status API and the UI show. Kept for WEIR_TASK_RUNS_KEEP_HOURS."""

    OK, NOTHING_DUE, BUSY, RETRYING, FAILED = "ok", "nothing due", "busy", "retrying", "failed"
    task = models.CharField(max_length=100)
    channel = models.CharField(max_length=200)  # a name: runs outlive a deleted channel
    started_at = models.DateTimeField()
    duration_ms = models.FloatField()
    outcome = models.CharField(max_length=20)
    attempt = models.IntegerField(default=1)
    detail = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    worker = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["channel", "task", "-started_at"]),
                   models.Index(fields=["started_at"])]

    def __str__(self) -> str:
        return f"{self.task} {self.channel} {self.outcome} at {self.started_at:%H:%M:%S}"


class ChannelSample(models.Model):
    """A channel's figures at one moment, taken by the metrics sampler: the UI's rate
    charts are the differences between samples (counters reset when the owner changes)."""

    channel = models.CharField(max_length=200)
    at = models.DateTimeField()
    events_untaken = models.BigIntegerField()
    events_in_flight = models.BigIntegerField()
    put_successes = models.BigIntegerField()
    take_successes = models.BigIntegerField()
    unflushed_events = models.BigIntegerField()
    bytes_on_disk = models.BigIntegerField()
    checkpoint_age_ms = models.BigIntegerField(null=True)

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["channel", "-at"]), models.Index(fields=["at"])]

    def __str__(self) -> str:
        return f"{self.channel} at {self.at:%H:%M:%S}"


class ExportRun(models.Model):
    """One export of a channel to WEIR_EXPORT_URI: its progress while it runs, then what it
    wrote per partition (offset ranges, files, rows, bytes) or why it failed."""

    RUNNING, OK, FAILED = "running", "ok", "failed"
    channel = models.CharField(max_length=200)
    run_id = models.CharField(max_length=40, blank=True, default="")
    started_at = models.DateTimeField()
    duration_s = models.FloatField(null=True)
    outcome = models.CharField(max_length=20, default=RUNNING)
    progress = models.CharField(max_length=300, blank=True, default="")
    output = models.CharField(max_length=4096, blank=True, default="")
    rows = models.BigIntegerField(default=0)
    bytes = models.BigIntegerField(default=0)
    partitions = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="")
    # What the run was told to write: its files' schema version and the export path they
    # went under (runs from before these were kept: version 1, path unknown "")
    schema_version = models.PositiveSmallIntegerField(default=1)
    path = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["channel", "-started_at"])]

    def __str__(self) -> str:
        return f"export {self.channel} {self.outcome} at {self.started_at:%H:%M:%S}"


class KafkaRun(models.Model):
    """One run of the Kafka sink of a channel: what it committed to Kafka so far while it
    runs (each committed transaction updates it), then its outcome, or why it failed."""

    RUNNING, OK, FAILED = "running", "ok", "failed"
    channel = models.CharField(max_length=200)
    run_id = models.CharField(max_length=40, blank=True, default="")
    topic = models.CharField(max_length=249, blank=True, default="")
    started_at = models.DateTimeField()
    duration_s = models.FloatField(null=True)
    outcome = models.CharField(max_length=20, default=RUNNING)
    events = models.BigIntegerField(default=0, help_text="Events committed to Kafka.")
    skipped = models.BigIntegerField(
        default=0, help_text="Events taken that Kafka held already (an earlier run's, killed "
        "after its Kafka commit): not sent again.")
    lost = models.BigIntegerField(default=0, help_text="Events the log could not read "
                                  "(damage the engine counted lost).")
    transactions = models.IntegerField(default=0)
    ranges = models.JSONField(default=dict, blank=True,
                              help_text="Offset ranges sent, by channel partition.")
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["channel", "-started_at"])]

    def __str__(self) -> str:
        return f"kafka sink {self.channel} {self.outcome} at {self.started_at:%H:%M:%S}"

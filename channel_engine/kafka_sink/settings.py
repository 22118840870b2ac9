"""What one run of the Kafka sink is told to do: SinkSettings, each setting with its default
and its check; a bad value is a ConfigError naming it. The job's command line (job.py,
where appliance/kafka_sinks.py passes a channel row's sink settings) is turned into one.

Client settings follow the Java client's names (bootstrap.servers, security.protocol,
sasl.mechanism, compression.type, transaction.timeout.ms, max.block.ms); acks=all and
idempotence are not settings: a transactional producer has both, always. Secrets never
travel as values: the SASL password and the TLS key are read from files at each run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from channel_engine import check_subscription_name
from channel_engine.errors import ConfigError

DEFAULT_SINK_SUBSCRIPTION = "kafka"
DEFAULT_OFFSETS_TOPIC = "weir-sink-offsets"
PARTITIONING = ("key", "same")
COMPRESSION = ("none", "gzip", "snappy", "lz4", "zstd")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# Kafka's own rule for topic names (Topic.validate): legal characters, at most 249.
TOPIC_PATTERN = r"[a-zA-Z0-9._-]{1,249}"
# host:port[,host:port...]
BOOTSTRAP_PATTERN = r"[^\s,:]+:\d{1,5}(,[^\s,:]+:\d{1,5})*"


@dataclass
class SinkSettings:
    """What one run of the sink does (from the CLI, or from the appliance's channel row)."""

    home: str
    bootstrap: str  # bootstrap.servers
    topic: str
    subscription: str = DEFAULT_SINK_SUBSCRIPTION  # the queue it drains (made if missing)
    partitioning: str = "key"  # key: murmur2 of the key (Kafka's); same: partition p -> p
    compression: str = "none"  # compression.type of the batches it sends
    create_topic: bool = False  # create a missing topic (else the run fails naming it)
    topic_partitions: int = 0  # for a created topic: 0 = as many as the channel has
    topic_replication: int = 0  # for a created topic: 0 = 3, or fewer brokers if fewer
    offsets_topic: str = DEFAULT_OFFSETS_TOPIC  # where the sent ranges are recorded
    max_events: int = 100_000  # the most events in one Kafka transaction
    max_run_s: float = 60.0  # no new transaction starts after this long
    transaction_timeout_ms: int = 60_000  # transaction.timeout.ms
    batch_bytes: int = 512 << 10  # the most record bytes in one produced batch
    request_timeout_ms: int = 30_000  # request.timeout.ms
    # max.block.ms: the longest a run waits for one answer of Kafka's (the producer's
    # start, a transaction's batches, its commit) before it fails
    max_block_ms: int = 60_000
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str = ""
    sasl_password_file: str = ""  # the password is the file's text (a final newline dropped)
    ssl_cafile: str = ""  # CA certificates (PEM) to trust; the system's when empty
    ssl_certfile: str = ""  # a client certificate (PEM), for mutual TLS
    ssl_keyfile: str = ""  # its private key (PEM)

    def __post_init__(self) -> None:
        _match("bootstrap", BOOTSTRAP_PATTERN, self.bootstrap,
               "must be host:port[,host:port...]")
        for field in ("topic", "offsets_topic"):
            value = getattr(self, field)
            _match(field, TOPIC_PATTERN, value, "must be 1-249 of a-z A-Z 0-9 . _ -")
            if value in (".", ".."):
                raise ConfigError(field, f"{value!r} is not a topic name Kafka allows")
        if self.topic == self.offsets_topic:
            raise ConfigError("topic", "must not be the offsets topic")
        try:
            check_subscription_name(self.subscription)
        except ValueError as exc:
            raise ConfigError("subscription", str(exc)) from exc
        _one_of("partitioning", self.partitioning, PARTITIONING)
        _one_of("compression", self.compression, COMPRESSION)
        _one_of("security_protocol", self.security_protocol, SECURITY_PROTOCOLS)
        _one_of("sasl_mechanism", self.sasl_mechanism, SASL_MECHANISMS)
        _within("topic_partitions", self.topic_partitions, 0, 100_000)
        _within("topic_replication", self.topic_replication, 0, 32)
        _within("max_events", self.max_events, 1, 10_000_000)
        _within("transaction_timeout_ms", self.transaction_timeout_ms, 1_000, 900_000)
        _within("batch_bytes", self.batch_bytes, 1 << 10, 64 << 20)
        _within("request_timeout_ms", self.request_timeout_ms, 1_000, 600_000)
        _within("max_block_ms", self.max_block_ms, 1_000, 600_000)
        if not 0 < self.max_run_s <= 86_400:
            raise ConfigError("max_run_s", f"must be from 0 to 86400 s, not {self.max_run_s}")
        if self.sasl and not (self.sasl_username and self.sasl_password_file):
            raise ConfigError("sasl_username", f"{self.security_protocol} needs "
                                  "sasl_username and sasl_password_file")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ConfigError("ssl_certfile", "ssl_certfile and ssl_keyfile go together")

    @property
    def sasl(self) -> bool:
        """Whether the connection authenticates with SASL."""
        return self.security_protocol.startswith("SASL")

    @property
    def tls(self) -> bool:
        """Whether the connection is TLS."""
        return self.security_protocol in ("SSL", "SASL_SSL")


def _match(field: str, pattern: str, value: str, reason: str) -> None:
    if not isinstance(value, str) or re.fullmatch(pattern, value) is None:
        raise ConfigError(field, f"{reason}, not {value!r}")


def _one_of(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(field, f"must be one of {', '.join(allowed)}, not {value!r}")


def _within(field: str, value: int, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise ConfigError(field, f"must be an integer from {low} to {high}, not {value!r}")

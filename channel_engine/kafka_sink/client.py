"""The sink's Kafka clients (aiokafka) built from SinkSettings, and how a failure is told.

Every client of a run — the transactional producer, the admin client that checks and
makes topics, the consumer that reads the offsets record — connects the same way: the
settings' bootstrap servers, security protocol, SASL login (the password read from its
file now, never stored) and TLS context (CA, client certificate and key from their
files). The producer is transactional, so acks=all and idempotence hold whatever else
is set (aiokafka refuses anything else with a transactional.id).

describe() turns what a run met into one sentence an operator can act on: the broker
unreachable, a TLS handshake refused, a topic missing, an authentication or
authorization failure, a message too large, a transaction that timed out, a fenced
(stale) instance.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, errors
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.helpers import create_ssl_context

from channel_engine.errors import ChannelEngineError, ConfigError
from channel_engine.kafka_sink.settings import SinkSettings

CLIENT_ID = "weir-kafka-sink"


class ConnectionLog(logging.Handler):
    """The last warnings aiokafka logged: a failed bootstrap raises only "Unable to
    bootstrap from ...", and says why (a refused login, a TLS error) in its log."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: deque[str] = deque(maxlen=8)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def close(self) -> None:
        """Stop keeping aiokafka's warnings (a process may run several sinks in turn)."""
        logging.getLogger("aiokafka").removeHandler(self)
        super().close()

    def mentioning(self, *words: str) -> str | None:
        """The last message holding one of `words`, if any."""
        return next((m for m in reversed(self.messages) if any(w in m for w in words)), None)


def watch_connections() -> ConnectionLog:
    """Start keeping aiokafka's warnings (for describe()); the handler."""
    handler = ConnectionLog()
    logging.getLogger("aiokafka").addHandler(handler)
    return handler


def client_options(settings: SinkSettings) -> dict[str, Any]:
    """What every client of a run is given: where and how to connect."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap.split(","), "client_id": CLIENT_ID,
        "request_timeout_ms": settings.request_timeout_ms,
        "security_protocol": settings.security_protocol}
    if settings.sasl:
        options.update(sasl_mechanism=settings.sasl_mechanism,
                       sasl_plain_username=settings.sasl_username,
                       sasl_plain_password=_read_secret(settings.sasl_password_file,
                                                        "sasl_password_file"))
    if settings.tls:
        try:
            options["ssl_context"] = create_ssl_context(
                cafile=settings.ssl_cafile or None, certfile=settings.ssl_certfile or None,
                keyfile=settings.ssl_keyfile or None)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ConfigError("ssl_cafile", f"the TLS files do not load: {exc}") from exc
    return options


def producer(settings: SinkSettings, transactional_id: str) -> AIOKafkaProducer:
    """The run's transactional producer (not started)."""
    return AIOKafkaProducer(
        **client_options(settings), transactional_id=transactional_id,
        transaction_timeout_ms=settings.transaction_timeout_ms, acks="all",
        enable_idempotence=True, linger_ms=0, max_batch_size=settings.batch_bytes,
        compression_type=None if settings.compression == "none" else settings.compression)


def admin(settings: SinkSettings) -> AIOKafkaAdminClient:
    """An admin client for the run's topic checks (not started)."""
    return AIOKafkaAdminClient(**client_options(settings))


def consumer(settings: SinkSettings, committed: bool = True) -> AIOKafkaConsumer:
    """A consumer in no group (not started): of committed records only (read_committed:
    its end offsets are the last stable offsets), else of every record (its end offsets
    are the high watermarks)."""
    return AIOKafkaConsumer(**client_options(settings),
                            isolation_level="read_committed" if committed
                            else "read_uncommitted",
                            enable_auto_commit=False, group_id=None,
                            auto_offset_reset="earliest")


def _read_secret(path: str, field: str) -> str:
    try:
        return Path(path).read_text().removesuffix("\n")
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from exc


def describe(exc: BaseException, settings: SinkSettings, in_transaction_s: float = 0,
             log: ConnectionLog | None = None) -> str:
    """One sentence saying why a run failed, naming the cause as the operator meets it."""
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    where = f"Kafka at {settings.bootstrap}"
    if isinstance(exc, ChannelEngineError):
        return str(exc)
    if isinstance(exc, errors.KafkaConnectionError):
        refused = log.mentioning("Authentication failed", "SaslAuthenticationFailed",
                                 "UnsupportedSaslMechanism") if log else None
        if refused:
            return (f"authentication failed: {where} refused {settings.security_protocol} "
                    f"login of {settings.sasl_username!r} ({refused})")
        tls = log.mentioning("SSL", "certificate") if log else None
        if tls:
            return (f"TLS handshake failed: {where} ({tls}); ssl_cafile must hold the CA "
                    "that signed the broker's certificate (the system's CAs when empty), and "
                    "for mutual TLS ssl_certfile and ssl_keyfile a certificate it trusts")
        why = log.mentioning("Unable connect") if log else None
        return f"broker unreachable: {where} did not answer ({why or text})"
    if isinstance(exc, (errors.SaslAuthenticationFailed, errors.AuthenticationFailedError,
                        errors.UnsupportedSaslMechanismError,
                        errors.AuthenticationMethodNotSupported)):
        return (f"authentication failed: {where} refused {settings.security_protocol} "
                f"login of {settings.sasl_username!r} ({text})")
    if isinstance(exc, (errors.TopicAuthorizationFailedError,
                        errors.TransactionalIdAuthorizationFailed,
                        errors.ClusterAuthorizationFailedError,
                        errors.GroupAuthorizationFailedError)):
        return (f"not authorized: {where} denies {settings.sasl_username or 'this client'} "
                f"an operation the sink needs (write on topics {settings.topic!r} and "
                f"{settings.offsets_topic!r}, read and describe-configs on "
                f"{settings.offsets_topic!r}, write on its transactional id): {text}")
    if isinstance(exc, (errors.MessageSizeTooLargeError, errors.RecordTooLargeError,
                        errors.RecordListTooLargeError)):
        return (f"message too large: {where} refused a batch for topic {settings.topic!r} "
                f"(an event larger than the topic's max.message.bytes; raise it, or "
                f"batch_bytes is above it): {text}")
    if isinstance(exc, errors.InvalidTimestampError):
        return (f"invalid timestamp: {where} refused a batch for topic {settings.topic!r} "
                "holding an event whose timestamp is outside the topic's "
                "message.timestamp.before.max.ms / after.max.ms (Kafka 4 refuses one more "
                f"than an hour ahead by default): {text}")
    if isinstance(exc, (errors.ProducerFenced, errors.InvalidProducerEpoch,
                        errors.InvalidTxnState)):
        if in_transaction_s * 1000 >= settings.transaction_timeout_ms:
            return (f"transaction timeout: the Kafka transaction ran "
                    f"{in_transaction_s:.1f} s, longer than transaction_timeout_ms "
                    f"({settings.transaction_timeout_ms} ms), and the broker aborted it "
                    f"({text})")
        return (f"fenced: another instance of this sink (same transactional id) started "
                f"and took over; this one stopped ({text})")
    if isinstance(exc, (errors.KafkaTimeoutError, asyncio.TimeoutError)):
        return f"timed out waiting for {where} ({text or 'no answer'})"
    return text

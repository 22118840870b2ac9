"""Exports have a queue of their own: weir.export_channel (whoever sends it: the exporter
dispatcher, the UI) goes to WEIR_EXPORT_QUEUE, everything else to the default queue, so a
flush never waits behind an export. Dispatched messages expire. Checked in Celery's router
and in the messages the dispatchers put on the real broker (no worker consumes them)."""
from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from appliance_helpers import channel_row
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from appliance import tasks
from appliance.celery import app
from appliance.env import celery_queues

pytestmark = pytest.mark.django_db(transaction=True)
PER_CHANNEL = ("weir.flush_channel", "weir.checkpoint_channel", "weir.retention_channel")
DISPATCHERS = ("weir.flusher", "weir.checkpointer", "weir.retention", "weir.exporter",
               "weir.kafka_sinker", "weir.sample_metrics", "weir.prune_history")


def queue_of(task: str) -> str:
    return str(app.amqp.router.route({}, task)["queue"].name)


def test_the_queues_default_to_weir_weir_export_and_weir_kafka(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WEIR_CELERY_QUEUE", "WEIR_EXPORT_QUEUE", "WEIR_KAFKA_QUEUE"):
        monkeypatch.delenv(name, raising=False)
    assert celery_queues() == ("weir", "weir-export", "weir-kafka")
    monkeypatch.setenv("WEIR_CELERY_QUEUE", "site-a")
    assert celery_queues() == ("site-a", "site-a-export", "site-a-kafka")
    monkeypatch.setenv("WEIR_KAFKA_QUEUE", "site-a-export")
    with pytest.raises(ImproperlyConfigured, match="WEIR_KAFKA_QUEUE .* must differ"):
        celery_queues()
    monkeypatch.delenv("WEIR_KAFKA_QUEUE")
    monkeypatch.setenv("WEIR_EXPORT_QUEUE", "site-a")
    with pytest.raises(ImproperlyConfigured, match="must differ"):
        celery_queues()


def test_exports_route_to_the_export_queue_and_the_rest_to_the_default() -> None:
    default = settings.CELERY_TASK_DEFAULT_QUEUE  # weir, unless WEIR_CELERY_QUEUE says
    assert app.conf.task_default_queue == default
    with override_settings(WEIR_EXPORT_QUEUE=f"{default}-export",
                           WEIR_KAFKA_QUEUE=f"{default}-kafka"):
        assert queue_of("weir.export_channel") == f"{default}-export"
        assert queue_of("weir.kafka_sink_channel") == f"{default}-kafka"
        for task in PER_CHANNEL + DISPATCHERS:
            assert queue_of(task) == default, task


@pytest.fixture()
def broker() -> Iterator[tuple[redis.Redis, str, str]]:
    """The broker's Redis and two private queues (default, exports) no worker consumes."""
    default, export = f"weir-test-route-{os.getpid()}", f"weir-test-route-{os.getpid()}-x"
    client = redis.Redis.from_url(app.conf.broker_url)
    app.conf.task_default_queue = default
    try:
        with override_settings(WEIR_EXPORT_QUEUE=export):
            yield client, default, export
    finally:
        app.conf.task_default_queue = settings.CELERY_TASK_DEFAULT_QUEUE
        client.delete(broker_key(default), broker_key(export))
        client.close()


def broker_key(queue: str) -> str:
    """The Redis key of a queue: its name under the appliance's prefix (global_keyprefix)."""
    return f"{app.conf.broker_transport_options['global_keyprefix']}{queue}"


def messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The task messages waiting in a queue (kombu's Redis transport: a list of JSON)."""
    return [json.loads(raw) for raw in client.lrange(broker_key(queue), 0, -1)]


def test_the_dispatchers_send_exports_to_the_export_queue_with_an_expiry(
        tmp_path: Path, broker: tuple[redis.Redis, str, str]) -> None:
    client, default, export = broker
    channel_row(tmp_path, export_interval_ms=600_000)
    assert tasks.exporter.apply().get() == 1
    assert tasks.flusher.apply().get() == 1
    [sent_export] = messages(client, export)
    [sent_flush] = messages(client, default)
    assert sent_export["headers"]["task"] == "weir.export_channel"
    assert sent_flush["headers"]["task"] == "weir.flush_channel"
    for message, expiry_s in ((sent_export, 600), (sent_flush, tasks.MIN_EXPIRY_S)):
        body = json.loads(base64.b64decode(message["body"]))
        assert body[0] == ["orders"]
        expires = datetime.fromisoformat(message["headers"]["expires"])
        left_s = (expires - datetime.now(expires.tzinfo)).total_seconds()
        assert expiry_s - 10 < left_s <= expiry_s, (message["headers"]["task"], left_s)


def test_the_kafka_dispatcher_sends_runs_to_the_kafka_queue_for_channels_with_a_topic(
        tmp_path: Path, broker: tuple[redis.Redis, str, str]) -> None:
    client, default, _ = broker
    kafka = f"{default}-kafka"
    channel_row(tmp_path, kafka_interval_ms=5_000, kafka_topic="orders",
                kafka_bootstrap="127.0.0.1:9092")
    channel_row(tmp_path / "b", name="no-topic")  # no sink: never dispatched
    try:
        with override_settings(WEIR_KAFKA_QUEUE=kafka):
            assert tasks.kafka_sinker.apply().get() == 1
            assert tasks.kafka_sinker.apply().get() == 0  # not due again within 5 s
        [sent] = messages(client, kafka)
        assert sent["headers"]["task"] == "weir.kafka_sink_channel"
        assert json.loads(base64.b64decode(sent["body"]))[0] == ["orders"]
        assert messages(client, default) == []
    finally:
        client.delete(broker_key(kafka))

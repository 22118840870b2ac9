"""The Kafka sink in a real browser: an operator sets it up on the channel's settings form
(a bad topic first, refused next to its field), sees the Kafka sink panel, sends to Kafka
now and watches the run appear with its events, the lag falling to 0 without a reload;
the topic then holds every event once. A real Celery worker runs the queued run, against
the run's real Kafka broker."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from conftest import Shots, login
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from test_browser import make_channel, produce, scroll_to

from appliance import channels
from appliance.celery import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from kafka_sink_helpers import read_topic  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture()
def kafka_worker(settings: Any) -> Iterator[None]:
    """A real Celery worker (threads) consuming a queue of this test only, where the Kafka
    sink's runs go."""
    queue = f"weir-test-kafka-panel-{os.getpid()}"
    app.conf.task_default_queue = queue
    settings.WEIR_KAFKA_QUEUE = queue
    try:
        with start_worker(app, pool="threads", concurrency=1, queues=[queue],
                          perform_ping_check=False, shutdown_timeout=30):
            yield
    finally:
        app.conf.task_default_queue = django_settings.CELERY_TASK_DEFAULT_QUEUE


def test_set_up_the_kafka_sink_and_send_now_from_the_channel_page(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots,
        kafka_worker: None, kafka_broker: Any) -> None:
    make_channel(root, partitions=2)
    produce(live_server.url, "orders", [f"event {i}" for i in range(20)])
    topic = f"orders-{os.getpid()}-{os.urandom(3).hex()}"
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    expect(page.locator("#kafka-sink")).to_contain_text("No Kafka sink")
    expect(page.locator("#kafka-now")).to_have_count(0)
    form = page.locator("form.settings")
    form.locator("#field-kafka_topic input").fill("not a topic!")
    form.locator("#field-kafka_bootstrap input").fill(kafka_broker.bootstrap)
    form.locator("button[type=submit]").click()
    expect(page.locator("#field-kafka_topic .field-error")).to_contain_text("not 'not a topic!'")
    form = page.locator("form.settings")
    form.locator("#field-kafka_topic input").fill(topic)
    form.locator("#field-kafka_create_topic input").check()
    form.locator("button[type=submit]").click()
    expect(page.locator(".messages")).to_contain_text("Settings saved")
    panel = page.locator("#kafka-sink")
    expect(panel).to_contain_text(f"Into topic {topic}")
    expect(panel).to_contain_text("No runs that sent or failed yet.")
    expect(page.locator("#kafka-lag")).to_contain_text("the first run (or a schedule) adds "
                                                      "subscription kafka")
    page.click("#kafka-now")
    expect(page.locator(".messages")).to_contain_text("Kafka run queued")
    run = page.locator('#kafka-runs tr.kafka-run[data-outcome="ok"]')
    expect(run).to_have_count(1, timeout=90_000)  # the panel refreshes itself
    expect(run.locator("td.events")).to_have_text("20")
    expect(page.locator("#kafka-lag strong")).to_have_text("0")
    scroll_to(page, "kafka-sink")
    shot("kafka-sink-panel")
    channels.close_all()
    assert sum(len(p) for p in read_topic(kafka_broker.bootstrap, topic).values()) == 20

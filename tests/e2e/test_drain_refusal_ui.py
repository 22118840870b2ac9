"""A drain's refusal of a recreated partition whose offsets it had sent, and its way out,
in a real browser: the refused run's row reads as the sentence it is (at desktop and
phone width), and the recreate form takes the next offset the refusal names."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import Shots, login
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from appliance import channel_dirs, channels
from appliance.models import Channel, KafkaRun
from channel_engine import Channel as EngineChannel
from channel_engine.incarnations import PartitionIncarnation, conflicts

pytestmark = pytest.mark.django_db(transaction=True)


def two_volume_channel(root: Path) -> Channel:
    """A channel over two data dirs with a Kafka sink, holding events in both partitions."""
    row = Channel(name="orders", data_dirs=[str(root / "a"), str(root / "b")],
                  checkpoint_dir=str(root / "orders"), partitions=2, minimum_required_space=0,
                  kafka_topic="orders", kafka_bootstrap="kafka:9092")
    row.owned_dirs = channel_dirs.missing(row)
    row.save()
    EngineChannel.create(channels.to_config(row)).close()
    with channels.open_channel(row).put() as tx:
        for i in range(6):
            tx.put(f"event {i}".encode(), key=str(i).encode())
    channels.close_all()
    return row


def test_a_refused_run_reads_as_words_and_the_form_recreates_at_its_next_offset(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = two_volume_channel(root)
    [refusal] = conflicts("orders", [PartitionIncarnation(
        1, "ab" * 16, 3, 5, str(root / "b" / "orders-1"))], {1: {"original": [(0, 90)]}},
        "Kafka sink")
    KafkaRun.objects.create(channel="orders", topic="orders", started_at=timezone.now(),
                            duration_s=0.4, outcome=KafkaRun.FAILED, error=refusal)
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    runs = page.locator("#kafka-runs")
    expect(runs).to_contain_text("channel 'orders' partition 1: its storage was recreated")
    expect(runs).to_contain_text("manage.py recreate_channel orders --yes --next-offset 1:90")
    page.evaluate("document.getElementById('kafka-runs').scrollIntoView()")
    shot("refused-kafka-run", full_page=False)
    page.set_viewport_size({"width": 390, "height": 844})  # a phone
    expect(runs).to_contain_text("--next-offset 1:90")
    page.evaluate("const t = document.getElementById('kafka-runs'); t.scrollIntoView(); "
                  "t.parentElement.scrollLeft = t.scrollWidth")  # the table scrolls sideways
    shot("refused-kafka-run-phone", full_page=False)
    page.set_viewport_size({"width": 1366, "height": 900})

    channels.close_all()  # a restart, with the partition's directory moved aside
    shutil.move(root / "b" / "orders-1", root / "orders-1-aside")  # the way out
    page.goto(f"{live_server.url}/channels/orders/")
    section = page.locator("#storage-missing")
    expect(section).to_contain_text("Next offsets")
    page.fill("#recreate-next-offsets", "1:90")
    shot("recreate-with-next-offset")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#recreate-channel").click()
    expect(page.locator(".messages")).to_contain_text("recreated empty")
    expect(page.locator("#partitions")).to_contain_text("recreated, from offset 90")
    page.evaluate("document.getElementById('partitions').scrollIntoView()")
    shot("recreated-at-next-offset", full_page=False)
    status = channels.open_channel(row).status()
    part = status["partitions"][1]
    assert (part["incarnation_start_offset"], part["log_end_offset"]) == (90, 90)

"""A channel whose storage vanished, in a real browser: the dashboard and the channel page
say unhealthy, name the missing paths and what to do; the recreate button asks first, and
on the operator's word makes the channel again, empty, with the loss recorded."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import Shots, login
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from appliance import channel_dirs, channels
from appliance.models import Channel
from channel_engine import Channel as EngineChannel

pytestmark = pytest.mark.django_db(transaction=True)


def two_volume_channel(root: Path) -> Channel:
    """A channel over two data dirs, as manage_channels' create makes it."""
    row = Channel(name="orders", data_dirs=[str(root / "a"), str(root / "b")],
                  checkpoint_dir=str(root / "orders"), partitions=2, minimum_required_space=0)
    row.owned_dirs = channel_dirs.missing(row)
    row.save()
    EngineChannel.create(channels.to_config(row)).close()
    return row


def test_a_channel_whose_volume_is_gone_says_so_and_is_recreated_on_the_operators_word(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = two_volume_channel(root)
    with channels.open_channel(row).put() as tx:  # keyed: both partitions hold some
        for i in range(6):
            tx.put(f"event {i}".encode(), key=str(i).encode())
    assert {p for p, _, _ in tx.committed} == {0, 1}
    channels.close_all()  # a restart with the volume of data dir b not mounted
    shutil.move(root / "b", root / "b-unmounted")
    missing = str(root / "b" / "orders-1")
    login(page, live_server.url)
    page.goto(f"{live_server.url}/")
    row = page.locator("tr[data-channel='orders']")
    expect(row).to_contain_text("unhealthy")
    expect(row).to_contain_text(f"its storage is missing: {missing}")
    shot("dashboard-storage-missing")
    page.goto(f"{live_server.url}/channels/orders/")
    section = page.locator("#storage-missing")
    expect(section).to_contain_text("Storage missing")
    expect(section).to_contain_text(missing)
    expect(section).to_contain_text("Mount the volume back")
    shot("channel-storage-missing")
    button = page.locator("#recreate-channel")
    page.once("dialog", lambda dialog: dialog.dismiss())
    button.click()
    expect(section).to_be_visible()
    assert not (root / "b").exists()  # asked first: nothing made
    page.once("dialog", lambda dialog: dialog.accept())
    button.click()
    expect(page.locator(".messages")).to_contain_text("recreated empty")
    expect(page.locator("#health")).to_have_text("degraded")
    expect(page.locator("#losses")).to_contain_text("not acknowledged")
    expect(page.locator("#storage-missing")).to_have_count(0)
    shot("channel-recreated-loss-recorded")
    assert (root / "b" / "orders-1").is_dir()

"""The admin UI in a real browser (Chromium via Playwright) against a live server with a
real channel: login, the create form with a validation error first, live dashboard
counts without a reload, checkpoint from the UI, the event browser by offset and by time,
bodies shown as text (never as HTML), and anonymous users sent to login."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import Shots, login
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from appliance import channel_dirs, channels, tasks
from appliance.models import ApiToken, Channel
from channel_engine import Channel as EngineChannel
from channel_engine.queue.checkpointer import CHECKPOINT_HISTORY

pytestmark = pytest.mark.django_db(transaction=True)


def make_channel(root: Path, name: str = "orders", **settings: Any) -> Channel:
    """A channel record and its files, made as manage_channels' create makes them."""
    settings.setdefault("minimum_required_space", 0)
    row = Channel(name=name, data_dirs=[str(root / "data")], checkpoint_dir=str(root / name),
                  **settings)
    row.owned_dirs = channel_dirs.missing(row)
    row.save()
    EngineChannel.create(channels.to_config(row)).close()  # as manage_channels' create
    return row


def produce(base: str, name: str, bodies: list[str]) -> dict[str, Any]:
    """Put events over the REST API, as a producer would."""
    _, key = ApiToken.issue("producer", ["produce"])
    request = urllib.request.Request(
        f"{base}/api/v1/channels/{name}/events", method="POST",
        data=json.dumps({"events": [{"body": b} for b in bodies]}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)  # type: ignore[no-any-return]


def test_an_anonymous_user_is_sent_to_login_then_back(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    make_channel(root)
    page.goto(f"{live_server.url}/channels/orders/")
    expect(page).to_have_url(f"{live_server.url}/login/?next=/channels/orders/")
    shot("login-page")
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    expect(page.locator("p.error")).to_contain_text("did not match")
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", "a-long-test-password")
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live_server.url}/channels/orders/")
    expect(page.locator("h1")).to_have_text("orders")
    page.click("text=Log out ops")
    expect(page).to_have_url(f"{live_server.url}/login/")
    page.goto(f"{live_server.url}/")
    expect(page).to_have_url(f"{live_server.url}/login/?next=/")
    shot("after-logout")


def test_create_a_channel_through_the_form_after_a_validation_error(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    login(page, live_server.url)
    page.click("text=Create channel")
    page.fill("#id_name", "Web Orders")  # upper case and a space: not a channel name
    page.fill("#id_partitions", "3")
    page.fill("#id_minimum_required_space", "0")
    page.click("button:has-text('Create channel')")
    error = page.locator("#field-name .field-error")
    expect(error).to_contain_text("must match [a-z0-9][a-z0-9_-]*")
    expect(page.locator(".field-error")).to_have_count(1)
    assert not Channel.objects.exists()
    shot("validation-error")
    page.fill("#id_name", "web-orders")
    page.click("button:has-text('Create channel')")
    expect(page).to_have_url(f"{live_server.url}/channels/web-orders/")
    expect(page.locator(".messages")).to_contain_text("Channel web-orders created")
    expect(page.locator("#partitions tbody tr")).to_have_count(3)
    assert (root / "data" / "web-orders-2").is_dir()
    shot("channel-page")


def test_the_dashboard_counts_change_without_a_reload(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    make_channel(root)
    make_channel(root, "clicks", partitions=2)
    login(page, live_server.url)
    queued = page.locator("tr[data-channel=orders] td.queued")
    expect(queued).to_have_text("0")
    page.evaluate("window.__sameDocument = true")
    shot("dashboard-empty")
    tasks.sample_metrics.apply()  # what beat runs every WEIR_SAMPLE_INTERVAL_S
    produce(live_server.url, "orders", [f"event {i}" for i in range(25)])
    expect(queued).to_have_text("25", timeout=10_000)
    produce(live_server.url, "orders", [f"more {i}" for i in range(1000)])
    expect(queued).to_have_text("1,025", timeout=10_000)
    time.sleep(0.2)
    tasks.sample_metrics.apply()
    rates = page.locator("tr[data-channel=orders] .rates")
    expect(rates).to_contain_text("ev/s", timeout=10_000)  # the chart has its first rate
    assert page.locator("tr[data-channel=orders] polyline.puts").get_attribute("points")
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    shot("dashboard-counts")
    page.set_viewport_size({"width": 390, "height": 844})  # a phone
    page.reload()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    shot("dashboard-phone")


def scroll_to(page: Page, element_id: str) -> None:
    """Scroll the element into view for a screenshot, in one script task: the page's live
    refresh replaces the status panels, and Playwright's scroll_into_view_if_needed fails
    when the element it found is swapped out under it (CI, under load)."""
    page.evaluate("id => document.getElementById(id).scrollIntoView({block: 'center'})",
                  element_id)


def test_checkpoint_from_the_ui_changes_the_checkpoint_panel(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = make_channel(root)
    produce(live_server.url, "orders", ["a", "b", "c"])
    for _ in range(CHECKPOINT_HISTORY):  # the engine keeps this many: the table is full
        channels.open_channel(row).checkpoint()
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    sequence = page.locator("#checkpoint-sequence")
    before = int(sequence.inner_text())
    history = page.locator("#checkpoint-history tbody tr")
    expect(history).to_have_count(CHECKPOINT_HISTORY)
    shot("before-checkpoint")
    page.click("#checkpoint-now")
    expect(page.locator(".messages")).to_contain_text("Checkpoint written")
    expect(sequence).to_have_text(str(before + 1))
    expect(history).to_have_count(CHECKPOINT_HISTORY)  # the oldest dropped, newest on top
    expect(history.first).to_have_attribute("data-sequence", str(before + 1))
    expect(history.last).to_have_attribute("data-sequence",
                                           str(before + 2 - CHECKPOINT_HISTORY))
    scroll_to(page, "checkpoint-panel")
    shot("after-checkpoint")
    assert channels.open_channel(row).status()["checkpoint"]["sequence"] == before + 1


def test_the_channel_page_shows_a_checkpoint_made_elsewhere_without_a_reload(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = make_channel(root)
    produce(live_server.url, "orders", ["a", "b", "c"])
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    sequence = page.locator("#checkpoint-sequence")
    before = int(sequence.inner_text())
    history = page.locator("#checkpoint-history tbody tr")
    rows = history.count()
    page.evaluate("window.__sameDocument = true")
    shot("before")
    # the checkpointer's task, as a worker runs it: nothing on the page asked for it
    assert tasks.checkpoint_channel.apply(args=("orders",), kwargs={"force": True}).successful()
    expect(sequence).to_have_text(str(before + 1), timeout=10_000)
    expect(history).to_have_count(rows + 1)
    expect(history.first).to_have_attribute("data-sequence", str(before + 1))
    expect(page.locator("#runs")).to_contain_text("Checkpoint")
    channels.open_channel(row).checkpoint()  # and straight through the engine
    expect(sequence).to_have_text(str(before + 2), timeout=10_000)
    expect(history).to_have_count(rows + 2)
    expect(history.first).to_have_attribute("data-sequence", str(before + 2))
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    # found and scrolled in one step in the page: a refresh may replace the panel between
    # a locator's lookup and its scroll ("not attached to the DOM")
    page.evaluate("document.getElementById('checkpoint-panel').scrollIntoView()")
    shot("after-refresh")


# Elements sticking out past the right edge of the window, other than those inside a
# container that scrolls sideways by itself (the wide tables' div.scroll).
OUTSIDE_VIEWPORT = """() => Array.from(document.querySelectorAll("body *")).filter(el => {
    if (el.getBoundingClientRect().right <= window.innerWidth + 1) return false;
    for (let up = el.parentElement; up; up = up.parentElement) {
        if (getComputedStyle(up).overflowX === "auto") return false;
    }
    return true;
}).map(el => el.tagName + (el.id ? "#" + el.id : "") + "." + el.className)"""


def test_the_channel_page_is_readable_on_a_phone(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = make_channel(root, partitions=2, segment_bytes=4096, export_interval_ms=60_000)
    for first in range(0, 60, 6):  # a batch a put: several segments a partition
        produce(live_server.url, "orders", [f"event {i} " + "x" * 200
                                            for i in range(first, first + 6)])
    channels.open_channel(row).checkpoint()
    tasks.flush_channel.apply(args=("orders",), kwargs={"force": True})
    ApiToken.issue("nightly-loader-with-a-long-name", ["consume", "produce"], [row])
    login(page, live_server.url)
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_server.url}/channels/orders/")
    expect(page.locator("#segments table").first).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 391  # no sideways page
    assert page.evaluate(OUTSIDE_VIEWPORT) == []
    segments = page.locator("#segments .scroll").first  # wide: it scrolls inside its box
    assert segments.evaluate("el => el.scrollWidth > el.clientWidth")
    assert segments.evaluate("el => el.getBoundingClientRect().right") <= 391
    body = page.evaluate("parseFloat(getComputedStyle(document.body).fontSize)")
    assert body >= 14  # the viewport meta tag keeps it from being shrunk to fit
    shot("channel-phone")
    shot("channel-phone-top", full_page=False)
    scroll_to(page, "segments")
    shot("channel-phone-segments", full_page=False)


def test_browse_events_by_offset_and_by_time(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = make_channel(root)
    start = 1_795_000_000_000
    with channels.open_channel(row).put() as tx:
        for i in range(80):
            tx.put(f"event number {i}".encode(), key=f"k{i}".encode(),
                   headers={"source": b"browser-test"}, timestamp=start + i * 1000)
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    page.click("text=Browse events")
    page.fill("#offset", "10")
    page.click("button:has-text('Show events')")
    rows = page.locator("#events tbody tr")
    expect(rows.first).to_have_attribute("data-offset", "10")
    expect(rows).to_have_count(50)
    expect(rows.first).to_contain_text("event number 10")
    expect(rows.first).to_contain_text("browser-test")
    page.click("#next-page")
    expect(rows.first).to_have_attribute("data-offset", "60")
    expect(rows).to_have_count(20)
    shot("by-offset")
    page.fill("#offset", "")
    page.fill("#time", "2026-11-18T11:07:22")  # start is 11:06:40 UTC: offset 42 is at 11:07:22
    page.click("button:has-text('Show events')")
    expect(page.locator("#found-offset")).to_have_text("42")
    expect(rows.first).to_have_attribute("data-offset", "42")
    expect(rows.first).to_contain_text("2026-11-18 11:07:22 UTC")
    shot("by-time")


def test_a_script_in_a_body_is_shown_as_text(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    make_channel(root)
    hostile = ['<script>window.__pwned = 1</script>',
               '<img src=x onerror="window.__pwned = 2">']
    produce(live_server.url, "orders", hostile)
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/events?partition=0&offset=0")
    bodies = page.locator("#events pre.body")
    expect(bodies.nth(0)).to_have_text(hostile[0])
    expect(bodies.nth(1)).to_have_text(hostile[1])
    assert page.locator("#events script, #events img").count() == 0
    time.sleep(0.3)  # an onerror would have fired by now
    assert page.evaluate("window.__pwned") is None
    shot("escaped-bodies")


def test_tokens_verify_and_delete_ask_before_they_act(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    make_channel(root)
    produce(live_server.url, "orders", ["kept until forced"])
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    page.fill("form.token-form input[name=name]", "nightly-loader")
    page.check("form.token-form input[value=consume]")
    page.click("button:has-text('Create token')")
    key = page.locator("#token-key").inner_text()
    assert key.startswith("weir_")
    shot("token-created")
    page.click("text=Back to orders")
    revoke = page.locator("#tokens button:has-text('Revoke')")
    page.once("dialog", lambda dialog: dialog.dismiss())
    revoke.click()
    expect(page.locator("#tokens .badge.healthy")).to_have_text("active")
    page.once("dialog", lambda dialog: dialog.accept())
    revoke.click()
    expect(page.locator(".messages")).to_contain_text("revoked")
    expect(page.locator("#tokens .badge.unhealthy")).to_have_text("revoked")
    assert ApiToken.objects.get(name="nightly-loader").revoked_at is not None
    page.click("button:has-text('Verify files')")
    expect(page.locator("#verdict")).to_contain_text("sound")
    shot("verify")
    page.goto(f"{live_server.url}/channels/orders/")
    page.click("text=Delete…")
    page.fill("input[name=confirm_name]", "orders")
    page.click("button:has-text('Delete channel and files')")
    expect(page.locator("p.error[role=alert]")).to_contain_text("1 untaken events")
    assert Channel.objects.filter(name="orders").exists()
    page.fill("input[name=confirm_name]", "orders")
    page.check("input[name=force]")
    shot("delete-confirm")
    page.click("button:has-text('Delete channel and files')")
    expect(page).to_have_url(f"{live_server.url}/")
    expect(page.locator(".messages")).to_contain_text("deleted")
    assert not Channel.objects.exists() and not (root / "orders").exists()


def test_a_loss_on_disk_shows_on_the_channel_page_until_acknowledged(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = make_channel(root, partitions=1, segment_bytes=4096)
    for batch in range(16):
        produce(live_server.url, "orders", [f"event {batch}-{i} " * 8 for i in range(10)])
    channels.close_all()
    logs = sorted(Path(channels.to_config(row).partition_dir(0)).glob("*.log"))
    assert len(logs) >= 3, logs
    lost = int(logs[2].stem) - int(logs[1].stem)
    logs[1].unlink()  # a segment file gone while the channel was closed
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    expect(page.locator("#health")).to_have_text("degraded")
    expect(page.locator("#losses")).to_contain_text(f"{lost} lost event(s) not acknowledged")
    expect(page.locator("#loss-records tbody tr")).to_have_count(1)
    cause = page.locator("#loss-records td.cause")
    expect(cause).to_contain_text("Offsets missing from the log (files gone)")
    expect(cause).not_to_contain_text("gap:")  # the engine's code only in the title
    expect(cause).to_have_attribute("title", "gap")
    shot("losses")
    button = page.locator("#acknowledge-losses")
    page.once("dialog", lambda dialog: dialog.dismiss())
    button.click()
    expect(page.locator("#health")).to_have_text("degraded")
    page.once("dialog", lambda dialog: dialog.accept())
    button.click()
    expect(page.locator(".messages")).to_contain_text("1 loss record(s) acknowledged")
    expect(page.locator("#health")).to_have_text("healthy")
    expect(page.locator("#losses")).to_contain_text("all acknowledged")
    shot("losses-acknowledged")


def test_subscriptions_are_added_reset_and_removed_from_the_channel_page(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = make_channel(root, partitions=2)
    produce(live_server.url, "orders", [f"event {i}" for i in range(8)])
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    form = page.locator("#subscription-add")
    form.locator("input[name=name]").fill("archive")
    form.locator("input[name=start][value=latest]").check()
    form.locator("button").click()
    expect(page.locator(".messages")).to_contain_text("Subscription archive added at latest")
    lag = page.locator('#subscription-table tr[data-subscription="archive"] .lag')
    expect(lag).to_have_text("0")
    produce(live_server.url, "orders", ["after"])
    expect(lag).to_have_text("1")  # the table refreshes itself
    expect(page.locator('#subscription-table tr[data-subscription="default"] .lag')) \
        .to_have_text("9")
    shot("subscriptions")
    archive = page.locator('details.subscription-actions[data-subscription="archive"]')
    archive.locator("summary").click()
    archive.locator("input[name=to][value=earliest]").check()
    reset = archive.locator("button:has-text('Reset archive')")
    page.once("dialog", lambda dialog: dialog.dismiss())
    reset.click()
    expect(lag).to_have_text("1")
    page.once("dialog", lambda dialog: dialog.accept())
    reset.click()
    expect(page.locator(".messages")).to_contain_text("Subscription archive reset to earliest")
    expect(lag).to_have_text("9")
    page.locator('details.subscription-actions[data-subscription="archive"] summary').click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("button:has-text('Remove archive')").click()
    expect(page.locator(".messages")).to_contain_text("Subscription archive removed")
    expect(page.locator('#subscription-table tr[data-subscription="archive"]')).to_have_count(0)
    assert channels.open_channel(row).subscriptions() == ["default"]


def test_a_changed_setting_shows_against_its_default(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    make_channel(root)
    default = Channel._meta.get_field("capacity").get_default()
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    expect(page.locator("#settings-diff tbody tr")).to_have_count(1)  # minimum_required_space
    expect(page.locator("#field-capacity")).not_to_have_class("field changed")
    page.fill("#id_capacity", "50000")
    page.click("#settings button[type=submit]")
    expect(page.locator(".messages")).to_contain_text("Settings saved and applied live: capacity")
    row = page.locator("#settings-diff tbody tr", has_text="capacity")
    expect(row.locator("td")).to_have_text(["capacity", "50000", str(default)])
    expect(page.locator("#field-capacity")).to_have_class("field changed")
    expect(page.locator("#field-capacity .default")).to_have_text(f"(default: {default})")
    scroll_to(page, "settings")
    shot("settings-against-defaults")

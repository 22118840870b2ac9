"""The Content-Security-Policy in Chromium (appliance/csp.py): every page of the UI, the
Swagger UI, DRF's browsable API and Django's admin load and work under it (the parts that
refresh themselves, the rate chart, actions and their confirmations) with no violation,
and the collector of violations does see one when the policy refuses something."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import PASSWORD, Shots, login
from django.contrib.auth.models import User
from playwright.sync_api import Page, Response, expect
from test_browser import make_channel, produce

from appliance import channels, tasks

pytestmark = pytest.mark.django_db(transaction=True)


def strict(response: Response | None) -> None:
    """The page came with a policy that allows no inline script."""
    assert response is not None and response.ok, response and response.url
    policy = response.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "unsafe" not in policy.split("style-src")[0]
    assert "object-src 'none'" in policy and "frame-ancestors 'none'" in policy


def a_channel_with_a_loss(root: Path, live_server: Any) -> None:
    """orders: events, rate samples, and a segment gone while closed (the Losses panel)."""
    row = make_channel(root, partitions=1, segment_bytes=4096)
    tasks.sample_metrics.apply()
    for batch in range(16):
        produce(live_server.url, "orders", [f"event {batch}-{i} " * 8 for i in range(10)])
    tasks.sample_metrics.apply()
    channels.close_all()
    sorted(Path(channels.to_config(row).partition_dir(0)).glob("*.log"))[1].unlink()


def test_it_runs_every_ui_page_under_the_policy_without_a_violation(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots,
        csp_violations: list[dict[str, Any]]) -> None:
    base = live_server.url
    a_channel_with_a_loss(root, live_server)
    strict(page.goto(f"{base}/login/"))
    login(page, base)
    strict(page.goto(f"{base}/"))
    expect(page.locator("#dashboard[data-refreshed]")).to_have_count(1)  # it refreshed
    expect(page.locator("tr[data-channel=orders] polyline.puts")).to_have_count(1)
    shot("dashboard")
    strict(page.goto(f"{base}/channels/orders/"))
    expect(page.locator("#channel-status[data-refreshed]")).to_have_count(1)  # it refreshed
    expect(page.locator("#losses")).to_contain_text("not acknowledged")
    assert page.locator("#channel-status svg.large polyline.puts").get_attribute("points")
    page.once("dialog", lambda dialog: dialog.dismiss())  # weir.js asks first
    page.click("#acknowledge-losses")
    expect(page.locator("#health")).to_have_text("degraded")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#acknowledge-losses")
    expect(page.locator(".messages")).to_contain_text("acknowledged")
    shot("channel")
    page.fill("#id_retention_ms", "3600000")  # the settings form
    page.click("button:has-text('Save settings')")
    expect(page.locator(".messages")).to_be_visible()
    page.fill("form.token-form input[name=name]", "loader")
    page.check("form.token-form input[value=consume]")
    page.click("button:has-text('Create token')")
    expect(page.locator("#token-key")).to_contain_text("weir_")
    page.click("text=Back to orders")
    page.click("button:has-text('Verify files')")
    expect(page.locator("#verdict")).to_be_visible()
    strict(page.goto(f"{base}/channels/orders/events?partition=0&offset=0"))
    expect(page.locator("#events tbody tr").first).to_be_visible()
    strict(page.goto(f"{base}/channels/new"))
    strict(page.goto(f"{base}/channels/orders/delete"))
    assert csp_violations == []

    page.goto(f"{base}/api/docs/")  # Swagger UI, its start-up script a file
    expect(page.locator(".opblock").first).to_be_visible()
    shot("swagger")
    page.goto(f"{base}/api/v1/channels/orders")  # DRF's browsable API
    expect(page.locator(".response-info")).to_contain_text('"name": "orders"')
    User.objects.create_superuser("root", password=PASSWORD)  # Django's admin
    page.context.clear_cookies()
    page.goto(f"{base}/admin/login/")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit]")
    page.goto(f"{base}/admin/auth/user/")
    expect(page.locator("#result_list")).to_be_visible()
    assert csp_violations == []

    # The collector is live: markup that would run a handler is refused and reported.
    page.evaluate("document.body.insertAdjacentHTML('beforeend', "
                  "'<img src=x onerror=\"window.__ran = 1\">')")
    page.wait_for_timeout(300)
    assert page.evaluate("window.__ran") is None
    assert any(v.get("directive") == "script-src-attr" for v in csp_violations), csp_violations

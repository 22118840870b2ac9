"""The event browser's search with script on: it runs as short steps, "Scanned N of M" and
the progress bar move after each, and Cancel stops it at once, keeping the hits found and
offering to go on with older events. Each step of the page is held by the test (a route)
and let through one at a time, so the counts seen do not depend on timing."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Shots, login
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, Route, expect
from test_browser import make_channel

from appliance import channels
from appliance.models import Channel
from appliance.ui import browser

pytestmark = pytest.mark.django_db(transaction=True)
EVENTS = 120
STEP_SCAN = 20  # each step scans at most this many: six steps for the whole channel


def fill(row: Channel) -> None:
    """EVENTS events, one a ms, every 25th a needle (a search merges partitions by time)."""
    with channels.open_channel(row).put() as tx:
        for i in range(EVENTS):
            body = f"order {i} {'needle' if i % 25 == 0 else 'hay'}".encode()
            tx.put(body=body, timestamp=1_795_000_000_000 + i)


class Steps:
    """The page's search steps, held until the test lets one through."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.held: list[Route] = []
        self.urls: list[str] = []
        page.route("**/events/step?*", self.hold)

    def hold(self, route: Route) -> None:
        self.urls.append(route.request.url)
        self.held.append(route)

    def release(self) -> None:
        """Let the next step through (waiting for the page to ask for it)."""
        for _ in range(200):
            if self.held:
                self.held.pop(0).continue_()
                return
            self.page.wait_for_timeout(25)
        raise AssertionError("the page asked for no further step")


def test_a_search_shows_progress_step_by_step_and_cancel_keeps_its_hits(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots,
        monkeypatch: pytest.MonkeyPatch, csp_violations: list[dict[str, Any]]) -> None:
    monkeypatch.setattr(browser, "STEP_SCAN", STEP_SCAN)
    fill(make_channel(root, partitions=2))
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/events")
    steps = Steps(page)
    page.fill("#search-contains", "needle")
    page.click("#search-form button[type=submit]")
    summary, bar, rows = (page.locator("#scan-summary"), page.locator("#search-bar"),
                          page.locator("#events tbody tr"))
    expect(page.locator("#search-cancel")).to_be_visible()
    expect(summary).to_have_attribute("aria-live", "polite")
    steps.release()
    expect(summary).to_have_text("Scanning: 20 of 120 events, 1 found so far.")
    expect(bar).to_have_attribute("value", "20")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("order 100 needle")
    shot("first-step")
    steps.release()
    expect(summary).to_have_text("Scanning: 40 of 120 events, 1 found so far.")
    steps.release()
    expect(summary).to_have_text("Scanning: 60 of 120 events, 2 found so far.")
    expect(bar).to_have_attribute("value", "60")
    expect(rows.nth(1)).to_contain_text("order 75 needle")
    shot("progress")
    assert "cursor=" not in steps.urls[0] and "cursor=" in steps.urls[1]
    assert all("scan_limit=20" in url and "contains=needle" in url for url in steps.urls)

    expect(page.locator("#search-cancel")).to_be_focused()
    for _ in range(50):  # the fourth step is asked for, in flight when Cancel is pressed
        if steps.held:
            break
        page.wait_for_timeout(25)
    page.click("#search-cancel")
    expect(summary).to_have_text("Cancelled after scanning 60 of 120 events: 2 shown.")
    expect(page.locator("#search-cancel")).to_be_hidden()
    steps.held.pop(0).continue_()  # the aborted step: its answer must change nothing
    page.wait_for_timeout(300)
    expect(summary).to_have_text("Cancelled after scanning 60 of 120 events: 2 shown.")
    expect(rows).to_have_count(2)
    assert len(steps.urls) == 4 and not steps.held  # no step after Cancel
    older = page.locator("#search-older")
    expect(older).to_have_text("Search older events")
    expect(older).to_be_focused()
    shot("cancelled")

    page.unroute("**/events/step?*")
    older.click()  # the plain server-side search from the cancelled one's cursor
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_contain_text("order 50 needle")
    expect(rows.nth(2)).to_contain_text("order 0 needle")
    expect(summary).to_contain_text("Scanned 120 of 120 events")
    shot("went-on-with-older-events")
    assert not csp_violations  # the steps run from the appliance's own script file


def test_a_search_runs_to_the_end_of_the_channel_at_phone_width_then_tails(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser, "STEP_SCAN", STEP_SCAN)
    row = make_channel(root, partitions=2)
    fill(row)
    page.set_viewport_size({"width": 390, "height": 844})
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/events")
    steps: list[str] = []
    page.on("request", lambda r: steps.append(r.url) if "/events/step?" in r.url else None)
    page.fill("#search-contains", "needle")
    page.click("#search-form button[type=submit]")
    summary = page.locator("#scan-summary")
    expect(summary).to_have_text("Scanned 120 of 120 events, newest first: 5 shown.")
    rows = page.locator("#events tbody tr")
    expect(rows).to_have_count(5)
    expect(page.locator("#search-older")).to_be_hidden()
    assert len(steps) == EVENTS // STEP_SCAN  # six steps of 20: the last one reaches offset 0
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert "contains=needle" in page.url  # a reload gives the same search server-side
    shot("done-at-390px")
    with channels.open_channel(row).put() as tx:  # the search's live tail shows what comes
        tx.put(body=b"order 120 needle", timestamp=1_795_000_000_200)
        tx.put(body=b"order 121 hay", timestamp=1_795_000_000_201)
    expect(rows).to_have_count(6)
    expect(rows.first).to_contain_text("order 120 needle")
    expect(page.locator("#tail-toggle")).to_be_visible()
    page.go_back()  # the page before the search: its latest events again
    expect(page.locator("#search-contains")).to_have_value("")
    expect(rows).to_have_count(50)
    expect(rows.first).to_contain_text("order 121 hay")
    page.fill("#search-contains", "needle")
    page.fill("#search-regex", "(unclosed")
    page.click("#search-form button[type=submit]")
    expect(page.locator("#error-regex")).to_contain_text("not an RE2 regular expression")


def test_without_script_the_search_form_is_one_bounded_request(
        browser: Browser, live_server: Any, root: Path, operator: User) -> None:
    fill(make_channel(root, partitions=2))
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    steps: list[str] = []
    page.on("request", lambda r: steps.append(r.url) if "/events/step" in r.url else None)
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/events")
    page.fill("#search-contains", "needle")
    page.click("#search-form button[type=submit]")
    expect(page.locator("#scan-summary")).to_have_text(
        "Scanned 120 of 120 events, newest first: 5 shown.")
    expect(page.locator("#search-cancel")).to_have_count(0)  # only inside the <template>
    assert not steps
    context.close()

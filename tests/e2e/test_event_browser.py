"""The message browser in a real browser: the latest events of every partition newest
first, a search with its hit on another partition and "search older" going on past a
bounded scan, JSON bodies as a foldable tree with a text/hex switch, copy body, copy as
curl (the copied command, run, produces the same event) and download."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Shots, login
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from test_browser import make_channel

from appliance import channels
from appliance.models import ApiToken, Channel

pytestmark = pytest.mark.django_db(transaction=True)


def put_each(row: Channel, *events: dict[str, Any]) -> list[tuple[int, int]]:
    """Each event in a transaction of its own (keyless ones go round-robin); where they went."""
    placed = []
    for event in events:
        with channels.open_channel(row).put() as tx:
            tx.put(**event)
        placed.append(tx.committed[0][:2])
    return placed


def test_search_finds_a_hit_on_another_partition_and_goes_on_with_older_events(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = make_channel(root, partitions=3)
    at = 1_795_000_000_000
    needle = put_each(row, {"body": b"order 17 needle", "key": b"k17", "timestamp": at})[0]
    put_each(row, *({"body": f"order {i}".encode(), "headers": {"shop": b"north"},
                     "timestamp": at + i} for i in range(1, 10)))
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    page.click("text=Browse events")
    rows = page.locator("#events tbody tr")
    expect(rows).to_have_count(10)
    expect(rows.first).to_contain_text("order 9")
    expect(page.locator("#scan-summary")).to_contain_text("Scanned 10 of 10 events")
    newest_partition = rows.first.get_attribute("data-partition")
    assert newest_partition != str(needle[0])
    shot("latest-events")
    page.fill("#search-contains", "needle")
    page.click("#search-form button[type=submit]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-partition", str(needle[0]))
    expect(rows.first).to_have_attribute("data-offset", str(needle[1]))
    expect(rows.first).to_contain_text("order 17 needle")
    shot("search-hit-on-another-partition")
    page.fill("#search-contains", "")
    page.fill("#search-header", "shop:north")
    page.fill("#search-regex", r"order [2-4]$")
    page.click("#search-form button[type=submit]")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("order 4")

    page.goto(f"{live_server.url}/channels/orders/events?key=k17&scan_limit=4")
    expect(page.locator("#scan-summary")).to_contain_text("Scanned 4 of 10 events")
    expect(page.locator("#scan-summary")).to_contain_text("stopped at the scan limit")
    expect(page.locator("#search-older")).to_have_text("Search older events")
    shot("bounded-scan")
    page.click("#search-older")
    expect(page.locator("#scan-summary")).to_contain_text("Scanned 8 of 10 events")
    page.click("#search-older")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("order 17 needle")
    expect(page.locator("#search-older")).to_have_count(0)

    page.fill("#search-regex", "(unclosed")
    page.click("#search-form button[type=submit]")
    expect(page.locator("#error-regex")).to_contain_text("not an RE2 regular expression")
    page.fill("#search-regex", "(?=lookahead)")  # Python's re, not RE2
    page.click("#search-form button[type=submit]")
    expect(page.locator("#error-regex")).to_contain_text("not an RE2 regular expression")


def test_a_json_body_is_a_foldable_tree_with_text_and_hex_copy_curl_and_download(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = make_channel(root, partitions=2)
    body = json.dumps({"order": {"id": 42, "lines": [{"sku": "A-1", "qty": 2}]},
                       "paid": True, "note": "it's <b>fine</b>"}).encode()
    before = int(time.time() * 1000) - 10_000  # older than the event the curl makes
    put_each(row, {"body": body, "key": b"order-42", "headers": {"source": b"shop"},
                   "timestamp": before},
             {"body": b"\x00\x01\xfe binary", "timestamp": before + 1})
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/events")
    cell = page.locator("#events tbody tr").nth(1).locator("td.body")
    expect(cell).to_have_attribute("data-view", "json")
    tree = cell.locator(".json-tree")
    expect(tree).to_be_visible()
    expect(tree.locator(".json-key").first).to_have_text('"order"')
    expect(tree).to_contain_text('"it\'s <b>fine</b>"')  # shown as text, never markup
    assert tree.locator("b").count() == 0
    inner = tree.locator("details details").first
    expect(inner.locator(".json-key").first).to_be_visible()
    shot("json-tree")
    inner.locator("summary").first.click()  # fold {"id": 42, ...}
    expect(inner.locator(".json-key").first).to_be_hidden()
    shot("json-folded")
    cell.locator("[data-show=text]").click()
    expect(cell.locator("pre.body.text")).to_be_visible()
    expect(cell.locator("pre.body.text")).to_have_text(body.decode())
    expect(tree).to_be_hidden()
    cell.locator("[data-show=hex]").click()
    expect(cell.locator("pre.hex")).to_be_visible()
    expect(cell.locator("pre.hex")).to_contain_text("7b 22 6f 72 64 65 72 22")  # {"order"
    binary = page.locator("#events tbody tr").nth(0).locator("td.body")
    expect(binary).to_have_attribute("data-view", "hex")
    expect(binary.locator("[data-show=json], [data-show=text]")).to_have_count(0)
    shot("switched-to-hex")

    cell.locator(".copy-body").click()
    expect(cell.locator(".copied")).to_have_text("Body copied")
    assert page.evaluate("navigator.clipboard.readText()") == body.decode()
    cell.locator(".copy-curl").click()
    expect(cell.locator(".copied")).to_have_text("curl command copied")
    command = page.evaluate("navigator.clipboard.readText()")
    assert command.startswith(f"curl -X POST '{live_server.url}/api/v1/channels/orders/events'")
    _, token = ApiToken.issue("curl", ["produce"])
    done = subprocess.run(["sh", "-c", command], env={**os.environ, "TOKEN": token},
                          capture_output=True, text=True, timeout=30, check=True)
    assert json.loads(done.stdout)["events"] == 1
    page.reload()
    newest = page.locator("#events tbody tr").first
    expect(newest.locator("td").nth(3)).to_have_text("order-42")
    expect(newest.locator("td").nth(4)).to_contain_text("source: shop")
    expect(newest.locator("pre.body.text")).to_have_text(body.decode())

    with page.expect_download() as download:
        page.locator("#events tbody tr").nth(1).locator(".download").click()
    path = download.value.path()
    assert Path(path).read_bytes() == b"\x00\x01\xfe binary"
    assert download.value.suggested_filename.startswith("orders-")


def test_the_live_tail_shows_new_events_without_a_reload_and_pauses(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = make_channel(root, partitions=2)
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/events")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloaded
    expect(page.locator("#no-events")).to_have_text("No events yet.")
    expect(page.locator("#events")).to_be_hidden()
    put_each(row, {"body": b"the first"})
    rows = page.locator("#events tbody tr")
    expect(rows).to_have_count(1)
    expect(page.locator("#events")).to_be_visible()
    expect(page.locator("#no-events")).to_have_count(0)
    now = int(time.time() * 1000)  # apart: two puts in one ms would tie across partitions
    put_each(row, {"body": b"arrived meanwhile 1", "timestamp": now},
             {"body": b'{"live": true}', "timestamp": now + 1})
    expect(rows).to_have_count(3)
    expect(rows.first.locator(".json-tree")).to_contain_text('"live"')
    expect(rows.nth(1)).to_contain_text("arrived meanwhile 1")
    shot("live-tail")
    page.click("#tail-toggle")
    expect(page.locator("#tail-state")).to_contain_text("Paused")
    put_each(row, {"body": b"while paused", "timestamp": now + 2})
    page.wait_for_timeout(1500)  # three polls' worth (WEIR_UI_REFRESH_S is 0.5 here)
    expect(rows).to_have_count(3)
    shot("live-tail-paused")
    page.click("#tail-toggle")
    expect(rows.first).to_contain_text("while paused")
    expect(rows).to_have_count(4)
    assert page.evaluate("window.__sameDocument") is True


def test_an_operator_produces_a_test_event_with_key_and_headers_from_the_ui(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    row = make_channel(root, partitions=2)
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/events")
    expect(page.locator("#no-events")).to_have_text("No events yet.")
    page.click("#produce-panel summary")
    page.fill("#produce-key", "order-9")
    page.fill("#produce-headers", "source:browser\nlevel: debug")  # the value as typed
    page.fill("#produce-body", '{"order": 9,\n "items": [1, 2]}')  # sent with CRLF
    shot("produce-form")
    page.click("#produce-form button[type=submit]")
    expect(page.locator(".messages")).to_contain_text("Event produced to partition")
    rows = page.locator("#events tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td").nth(3)).to_have_text("order-9")
    expect(rows.first.locator("td").nth(4)).to_contain_text("source: browser")
    expect(rows.first.locator("td").nth(4)).to_contain_text("level: debug")
    expect(rows.first.locator(".json-tree")).to_contain_text('"items"')
    shot("produced")
    [event] = channels.open_channel(row).read(int(rows.first.get_attribute("data-partition")),
                                              0, 10)
    assert event.headers == {"source": b"browser", "level": b" debug"}
    assert event.body == b'{"order": 9,\n "items": [1, 2]}'  # CRLF back to LF

    page.click("#produce-panel summary")
    page.fill("#produce-headers", "no colon")
    page.fill("#produce-body", "kept")
    page.click("#produce-form button[type=submit]")
    expect(page.locator("#produce-error-headers")).to_have_text("line 1 is not name:value")
    expect(page.locator("#produce-body")).to_have_value("kept")
    expect(rows).to_have_count(1)
    shot("produce-refused")


def luminance(css_color: str) -> float:
    """Relative brightness 0..1 of an rgb()/rgba() colour as getComputedStyle gives it."""
    red, green, blue = (int(v) for v in re.findall(r"\d+", css_color)[:3])
    return (0.2126 * red + 0.7152 * green + 0.0722 * blue) / 255


def test_dark_mode_follows_the_system_and_a_phone_keeps_the_body_in_view(
        browser: Any, live_server: Any, root: Path, operator: User,
        request: pytest.FixtureRequest) -> None:
    row = make_channel(root, partitions=2)
    put_each(row, {"body": json.dumps({"id": 1, "text": "a long line " * 20}).encode(),
                   "key": b"customer-000123",
                   "headers": {"source": b"phone", "trace": b"x" * 60}},
             {"body": b"plain text body"})
    for scheme, width in (("dark", 1366), ("light", 390), ("dark", 390)):
        context = browser.new_context(color_scheme=scheme,
                                      viewport={"width": width, "height": 844})
        try:
            page = context.new_page()
            login(page, live_server.url)
            page.goto(f"{live_server.url}/channels/orders/events")
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            card = page.evaluate("getComputedStyle(document.querySelector('#events td.body'))"
                                 ".color")
            assert (luminance(background) < 0.2) == (scheme == "dark"), background
            assert (luminance(card) > 0.6) == (scheme == "dark"), card  # ink readable on it
            for body in page.locator("#events td.body").all():
                box = body.bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, box
                expect(body.locator(".json-tree, pre.body.text").first).to_be_visible()
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            Shots(page, f"{request.node.name}-{scheme}-{width}")("events")
        finally:
            context.close()

"""Markup stored in every field of an event is shown as its literal text and never runs, in
every page that shows events: the event browser (text and hex previews of bodies, keys
and header values; header names; the query echoed back) and DRF's browsable API of the
events endpoint. Events come over the produce API (text) and straight through the engine
(bytes, shown as hex). A page passes when its window has no __xss, it holds none of the
markup's elements, the browser reported no CSP violation (markup that got into the page
would have been refused and reported), and the literal text is visible."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import Shots, login
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from test_browser import make_channel

from appliance import channels
from appliance.models import ApiToken
from appliance.ui.preview import preview

pytestmark = pytest.mark.django_db(transaction=True)

MARKUP = [
    "<img src=x onerror=window.__xss=1>",
    '"><script>window.__xss=1</script>',
    "<a href=\"javascript:window.__xss=1\" id=\"xss-link\">javascript: link</a>",
    "'><svg onload=window.__xss=1></svg>",
    "</pre></td><iframe srcdoc=\"<script>parent.__xss=1</script>\"></iframe>",
]
INJECTED = "img, script:not([src]), svg:not(.chart), iframe, a[href^='javascript']"


def produce_text_events(base: str) -> None:
    """Markup as the body, the key, and every header name and value, over the API."""
    _, key = ApiToken.issue("producer", ["produce"])
    events = [{"body": m, "key": m, "headers": {m: m, f"h{i}": m}}
              for i, m in enumerate(MARKUP)]
    request = urllib.request.Request(
        f"{base}/api/v1/channels/orders/events", method="POST",
        data=json.dumps({"events": events}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.load(response)["events"] == len(MARKUP)


def binary(markup: str) -> bytes:
    """The markup inside bytes that are not UTF-8: previewed as hex with an ASCII column."""
    return b"\x00\xff" + markup.encode() + b"\xfe"


def put_binary_events(row: Any) -> None:
    with channels.open_channel(row).put() as tx:
        for markup in MARKUP:
            tx.put(binary(markup), key=binary(markup), headers={markup: binary(markup)})


def assert_nothing_ran(page: Page, violations: list[dict[str, Any]], within: str) -> None:
    page.wait_for_timeout(300)  # an onerror or onload would have fired by now
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.locator(within).locator(INJECTED).count() == 0
    assert violations == []


def test_it_shows_markup_in_every_event_field_as_text_and_runs_none_of_it(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots,
        csp_violations: list[dict[str, Any]]) -> None:
    row = make_channel(root, partitions=1)
    produce_text_events(live_server.url)
    put_binary_events(row)
    login(page, live_server.url)

    page.goto(f"{live_server.url}/channels/orders/events?partition=0&offset=0")
    rows = page.locator("#events tbody tr")
    expect(rows).to_have_count(2 * len(MARKUP))
    for i, markup in enumerate(MARKUP):
        text, raw = rows.nth(i), rows.nth(len(MARKUP) + i)
        expect(text.locator("pre.body.text")).to_have_text(markup)
        expect(text.locator("td").nth(3).locator("pre.text")).to_have_text(markup)  # key
        expect(text.locator("td").nth(4).locator("strong").first).to_have_text(markup)
        expect(text.locator("td").nth(4).locator("pre.text")).to_have_text([markup, markup])
        hexdump = preview(binary(markup)).text  # "<img src=x onerr" in its ASCII column
        assert "<" in hexdump
        expect(raw.locator("pre.body.hex")).to_have_text(hexdump)
        expect(raw.locator("td").nth(3).locator("pre.hex")).to_have_text(hexdump)
        expect(raw.locator("td").nth(4).locator("strong")).to_have_text(markup)
        expect(raw.locator("td").nth(4).locator("pre.hex")).to_have_text(hexdump)
    assert_nothing_ran(page, csp_violations, "main")
    shot("event-browser")

    for query in ("time", "offset"):  # the query is echoed back with its error
        page.goto(f"{live_server.url}/channels/orders/events?partition=0&{query}="
                  + urllib.request.quote(MARKUP[1]))
        expect(page.locator(f"#{query}")).to_have_value(MARKUP[1])
        assert_nothing_ran(page, csp_violations, "main")

    page.goto(f"{live_server.url}/api/v1/channels/orders/partitions/0/events?offset=0")
    info = page.locator(".response-info")  # DRF's browsable API, as JSON text
    for markup in MARKUP:
        expect(info).to_contain_text(json.dumps(markup)[1:-1])
    assert_nothing_ran(page, csp_violations, ".response-info")
    shot("browsable-api")

"""The channel page's task runs and rate chart in Chromium: runs readable (when, how long,
what each did, in labelled fields, never the tasks' internal names), the runs that found
nothing to do folded into one counted line that opens and stays open while the page
refreshes itself, and the rate chart of the last hour with its axes labelled (time in UTC,
events/s), on a laptop and on a phone. Screenshots under test-output/e2e/."""
from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Shots, login
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect
from test_browser import make_channel, scroll_to

from appliance.models import ChannelSample, TaskRun

pytestmark = pytest.mark.django_db(transaction=True)
IDLE = 12


def record(task: str, outcome: str, ago: timedelta, **fields: Any) -> None:
    TaskRun.objects.create(task=f"weir.{task}", channel="orders", outcome=outcome,
                           started_at=timezone.now() - ago, duration_ms=fields.pop("took", 2.5),
                           error=fields.pop("error", ""), detail=fields)


def an_hour_of_runs_and_samples() -> None:
    """A checkpoint and a retention run that did something, IDLE checks between them that
    found nothing, a failed one; samples every 5 minutes with traffic growing."""
    record("checkpoint_channel", "ok", timedelta(seconds=20), took=4.2, sequence=31,
           written_at_ms=int(timezone.now().timestamp() * 1000) - 20_000, duration_ms=4.1,
           lock_held_ms=0.6, backup="off", segments_deleted=1, journals_removed=2)
    for n in range(IDLE):
        if n % 2:
            record("checkpoint_channel", "nothing due", timedelta(minutes=1 + n),
                   checkpoint_age_ms=30_000)
        else:
            record("retention_channel", "ok", timedelta(minutes=1 + n), segments_deleted=0,
                   events_dropped=0, files_unlinked=0)
    record("retention_channel", "failed", timedelta(minutes=20), took=1250,
           error="StorageError: disk gone")
    record("retention_channel", "ok", timedelta(minutes=25), took=310, segments_deleted=3,
           events_dropped=0, files_unlinked=6)
    now = timezone.now()
    for n in range(13):  # oldest first: 58 min ago to now
        puts = sum(1000 * k for k in range(n + 1))
        ChannelSample.objects.create(channel="orders", at=now - timedelta(minutes=58 - 4.8 * n),
                                     events_untaken=0, events_in_flight=0, put_successes=puts,
                                     take_successes=puts // 2, unflushed_events=0,
                                     bytes_on_disk=0, checkpoint_age_ms=0)


def test_task_runs_read_plainly_and_idle_runs_fold_away(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    make_channel(root)
    an_hour_of_runs_and_samples()
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/#runs")
    runs = page.locator("#task-runs")
    expect(runs).to_be_visible()
    text = runs.inner_text()
    assert "weir." not in text and "{" not in text  # no internal names, no raw JSON
    first = runs.locator("tr.task-run").first
    expect(first).to_contain_text("Checkpoint")
    expect(first.locator("td.when time")).to_have_text(re.compile(r"\w{3} \d+, \d\d:\d\d:\d\d"))
    expect(first.locator("td.when .muted")).to_have_text(re.compile(r"\d+ s ago"))
    expect(first).to_contain_text("4.2 ms")
    labels = dict(zip(first.locator("dt").all_inner_texts(),
                      first.locator("dd").all_inner_texts(), strict=True))
    assert {"Checkpoint": "#31", "Channel held": "0.6 ms", "Segments deleted": "1",
            "Writing took": "4.1 ms"}.items() <= labels.items()
    folded = runs.locator("tr.idle-runs")
    expect(folded).to_have_count(1)
    expect(folded.locator("summary")).to_contain_text(
        f"{IDLE} runs found nothing to do (retention check, checkpoint) between")
    hidden = folded.locator("tr.task-run")
    expect(hidden).to_have_count(IDLE)
    expect(hidden.first).to_be_hidden()
    failed = runs.locator("tr.task-run.failed")
    expect(failed).to_contain_text("StorageError: disk gone")
    expect(failed).to_contain_text("1.2 s")  # 1250 ms
    scroll_to(page, "runs")
    shot("runs-folded", full_page=False)

    folded.locator("summary").click()
    expect(hidden.first).to_be_visible()
    expect(hidden.nth(1)).to_contain_text("Last checkpoint")
    # a check that found nothing joins the folded runs while they are open: the part
    # refreshes itself, the count grows, and they stay open
    record("checkpoint_channel", "nothing due", timedelta(seconds=40), checkpoint_age_ms=1)
    expect(folded.locator("summary .count")).to_have_text(str(IDLE + 1), timeout=10_000)
    expect(page.locator("tr.idle-runs details")).to_have_attribute("open", "")
    scroll_to(page, "runs")
    shot("runs-unfolded", full_page=False)


def test_the_rate_chart_shows_the_last_hour_with_labelled_axes(
        page: Page, live_server: Any, root: Path, operator: User, shot: Shots) -> None:
    make_channel(root)
    an_hour_of_runs_and_samples()
    login(page, live_server.url)
    page.goto(f"{live_server.url}/channels/orders/")
    chart = page.locator("#rates svg.chart.large")
    expect(chart).to_be_visible()
    expect(chart.locator("text.axis-title")).to_have_text(["time (UTC)", "events/s"])
    times = chart.locator("text.time-label").all_text_contents()
    assert 4 <= len(times) <= 5 and all(re.fullmatch(r"\d\d:[0134][05]", t) for t in times)
    # 40 events/s at most
    assert chart.locator("text.rate-label").all_text_contents() == ["0", "25", "50"]
    points = chart.locator("polyline.puts").get_attribute("points") or ""
    assert len(points.split()) == 12  # 13 samples: 12 rates
    box = chart.bounding_box()
    assert box is not None and box["width"] >= 600  # readable, not a thumbnail
    scroll_to(page, "rates")
    shot("rate-chart", full_page=False)
    # the status part refreshes itself and may replace the chart mid-shot: clip the page
    box = chart.bounding_box()
    assert box is not None
    page.screenshot(path=str(shot.directory / "rate-chart-alone.png"), clip=box)

    page.goto(f"{live_server.url}/")
    small = page.locator("tr[data-channel=orders] svg.chart")
    expect(small.locator("text.axis-title")).to_have_text(["time (UTC)", "events/s"])
    expect(small.locator("text.time-label")).to_have_count(len(times))
    shot("dashboard-chart")

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_server.url}/channels/orders/")
    phone = page.locator("#rates svg.chart.phone")  # the small drawing, labels readable
    expect(chart).to_be_hidden()
    expect(phone).to_be_visible()
    expect(phone.locator("text.axis-title")).to_have_text(["time (UTC)", "events/s"])
    scroll_to(page, "rates")
    box = phone.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 391  # fits a phone
    assert box["width"] >= 300  # drawn at 240 wide: scaled up, never down
    shot("rate-chart-phone", full_page=False)

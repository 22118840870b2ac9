"""The rate charts' axes (appliance/ui/charts.py): a round top in events/s, labels an
operator reads, a tick at each quarter hour of the last hour with its UTC clock time, and
the rates drawn inside the plot; "now" only from a recent sample, else why not."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.template.loader import render_to_string
from django.utils import timezone

from appliance.models import ChannelSample
from appliance.ui import charts
from appliance.ui.charts import LARGE, SMALL, Series


@pytest.mark.parametrize(("rate", "top"), [(0, 1), (0.4, 1), (1.2, 2), (3, 5), (7, 10),
                                           (10, 10), (11, 20), (4_100, 5_000)])
def test_the_rate_axis_ends_at_a_round_number(rate: float, top: float) -> None:
    assert charts.round_top(rate) == top


def test_rate_labels_are_short() -> None:
    assert [charts.rate_label(r) for r in (0, 0.5, 2.5, 500, 20_000, 1_500_000)] == \
        ["0", "0.5", "2.5", "500", "20k", "1.5M"]


def test_time_ticks_are_the_quarter_hours_of_the_window_as_clock_times() -> None:
    start = datetime(2026, 11, 29, 1, 18, 30, tzinfo=UTC)
    ticks = charts.time_ticks(SMALL, start)
    assert [t["label"] for t in ticks] == ["01:30", "01:45", "02:00", "02:15"]
    xs = [float(str(t["x"])) for t in ticks]
    assert SMALL.left < xs[0] < xs[-1] < SMALL.width - SMALL.right
    assert xs[1] - xs[0] == pytest.approx(SMALL.plot_width / 4, abs=0.2)


def test_rates_are_drawn_inside_the_plot() -> None:
    series = Series([0.0, 1800.0, 3600.0], [0.0, 5.0, 10.0])
    points = [tuple(map(float, p.split(","))) for p in series.points(LARGE, 10.0).split()]
    assert points[0] == (LARGE.left, LARGE.plot_bottom)
    assert points[-1] == (LARGE.width - LARGE.right, LARGE.top)
    assert [label["label"] for label in charts.rate_ticks(LARGE, 10.0)] == ["0", "5", "10"]


NOW = datetime(2026, 11, 29, 3, 0, 0, tzinfo=UTC)


def sample(seconds_ago: float, puts: int, now: datetime = NOW) -> ChannelSample:
    """A sample (not saved) of channel orders `seconds_ago` before `now`."""
    return ChannelSample(channel="orders", at=now - timedelta(seconds=seconds_ago),
                         events_untaken=0, events_in_flight=0, put_successes=puts,
                         take_successes=0, unflushed_events=0, bytes_on_disk=0)


@pytest.mark.parametrize(("ages", "note"), [
    ((), "no samples yet"),
    ((5,), "one sample: a rate needs two"),
    ((25, 15), None),  # the last 15 s old: within two 10 s intervals
    ((3000, 2990), "no sample since 02:10 UTC"),  # 50 min: not "now"
])
def test_a_rate_is_now_only_while_the_last_sample_is_recent(ages: tuple[int, ...],
                                                             note: str | None) -> None:
    samples = [sample(age, 10 * i) for i, age in enumerate(ages)]
    assert charts.no_rate_now(samples, NOW, 10.0) == note


@pytest.mark.django_db
def test_the_charts_give_no_rate_now_from_an_old_sample(settings: Any) -> None:
    settings.WEIR_SAMPLE_INTERVAL_S = 10.0
    now = timezone.now()
    for minutes, puts in ((50, 0), (40, 600)):  # the sampler stopped 40 min ago
        sample(minutes * 60, puts, now).save()
    chart = charts.channel_charts("orders", LARGE)
    assert chart["put_points"] and chart["put_rate"] is None and chart["take_rate"] is None
    assert chart["note"] == f"no sample since {now - timedelta(minutes=40):%H:%M} UTC"
    html = render_to_string("ui/_chart.html", {"charts": chart})
    assert "; 2 samples</title>" in html


@pytest.mark.django_db
def test_one_sample_says_a_rate_needs_two_in_the_card_and_the_chart() -> None:
    sample(0, 5, timezone.now()).save()
    chart = charts.channel_charts("orders", LARGE)
    assert chart["put_rate"] is None and chart["note"] == "one sample: a rate needs two"
    html = render_to_string("ui/_chart.html", {"charts": chart})
    assert "; 1 sample</title>" in html and ">one sample: a rate needs two</text>" in html

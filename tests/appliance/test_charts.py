"""The rate charts' axes (appliance/ui/charts.py): a round top in events/s, labels an
operator reads, a tick at each quarter hour of the last hour with its UTC clock time, and
the rates drawn inside the plot."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

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

"""Put and take rates from the metrics sampler's ChannelSamples, as SVG charts of the last
hour with labelled axes: time (UTC clock times at each quarter hour) and events/s (0, half
and a round top).

A rate is the difference of a counter between two samples over the time between them.
Counters restart when a channel's owner changes (a worker restarted): a falling counter
is a restart, and that interval's rate is the counter's new value over the interval.

"Rates now" is the last interval's rate only while the last sample is recent (within
STALE_AFTER sampler intervals, WEIR_SAMPLE_INTERVAL_S): a sampler stopped for most of the
hour would otherwise show a rate that old as the current one. Else a note says why there is
none (no samples, one sample, or the time of the last).

Two sizes, one drawing: SMALL in the dashboard's table, LARGE on a channel's page. The
geometry (the plot inside its margins, the ticks) is computed here; _chart.html draws it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from appliance.models import ChannelSample

WINDOW = timedelta(hours=1)
TICK = timedelta(minutes=15)
STALE_AFTER = 2  # sampler intervals after which the last sample's rate is no longer "now"


@dataclass(frozen=True)
class Frame:
    """A chart's size and the margins its axis labels take (SVG user units = px)."""

    width: int
    height: int
    left: int = 34  # the events/s labels
    bottom: int = 24  # the time labels and the axis title
    top: int = 8
    right: int = 8

    @property
    def plot_width(self) -> int:
        """The plot's width inside the margins."""
        return self.width - self.left - self.right

    @property
    def plot_bottom(self) -> int:
        """The y of the plot's baseline (0 events/s)."""
        return self.height - self.bottom

    def x(self, seconds: float) -> float:
        """The x of a time, in seconds since the start of the window."""
        return self.left + self.plot_width * seconds / WINDOW.total_seconds()

    def y(self, rate: float, top: float) -> float:
        """The y of a rate on an axis from 0 to `top`."""
        return self.plot_bottom - (self.plot_bottom - self.top) * rate / top


SMALL = Frame(240, 92, bottom=30)
LARGE = Frame(640, 200, left=44, bottom=36)


@dataclass(frozen=True)
class Series:
    """Rates (events/s) at times (s since the start of the window)."""

    times: list[float]
    rates: list[float]

    @property
    def last(self) -> float | None:
        """The latest rate (None without two samples)."""
        return self.rates[-1] if self.rates else None

    def points(self, frame: Frame, top: float) -> str:
        """The SVG polyline's points in `frame`, on an axis from 0 to `top` events/s."""
        return " ".join(f"{frame.x(t):.1f},{frame.y(r, top):.1f}"
                        for t, r in zip(self.times, self.rates, strict=True))


def rates(samples: Sequence[ChannelSample], counter: str, start: datetime) -> Series:
    """The rate of `counter` between consecutive samples (oldest first)."""
    times, values = [], []
    for before, after in zip(samples, samples[1:], strict=False):
        seconds = (after.at - before.at).total_seconds()
        if seconds <= 0:
            continue
        old, new = getattr(before, counter), getattr(after, counter)
        delta = new - old if new >= old else new  # fell: the owner restarted its counters
        times.append((after.at - start).total_seconds())
        values.append(delta / seconds)
    return Series(times, values)


def no_rate_now(samples: Sequence[ChannelSample], now: datetime,
                interval_s: float) -> str | None:
    """Why the samples (oldest first) give no current rate; None when they do."""
    if not samples:
        return "no samples yet"
    if len(samples) == 1:
        return "one sample: a rate needs two"
    last = samples[-1].at
    if now - last > timedelta(seconds=STALE_AFTER * interval_s):
        return f"no sample since {last.astimezone(UTC):%H:%M} UTC"
    return None


def round_top(rate: float) -> float:
    """The axis top: the smallest 1, 2 or 5 times a power of ten at or above `rate` (1 for
    no traffic)."""
    if rate <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(rate))
    return float(next(step * power for step in (1, 2, 5, 10) if step * power >= rate))


def rate_label(rate: float) -> str:
    """An axis value: '0', '2.5', '500', '20k', '1.5M'."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if rate >= size:
            return f"{rate / size:g}{unit}"
    return f"{rate:g}"


def time_ticks(frame: Frame, start: datetime) -> list[dict[str, object]]:
    """Each quarter hour in the window: its x and its UTC clock time."""
    first = start.replace(minute=0, second=0, microsecond=0)
    ticks = []
    at = first
    while at <= start + WINDOW:
        if at >= start:
            ticks.append({"x": round(frame.x((at - start).total_seconds()), 1),
                          "label": at.strftime("%H:%M")})
        at += TICK
    return ticks


def rate_ticks(frame: Frame, top: float) -> list[dict[str, object]]:
    """0, half the top and the top: their y and labels."""
    return [{"y": round(frame.y(rate, top), 1), "label": rate_label(rate)}
            for rate in (0.0, top / 2, top)]


def channel_charts(name: str, frame: Frame = SMALL) -> dict[str, object]:
    """The last hour of put and take rates of one channel, ready for _chart.html; with
    LARGE (a channel's page), the SMALL drawing too under "phone" (weir.css shows it on a
    narrow screen, where the large one's labels would shrink past reading)."""
    now = timezone.now()
    start = now - WINDOW
    samples = list(ChannelSample.objects.filter(channel=name, at__gte=start).order_by("at"))
    puts, takes = rates(samples, "put_successes", start), rates(samples, "take_successes", start)
    chart = drawing(puts, takes, frame, start, len(samples))
    # a rate the last two samples make, while they are recent; else why not
    note = no_rate_now(samples, now, settings.WEIR_SAMPLE_INTERVAL_S)
    if puts.last is None:  # two samples at one instant make none either
        note = note or "one sample: a rate needs two"
    if note:
        chart.update(put_rate=None, take_rate=None)
    chart["note"] = note
    if frame is LARGE:
        chart["phone"] = drawing(puts, takes, SMALL, start, len(samples))
    return chart


def drawing(puts: Series, takes: Series, frame: Frame, start: datetime,
            samples: int) -> dict[str, object]:
    """One chart of the two series in `frame`: what _chart.html draws."""
    top = round_top(max([*puts.rates, *takes.rates, 0.0]))
    empty = "no samples yet" if not samples else "one sample: a rate needs two"
    return {"frame": frame, "top": top, "samples": samples, "large": frame is LARGE,
            "empty": empty,  # shown instead of the lines when there are none
            "put_points": puts.points(frame, top), "take_points": takes.points(frame, top),
            "put_rate": puts.last, "take_rate": takes.last,
            "time_ticks": time_ticks(frame, start), "rate_ticks": rate_ticks(frame, top),
            "plot_right": frame.width - frame.right, "mid_x": frame.left + frame.plot_width / 2,
            "mid_y": (frame.top + frame.plot_bottom) / 2,
            # text is centred on its y (dominant-baseline: middle in weir.css)
            "time_label_y": frame.plot_bottom + frame.bottom * 0.35,
            "time_title_y": frame.height - frame.bottom * 0.22}

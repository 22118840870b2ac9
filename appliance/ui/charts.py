"""Put and take rates from the metrics sampler's ChannelSamples, as small SVG charts.

A rate is the difference of a counter between two samples over the time between them.
Counters restart when a channel's owner changes (a worker restarted): a falling counter
is a restart, and that interval's rate is the counter's new value over the interval.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from appliance.models import ChannelSample

WIDTH, HEIGHT = 160, 36
WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class Series:
    """Rates (events/s) at times (s since the start of the window)."""

    times: list[float]
    rates: list[float]

    @property
    def last(self) -> float | None:
        """The latest rate (None without two samples)."""
        return self.rates[-1] if self.rates else None

    def points(self, top: float) -> str:
        """The SVG polyline's points, scaled to `top` events/s."""
        span = WINDOW.total_seconds()
        top = top or 1.0
        return " ".join(f"{WIDTH * t / span:.1f},{HEIGHT - 2 - (HEIGHT - 4) * r / top:.1f}"
                        for t, r in zip(self.times, self.rates, strict=True))


def rates(samples: Sequence[ChannelSample], counter: str) -> Series:
    """The rate of `counter` between consecutive samples (oldest first)."""
    start = timezone.now() - WINDOW
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


def channel_charts(name: str) -> dict[str, object]:
    """The last hour of put and take rates of one channel, ready for the template."""
    samples = list(ChannelSample.objects.filter(channel=name, at__gte=timezone.now() - WINDOW)
                   .order_by("at"))
    puts, takes = rates(samples, "put_successes"), rates(samples, "take_successes")
    top = max([*puts.rates, *takes.rates, 0.0])
    return {"width": WIDTH, "height": HEIGHT, "top": top, "samples": len(samples),
            "put_points": puts.points(top), "take_points": takes.points(top),
            "put_rate": puts.last, "take_rate": takes.last}

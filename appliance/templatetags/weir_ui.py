"""Template filters of the admin UI: times, ages, sizes and counts as operators read them."""
from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone

from appliance.ui import loss_causes

register = template.Library()
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _dash_if_blank(show: Callable[[Any], str]) -> Callable[[Any], str]:
    """A filter that shows '—' for no value (None or ''), and `show`s any other."""
    @functools.wraps(show)
    def shown(value: Any) -> str:
        return "—" if value is None or value == "" else show(value)
    return shown


@register.filter
@_dash_if_blank
def ms_time(value: Any) -> str:
    """Milliseconds since the epoch as a UTC time ('—' for none); a value no date can show
    (before 1970 or past year 9999: stored by an older version or the engine's CLI) as its
    number, so one odd event never breaks a page."""
    ms = int(value)
    if ms < 0:
        return "—"
    try:
        return (EPOCH + timedelta(milliseconds=ms)).strftime("%Y-%m-%d %H:%M:%S UTC")
    except OverflowError:
        return f"{ms} ms (no date)"


@register.filter
@_dash_if_blank
def age(value: Any) -> str:
    """A duration in milliseconds, short ('3.2 s', '4 min', '2 h')."""
    ms = float(value)
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


@register.filter
@_dash_if_blank
def duration(value: Any) -> str:
    """How long a run took, from milliseconds: short runs to a tenth of a millisecond
    ('0.4 ms', '12 ms'), longer ones as age() says ('3.2 s', '4 min')."""
    ms = float(value)
    return f"{ms:.1f} ms" if ms < 10 else age(ms)


@register.filter
@_dash_if_blank
def ago(value: Any) -> str:
    """How long ago a datetime was ('just now', '40 s ago', '3 min ago')."""
    ms = (timezone.now() - value).total_seconds() * 1000
    if ms < 1000:
        return "just now"
    return f"{ms / 1000:.0f} s ago" if ms < 120_000 else f"{age(ms)} ago"


@register.filter
@_dash_if_blank
def num(value: Any) -> str:
    """An integer with thousands separators."""
    return f"{int(value):,}"


@register.filter
@_dash_if_blank
def size(value: Any) -> str:
    """Bytes in binary units (KiB, MiB, GiB)."""
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"


@register.filter
def file_count(partitions: Any) -> int:
    """How many files an export run wrote (ExportRun.partitions: one report a partition)."""
    return sum(len(part.get("files") or []) for part in partitions or [])


PERCENT = re.compile(r"\((\d{1,3})%\)")


@register.filter
def percent(progress: str) -> int | None:
    """The share done that a running export's progress line states ('5 of 10 rows written (50%)'),
    else None (the bar then shows that work goes on, not how much)."""
    found = PERCENT.search(progress or "")
    return min(100, int(found.group(1))) if found else None


@register.filter
def loss_cause(cause: str) -> loss_causes.Cause:
    """A loss record's cause as the page shows it: label, detail, code (ui/loss_causes.py)."""
    return loss_causes.shown(cause or "")

"""The admin UI's template filters (appliance/templatetags/weir_ui.py), as a template uses
them: each shows '—' for no value and the operator's reading of any other."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.template import Context, Template
from django.utils import timezone

FILTERS = ("ms_time", "age", "duration", "ago", "num", "size")


def shown(name: str, value: object) -> str:
    return Template(f"{{% load weir_ui %}}{{{{ v|{name} }}}}").render(Context({"v": value}))


@pytest.mark.parametrize("name", FILTERS)
@pytest.mark.parametrize("value", [None, ""])
def test_it_shows_a_dash_for_no_value(name: str, value: object) -> None:
    assert shown(name, value) == "—"


def test_it_shows_values_as_operators_read_them() -> None:
    assert shown("ms_time", 0) == "1970-01-01 00:00:00 UTC"
    assert shown("ms_time", -1) == "—"
    assert shown("ms_time", 10**17) == f"{10**17} ms (no date)"
    assert [shown("age", ms) for ms in (999, 3_200, 240_000, 7_200_000, 172_800_000)] == \
        ["999 ms", "3.2 s", "4 min", "2.0 h", "2.0 d"]
    assert [shown("duration", ms) for ms in (0.37, 9.94, 12.4, 3_200, 240_000)] == \
        ["0.4 ms", "9.9 ms", "12 ms", "3.2 s", "4 min"]
    now = timezone.now()
    assert [shown("ago", now - timedelta(seconds=s)) for s in (0.2, 40, 200, 7300)] == \
        ["just now", "40 s ago", "3 min ago", "2.0 h ago"]
    assert shown("num", 1234567) == "1,234,567" and shown("num", 0) == "0"
    assert [shown("size", b) for b in (0, 1023, 1536, 5 << 30)] == \
        ["0 B", "1023 B", "1.5 KiB", "5.0 GiB"]

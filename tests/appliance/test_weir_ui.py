"""The admin UI's template filters (appliance/templatetags/weir_ui.py), as a template uses
them: each shows '—' for no value and the operator's reading of any other."""
from __future__ import annotations

import pytest
from django.template import Context, Template

FILTERS = ("ms_time", "age", "num", "size")


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
    assert shown("num", 1234567) == "1,234,567" and shown("num", 0) == "0"
    assert [shown("size", b) for b in (0, 1023, 1536, 5 << 30)] == \
        ["0 B", "1023 B", "1.5 KiB", "5.0 GiB"]

"""Produce a test event from the event browser (POST /channels/<name>/produce, staff, CSRF):
a key, headers (one name:value a line, split at the first ':', kept as typed: a space
after the ':' is part of the value, as in a search's header=) and a text body, put through
the API's own path —
the JSON an API producer would send, parsed by appliance/event_parsing.py and put by
appliance/producing.py — so the UI accepts and refuses exactly what the API does.

Done: back to the latest events, where it shows on top, with a message naming its
partition and offset. Refused: the latest events again with the form filled in and the
reason next to the field, answered with the API's status (400 for bad input); nothing is
written.

Browsers send a textarea's line breaks as CRLF whatever was typed (HTML's form
submission normalises them): the body's CRLFs become LF, as they were typed.
"""
from __future__ import annotations

import json

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from appliance.api.handler import to_problem
from appliance.event_parsing import header_pair, parse
from appliance.models import Channel
from appliance.producing import put_events
from appliance.ui.access import operator_required
from appliance.ui.browser import latest_page


class _BadForm(ValueError):
    """A field of the form that is wrong, and why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field


@require_POST
@operator_required
def produce(request: HttpRequest, name: str) -> HttpResponse:
    """Put one event with the form's key, headers and body."""
    row = get_object_or_404(Channel, name=name)
    form = {k: request.POST.get(k, "") for k in ("key", "headers", "body")}
    try:
        event = {"body": form["body"].replace("\r\n", "\n"), "key": form["key"] or None,
                 "headers": _headers(form["headers"])}
        events = parse(json.dumps({"events": [event]}).encode(), "application/json")
        (partition, offset, _), = put_events(row, events)
    except _BadForm as bad:
        return _refused(request, row, form, bad.field, str(bad), 400)
    except Exception as exc:  # noqa: BLE001 - told as the API tells it, else raised
        problem = to_problem(exc)
        if problem is None:
            raise
        field = str(problem.members.get("field") or "body")
        return _refused(request, row, form, field if field in form else "body",
                        problem.detail, problem.status)
    messages.success(request, f"Event produced to partition {partition} at offset {offset}.")
    return redirect("ui:events", name=name)


def _headers(text: str) -> dict[str, str]:
    """Headers from lines of name:value (header_pair; blank lines skipped)."""
    headers = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            name, value = header_pair(line)
        except ValueError:
            raise _BadForm("headers", f"line {number} is not name:value") from None
        headers[name] = value
    return headers


def _refused(request: HttpRequest, row: Channel, form: dict[str, str], field: str,
             reason: str, status: int) -> HttpResponse:
    return latest_page(request, row, {"produce": form, "produce_errors": {field: reason}},
                       status)

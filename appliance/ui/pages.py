"""The UI's pages (GET) and the settings forms they hold (POST)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from appliance import channels
from appliance.manage_channels import Refused, change_channel, create_channel
from appliance.models import ApiToken, Channel
from appliance.ui import state
from appliance.ui.access import operator_required, page
from appliance.ui.forms import ChannelForm, TokenForm
from appliance.ui.preview import preview
from channel_engine import OffsetOutOfRangeError

PAGE_EVENTS = 50
INT64_MAX = 2**63 - 1
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _common() -> dict[str, Any]:
    return {"refresh_ms": int(settings.WEIR_UI_REFRESH_S * 1000),
            "refresh_s": settings.WEIR_UI_REFRESH_S, "sample_s": settings.WEIR_SAMPLE_INTERVAL_S,
            "data_root": settings.WEIR_DATA_ROOTS[0]}


@page
def dashboard(request: HttpRequest) -> HttpResponse:
    """Every channel with its figures."""
    lines = [state.dashboard_row(row) for row in Channel.objects.all()]
    tokens = ApiToken.objects.filter(all_channels=True).order_by("-created_at")
    return render(request, "ui/dashboard.html", {"lines": lines, "tokens": tokens,
                                                 **_common()})


@page
def dashboard_status(request: HttpRequest) -> HttpResponse:
    """The dashboard's table alone (it refreshes itself)."""
    lines = [state.dashboard_row(row) for row in Channel.objects.all()]
    return render(request, "ui/_dashboard_table.html", {"lines": lines})


@operator_required
def channel_new(request: HttpRequest) -> HttpResponse:
    """The settings form of a new channel; creating it makes its files."""
    form = ChannelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            row = create_channel(form.settings())
        except Refused as refused:
            form.refuse(refused.errors)
        else:
            messages.success(request, f"Channel {row.name} created.")
            return redirect("ui:channel", name=row.name)
    status = 400 if request.method == "POST" else 200
    return render(request, "ui/channel_new.html", {"form": form, **_common()}, status=status)


@page
def channel(request: HttpRequest, name: str) -> HttpResponse:
    """One channel: its status parts, settings form, tokens and actions."""
    row = get_object_or_404(Channel, name=name)
    form = ChannelForm(instance=row)
    return _channel_page(request, row, form)


def _channel_page(request: HttpRequest, row: Channel, form: ChannelForm,
                  status: int = 200) -> HttpResponse:
    return render(request, "ui/channel.html", {
        **state.channel_state(row), "form": form, "token_form": TokenForm(),
        "tokens": row.tokens.order_by("-created_at"), **_common()}, status=status)


@page
def channel_status(request: HttpRequest, name: str) -> HttpResponse:
    """The channel page's status part alone (it refreshes itself)."""
    row = get_object_or_404(Channel, name=name)
    return render(request, "ui/_channel_status.html", state.channel_state(row))


@operator_required
def channel_settings(request: HttpRequest, name: str) -> HttpResponse:
    """Change a channel's settings live, or show why not next to the field."""
    row = get_object_or_404(Channel, name=name)
    if request.method != "POST":
        return redirect("ui:channel", name=name)
    form = ChannelForm(request.POST, instance=Channel.objects.get(pk=row.pk))
    if form.is_valid():
        changes = form.changes()
        try:
            change_channel(row, changes)
        except Refused as refused:
            form.refuse(refused.errors)
        else:
            done = ", ".join(sorted(changes)) or "nothing"
            messages.success(request, f"Settings saved and applied live: {done}.")
            return redirect("ui:channel", name=name)
    return _channel_page(request, row, form, status=400)


def _when(text: str) -> int | None:
    """A time the operator typed (ISO, UTC unless it says otherwise) as ms since the epoch,
    0 .. INT64_MAX (None: not a time)."""
    if text.isascii() and text.isdigit():
        return int(text) if len(text) <= 19 and int(text) <= INT64_MAX else None
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        ms = (moment - EPOCH) // timedelta(milliseconds=1)
    except (ValueError, OverflowError):  # 9999-12-31T23:59:59-01:00 is past datetime.max
        return None
    return ms if ms >= 0 else None


@page
def events(request: HttpRequest, name: str) -> HttpResponse:
    """Browse a partition's events by offset or by time, without taking them."""
    row = get_object_or_404(Channel, name=name)
    query = request.GET
    context: dict[str, Any] = {"row": row, "partitions": range(row.partitions),
                               "query": query, "events": [], "errors": {}}
    if not query:
        return render(request, "ui/events.html", context)
    try:
        text = query.get("partition", "0")
        partition = int(text) if len(text) <= 10 else -1
        if not 0 <= partition < row.partitions:
            raise ValueError
    except ValueError:
        context["errors"]["partition"] = f"a partition from 0 to {row.partitions - 1}"
        return render(request, "ui/events.html", context, status=400)
    channel = channels.open_channel(row)
    start: int | None
    if query.get("time"):
        at = _when(query["time"])
        if at is None:
            context["errors"]["time"] = ("a time like 2026-11-23T19:30:00 (UTC, 1970 to 9999) or "
                                         "ms since the epoch")
            return render(request, "ui/events.html", context, status=400)
        start = channel.offsets_for_time(partition, at)
        context["found_offset"] = start
        if start is None:
            context["note"] = "no event at or after that time"
            return render(request, "ui/events.html", context)
    else:
        text = query.get("offset", "").strip() or "0"
        if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > INT64_MAX:
            context["errors"]["offset"] = f"an offset: a whole number from 0 to {INT64_MAX}"
            return render(request, "ui/events.html", context, status=400)
        start = int(text)
    try:
        found = channel.read(partition, start, PAGE_EVENTS)
    except OffsetOutOfRangeError as exc:
        context["errors"]["offset"] = str(exc)
        return render(request, "ui/events.html", context, status=416)
    context["events"] = [{"event": e, "key": preview(e.key), "body": preview(e.body),
                          "headers": [(k, preview(v)) for k, v in e.headers.items()]}
                         for e in found]
    context["partition"] = partition
    context["next_offset"] = found[-1].offset + 1 if len(found) == PAGE_EVENTS else None
    return render(request, "ui/events.html", context)

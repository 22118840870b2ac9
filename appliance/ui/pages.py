"""The UI's pages (GET) and the settings forms they hold (POST)."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from appliance.manage_channels import Refused, change_channel, create_channel
from appliance.models import ApiToken, Channel
from appliance.ui import state
from appliance.ui.access import operator_required, page
from appliance.ui.forms import ChannelForm, TokenForm


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

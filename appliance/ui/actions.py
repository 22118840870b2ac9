"""The UI's actions: each a POST with CSRF that does one thing to a channel and comes
back to the channel page with a message saying what happened.

Checkpoint, flush and retention run here and now through the same Celery task bodies the
scheduler uses (task.apply): the same single-flight lock, TaskRun record and retries.
An export runs for minutes, so it is queued for a worker and its progress shows on the
page. Destructive actions ask first: revoking, resetting or removing a subscription and
recreating a channel whose files are missing in the browser, deleting on its own page.
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from celery import Task
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from appliance import channels, exports, kafka_sinks, manage_subscriptions, tasks
from appliance.manage_channels import (
    Refused,
    change_channel,
    delete_channel,
    parse_next_offsets,
    recreate_channel,
)
from appliance.models import ApiToken, Channel, ExportRun, KafkaRun
from appliance.ui import state
from appliance.ui.access import operator_required
from appliance.ui.forms import TokenForm
from channel_engine import ChannelEngineError
from channel_engine.tools.verify import verify_channel

RUN_NOW: dict[str, tuple[Task, dict[str, Any], str]] = {
    "checkpoint": (tasks.checkpoint_channel, {"force": True}, "Checkpoint written"),
    "flush": (tasks.flush_channel, {"force": True}, "Flushed"),
    "retention": (tasks.retention_channel, {}, "Retention ran"),
}


@require_POST
@operator_required
def run_now(request: HttpRequest, name: str, action: str) -> HttpResponse:
    """Checkpoint, flush or run retention on the channel now."""
    row = get_object_or_404(Channel, name=name)
    task, kwargs, done = RUN_NOW[action]
    result = task.apply(args=(row.name,), kwargs=kwargs)
    if result.failed():
        messages.error(request, f"{action} failed: {result.result}")
    else:
        messages.success(request, f"{done}: {result.result}.")
    return redirect("ui:channel", name=name)


@require_POST
@operator_required
def export_now(request: HttpRequest, name: str) -> HttpResponse:
    """Queue an export of the channel for a worker."""
    row = get_object_or_404(Channel, name=name)
    if reason := exports.drained(row, row.export_subscription, ExportRun):
        messages.info(request, f"Nothing new to export: {reason}.")
        return redirect("ui:channel", name=name)
    try:
        exports.queue_export(row)
    except exports.BrokerUnavailable as exc:
        messages.error(request, f"Export not queued: the broker is unreachable ({exc}).")
    else:
        messages.success(request, "Export queued; its progress shows under Exports.")
    return redirect("ui:channel", name=name)


@require_POST
@operator_required
def kafka_now(request: HttpRequest, name: str) -> HttpResponse:
    """Queue a run of the channel's Kafka sink for the Kafka worker."""
    row = get_object_or_404(Channel, name=name)
    if not row.kafka_topic:
        messages.error(request, "The channel has no Kafka sink: set its Kafka topic first.")
        return redirect("ui:channel", name=name)
    if reason := exports.drained(row, row.kafka_subscription, KafkaRun):
        messages.info(request, f"Nothing new to send to Kafka: {reason}.")
        return redirect("ui:channel", name=name)
    try:
        kafka_sinks.queue_sink(row)
    except exports.BrokerUnavailable as exc:
        messages.error(request, f"Kafka run not queued: the broker is unreachable ({exc}).")
    else:
        messages.success(request, "Kafka run queued; what it sends shows under Kafka sink.")
    return redirect("ui:channel", name=name)


@require_POST
@operator_required
def pause(request: HttpRequest, name: str, paused: bool) -> HttpResponse:
    """Pause puts (producers get 503) or resume them."""
    row = get_object_or_404(Channel, name=name)
    change_channel(row, {"puts_paused": paused})
    messages.success(request, "Puts paused: producers get 503 until resumed." if paused
                     else "Puts resumed.")
    return redirect("ui:channel", name=name)


@require_POST
@operator_required
def verify(request: HttpRequest, name: str) -> HttpResponse:
    """Run the engine's verify on every file of the channel and show the report."""
    row = get_object_or_404(Channel, name=name)
    report = verify_channel(channels.to_config(row))
    return render(request, "ui/verify.html", {"row": row, "report": report})


@require_POST
@operator_required
def acknowledge_losses(request: HttpRequest, name: str) -> HttpResponse:
    """Acknowledge the losses the channel recorded (asked first in the browser)."""
    row = get_object_or_404(Channel, name=name)
    count = channels.open_channel(row).acknowledge_losses()
    messages.success(request, f"{count} loss record(s) acknowledged." if count
                     else "No unacknowledged losses.")
    return redirect("ui:channel", name=name)


@require_POST
@operator_required
def recreate(request: HttpRequest, name: str) -> HttpResponse:
    """Make a channel whose files are missing again, empty, recording the loss (asked first
    in the browser; appliance.channels, "Storage that vanished")."""
    row = get_object_or_404(Channel, name=name)
    try:
        next_offsets = parse_next_offsets(request.POST.get("next_offsets", ""))
        missing = recreate_channel(row, next_offsets or None)
    except Refused as refused:
        messages.error(request, "Not recreated. " + " ".join(
            f"{'The next offsets were refused: ' if field == 'next_offsets' else ''}{m}."
            for field, ms in refused.errors.items() for m in ms))
    except channels.StorageMissing as exc:
        messages.error(request, f"Not recreated: {exc}")
    else:
        messages.success(request, f"Channel recreated empty where its files were missing "
                                  f"({', '.join(map(str, missing))}); the loss is recorded: "
                                  "acknowledge it once dealt with.")
    return redirect("ui:channel", name=name)


@require_POST
@operator_required
def create_token(request: HttpRequest, name: str) -> HttpResponse:
    """Issue a token on this channel; its key is shown once."""
    row = get_object_or_404(Channel, name=name)
    form = TokenForm(request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"Token not created: {field}: {' '.join(errors)}")
        return redirect("ui:channel", name=name)
    token, key = ApiToken.issue(form.cleaned_data["name"], form.cleaned_data["roles"], [row],
                                form.cleaned_data["subscriptions"])
    return render(request, "ui/token_created.html", {"row": row, "token": token, "key": key})


@require_POST
@operator_required
def revoke_token(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    """Revoke one of the channel's tokens, in every web worker."""
    row = get_object_or_404(Channel, name=name)
    if pk > 2**63 - 1:  # past any id (PostgreSQL would refuse the query: a 500)
        raise Http404("no such token")
    token = get_object_or_404(row.tokens, pk=pk)
    token.revoke()
    messages.success(request, f"Token {token} revoked.")
    return redirect("ui:channel", name=name)


@require_POST
@operator_required
def revoke_all_channel_token(request: HttpRequest, pk: int) -> HttpResponse:
    """Revoke a token on every channel, in every web worker."""
    if pk > 2**63 - 1:  # past any id (PostgreSQL would refuse the query: a 500)
        raise Http404("no such token")
    token = get_object_or_404(ApiToken, pk=pk, all_channels=True)
    token.revoke()
    messages.success(request, f"Token {token} revoked on every channel.")
    return redirect("ui:dashboard")


@operator_required
def delete(request: HttpRequest, name: str) -> HttpResponse:
    """Ask, then delete the channel and its files. Untaken events need force, and so does a
    channel that cannot be opened (its untaken events cannot be counted)."""
    row = get_object_or_404(Channel, name=name)
    status, unreadable, _ = state.engine_status(row)
    context: dict[str, Any] = {"row": row, "unreadable": unreadable,
                               "untaken": status["events_untaken"] if status else None}
    if request.method != "POST":
        return render(request, "ui/delete.html", context)
    force = request.POST.get("force") == "on"
    if request.POST.get("confirm_name") != row.name:
        context["error"] = "type the channel's name to confirm"
    elif status is None and not force:
        context["error"] = ("the channel cannot be opened, so its untaken events cannot be "
                            "counted: tick the box to delete it anyway")
    else:
        try:
            kept = delete_channel(row, force=force)
        except Refused as refused:
            context["error"] = refused.errors["error"][0]
        except (ChannelEngineError, OSError) as exc:
            context["error"] = f"not deleted: {type(exc).__name__}: {exc}"
        else:
            messages.success(request, f"Channel {name} and its files deleted.")
            if kept:  # directories it did not create, or that another channel uses
                messages.info(request, "Kept (not the channel's own): "
                                       + ", ".join(str(path) for path in kept))
            return redirect("ui:dashboard")
    return render(request, "ui/delete.html", context, status=409)


def _position(request: HttpRequest, prefix: str, partitions: int) -> Any:
    """The position a subscription form chose (templates/ui/_position_fields.html); a time
    without an offset is UTC. ValueError saying what is wrong."""
    chosen = request.POST.get(prefix, "earliest")
    if chosen == "timestamp":
        text = request.POST.get(f"{prefix}_time", "")
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"time: expected a date and time, not {text!r}") from None
        when = when.replace(tzinfo=UTC) if when.tzinfo is None else when
        chosen = {"timestamp_ms": max(0, int(when.timestamp() * 1000))}
    elif chosen == "offsets":
        chosen = {"offsets": dict(_pair(text) for text in request.POST.get(
            f"{prefix}_offsets", "").replace(",", " ").split())}
    return manage_subscriptions.position(chosen, partitions)


def _pair(text: str) -> tuple[str, int]:
    """"partition:offset" as ("partition", offset)."""
    partition, _, offset = text.partition(":")
    if not (partition.isascii() and partition.isdigit() and offset.isascii()
            and offset.isdigit()):
        raise ValueError(f"offsets: expected partition:offset pairs, not {text!r}")
    return partition, int(offset)


def _subscription_change(request: HttpRequest, name: str, change: Callable[[Channel], str]
                         ) -> HttpResponse:
    """Run a change of one of the channel's subscriptions; say what it did or why not."""
    row = get_object_or_404(Channel, name=name)
    try:
        messages.success(request, change(row))
    except Refused as refused:  # default, or the scheduled export's
        messages.error(request, "Not done: " + " ".join(
            m for ms in refused.errors.values() for m in ms))
    except (ValueError, ChannelEngineError) as exc:  # busy, exists, a bad position
        messages.error(request, f"Not done: {exc}")
    return redirect("ui:channel", name=name)


@require_POST
@operator_required
def subscription_add(request: HttpRequest, name: str) -> HttpResponse:
    """Add a subscription at the position the form chose."""
    def add(row: Channel) -> str:
        start = _position(request, "start", row.partitions)
        manage_subscriptions.add(row, request.POST.get("name", ""), start)
        return f"Subscription {request.POST['name']} added at {_said(start)}."
    return _subscription_change(request, name, add)


@require_POST
@operator_required
def subscription_reset(request: HttpRequest, name: str, sub: str) -> HttpResponse:
    """Reset a subscription (asked first in the browser); refused with takes open."""
    def reset(row: Channel) -> str:
        to = _position(request, "to", row.partitions)
        manage_subscriptions.reset(row, sub, to)
        return f"Subscription {sub} reset to {_said(to)}."
    return _subscription_change(request, name, reset)


@require_POST
@operator_required
def subscription_remove(request: HttpRequest, name: str, sub: str) -> HttpResponse:
    """Remove a subscription (asked first in the browser); refused with takes open."""
    def remove(row: Channel) -> str:
        manage_subscriptions.remove(row, sub)
        return f"Subscription {sub} removed."
    return _subscription_change(request, name, remove)


def _said(where: Any) -> str:
    """A position in words, for the page's message."""
    if isinstance(where, str):
        return where
    if "timestamp_ms" in where:
        return datetime.fromtimestamp(where["timestamp_ms"] / 1000, UTC).strftime(
            "%Y-%m-%d %H:%M:%S UTC")
    return ", ".join(f"partition {p} offset {o}" for p, o in sorted(where.items()))

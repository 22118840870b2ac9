"""GET /metrics — Prometheus text exposition of every channel's figures.

Names follow Prometheus conventions (weir_ prefix, _total for counters, base
units); Flume's channel counters keep their meaning: weir_channel_put_attempts_total
is Flume's EventPutAttemptCount, weir_channel_events is ChannelSize, and so on.
Label values are escaped per the text format (backslash, double quote, newline).
The counters count since the channel was made, kept by its checkpoints across reopens,
settings changes and restarts, so they never go backwards (after a kill a few may lag
behind what they were: channel_engine/queue/counters.py says which).
Admin role (a token or a staff session). A channel that cannot be opened (see
channels.status_of) has weir_channel_up 0 and weir_channel_healthy 0 and no other
figure; every other channel is reported as usual. Each subscription of a channel has
weir_subscription_* figures (label `subscription`): lag, in flight, the age of its oldest
untaken event, lag per partition and its take counters (Kafka's consumer-group lag, as
kafka-lag-exporter gives it); the channel's own figures are its slowest subscription's.
A channel with a Kafka sink (a kafka_topic) has weir_kafka_sink_* figures from its recorded
runs (KafkaRun): which subscription it drains (its lag is that subscription's
weir_subscription_lag_events), when its last run that sent or failed started, whether
that run failed, and what it sent.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request

from appliance import channels, lag
from appliance.api.base import ApiView
from appliance.api.schema import errors
from appliance.models import Channel, KafkaRun
from appliance.permissions import allowed
from channel_engine import ChannelEngineError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
COUNTERS = {
    "put_attempts": "Events offered to put transactions (Flume EventPutAttemptCount).",
    "put_successes": "Events committed by put transactions (Flume EventPutSuccessCount).",
    "put_errors": "Put transactions that failed (Flume EventPutErrorCount).",
    "take_attempts": "Events asked for by take transactions (Flume EventTakeAttemptCount).",
    "take_successes": "Events committed by take transactions (Flume EventTakeSuccessCount).",
    "take_errors": "Take transactions that failed to read (Flume EventTakeErrorCount).",
    "rollbacks": "Transactions rolled back (Flume RollbackCount).",
    "takes_expired": "Take transactions whose lease ran out.",
    "aborted_events": "Events of multi-partition puts that never committed.",
    "dropped_events": "Untaken events dropped by opt-in retention.",
    "checkpoint_write_errors": "Checkpoints that failed (Flume CheckpointWriteErrorCount).",
    "checkpoint_backup_write_errors": "Backup checkpoints that failed.",
    "disk_full_errors": "Puts refused because a disk was full (ENOSPC or quota).",
}
SUBSCRIPTION_GAUGES = (
    ("weir_subscription_lag_events", "events_untaken",
     "Events a subscription has not taken yet (consumer lag; in flight included)."),
    ("weir_subscription_in_flight_events", "events_in_flight",
     "Events reserved by a subscription's open takes."),
    ("weir_subscription_oldest_untaken_age_seconds", "oldest_untaken_age_ms",
     "Age of a subscription's oldest untaken event by its timestamp (0: none untaken)."),
)
SUBSCRIPTION_COUNTERS = {
    "take_attempts": "Events a subscription's take transactions asked for.",
    "take_successes": "Events a subscription's take transactions committed.",
    "take_errors": "A subscription's take transactions that failed to read.",
    "rollbacks": "A subscription's take transactions rolled back.",
    "takes_expired": "A subscription's take transactions whose lease ran out.",
    "dropped_events": "Events opt-in retention dropped before this subscription took them.",
    "lost_events": "Committed events lost to damage before this subscription took them.",
}
GAUGES = {
    "events": ("events_untaken", "Events committed and not yet taken (Flume ChannelSize)."),
    "capacity_events": ("capacity", "Most untaken events the channel holds."),
    "fill_ratio": ("fill_percent", "events / capacity (Flume ChannelFillPercentage / 100)."),
    "in_flight_events": ("events_in_flight", "Events reserved by open take transactions."),
    "unflushed_events": ("unflushed_events", "Events not yet known to be on disk."),
    "disk_bytes": ("bytes_on_disk", "Bytes the channel's segments take on disk, preallocated "
                   "zeros included (written ahead in fsync durability, or preallocated "
                   "segments): the data alone is this less the preallocated bytes."),
}


def label(value: object) -> str:
    """A label value escaped as the text format requires (backslash, quote, newline), so no
    name can break the exposition of every other channel."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(statuses: list[dict[str, Any]], down: Sequence[str] = ()) -> str:
    """The exposition text for these channel statuses, and the channels in `down` (that
    could not be opened: weir_channel_up 0, weir_channel_healthy 0, no other figure)."""
    statuses = [{**s, "name": label(s["name"])} for s in statuses]
    down = [label(name) for name in down]
    metric = "weir_channel_up"
    lines = [f"# HELP {metric} 1 when the channel could be opened and asked for its figures "
             "(0: its reason is in the channel list's health_reason).",
             f"# TYPE {metric} gauge"]
    lines += [f'{metric}{{channel="{s["name"]}"}} 1' for s in statuses]
    lines += [f'{metric}{{channel="{name}"}} 0' for name in down]
    for name, help_text in COUNTERS.items():
        metric = f"weir_channel_{name}_total"
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} counter"]
        lines += [f'{metric}{{channel="{s["name"]}"}} {s["counters"][name]}' for s in statuses]
    for name, (key, help_text) in GAUGES.items():
        metric = f"weir_channel_{name}"
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for s in statuses:
            value = s[key] / 100 if key == "fill_percent" else s[key]
            lines.append(f'{metric}{{channel="{s["name"]}"}} {value}')
    metric = "weir_channel_checkpoint_age_seconds"
    lines += [f"# HELP {metric} Time since the last queue checkpoint.", f"# TYPE {metric} gauge"]
    lines += [f'{metric}{{channel="{s["name"]}"}} {s["checkpoint"]["age_ms"] / 1000}'
              for s in statuses]
    metric = "weir_channel_lost_events_total"
    lines += [f"# HELP {metric} Committed events the channel found it can no longer deliver "
              "(damage), acknowledged or not.", f"# TYPE {metric} counter"]
    lines += [f'{metric}{{channel="{s["name"]}"}} {s["losses"]["events_lost"]}'
              for s in statuses]
    metric = "weir_channel_unacknowledged_lost_events"
    lines += [f"# HELP {metric} Lost events no operator has acknowledged yet.",
              f"# TYPE {metric} gauge"]
    lines += [f'{metric}{{channel="{s["name"]}"}} {s["losses"]["unacknowledged_events"]}'
              for s in statuses]
    metric = "weir_channel_healthy"
    lines += [f"# HELP {metric} 1 when the channel is healthy.", f"# TYPE {metric} gauge"]
    lines += [f'{metric}{{channel="{s["name"]}"}} {int(s["health"] == "healthy")}'
              for s in statuses]
    lines += [f'{metric}{{channel="{name}"}} 0' for name in down]
    lines += _subscription_lines(statuses)
    metric = "weir_partition_lag_events"
    lines += [f"# HELP {metric} Untaken events per partition of the slowest subscription.",
              f"# TYPE {metric} gauge"]
    for s in statuses:
        lines += [f'{metric}{{channel="{s["name"]}",partition="{p["partition"]}"}} '
                  f'{p["events_untaken"]}' for p in s["partitions"]]
    return "\n".join(lines) + "\n"


def _subscription_lines(statuses: list[dict[str, Any]]) -> list[str]:
    """Per subscription (label `subscription`): its lag, in flight, oldest untaken age, lag
    per partition and take counters. Each status carries lag.subscription_lag's figures as
    "subscription_lag"."""
    subs = [(s["name"], label(name), sub) for s in statuses
            for name, sub in s["subscription_lag"].items()]
    lines = []
    for metric, key, help_text in SUBSCRIPTION_GAUGES:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for channel, name, sub in subs:
            value = sub[key]
            if key == "oldest_untaken_age_ms":
                value = 0 if value is None else value / 1000
            lines.append(f'{metric}{{channel="{channel}",subscription="{name}"}} {value}')
    metric = "weir_subscription_partition_lag_events"
    lines += [f"# HELP {metric} Events a subscription has not taken, per partition.",
              f"# TYPE {metric} gauge"]
    for channel, name, sub in subs:
        lines += [f'{metric}{{channel="{channel}",subscription="{name}",'
                  f'partition="{p["partition"]}"}} {p["events_untaken"]}'
                  for p in sub["partitions"]]
    for counter, help_text in SUBSCRIPTION_COUNTERS.items():
        metric = f"weir_subscription_{counter}_total"
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} counter"]
        lines += [f'{metric}{{channel="{channel}",subscription="{name}"}} '
                  f'{sub["counters"][counter]}' for channel, name, sub in subs]
    return lines


KAFKA_GAUGES = (
    ("weir_kafka_sink_info", "1 for each channel with a Kafka sink: its topic and the "
     "subscription it drains (its lag: weir_subscription_lag_events)."),
    ("weir_kafka_sink_last_run_timestamp_seconds", "When the sink's last run that sent or "
     "failed started (0: none recorded)."),
    ("weir_kafka_sink_last_run_failed", "1 when that run failed (its error is on the channel "
     "page), 0 when it went through."),
    ("weir_kafka_sink_last_run_events", "Events that run committed to Kafka."),
)


def kafka_lines(rows: Sequence[Channel]) -> list[str]:
    """The weir_kafka_sink_* figures of the channels with a Kafka sink."""
    sinks = []
    for row in rows:
        if row.kafka_topic:
            last = KafkaRun.objects.filter(channel=row.name).exclude(
                outcome=KafkaRun.RUNNING).first()
            sinks.append((row, last))
    lines = []
    for metric, help_text in KAFKA_GAUGES:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for row, last in sinks:
            labels = f'channel="{label(row.name)}",topic="{label(row.kafka_topic)}"'
            if metric == "weir_kafka_sink_info":
                lines.append(f'{metric}{{{labels},subscription='
                             f'"{label(row.kafka_subscription)}"}} 1')
            elif metric.endswith("timestamp_seconds"):
                lines.append(f"{metric}{{{labels}}} "
                             f"{last.started_at.timestamp() if last else 0}")
            elif last is not None:
                value = int(last.outcome == KafkaRun.FAILED) if metric.endswith("failed") \
                    else last.events
                lines.append(f"{metric}{{{labels}}} {value}")
    return lines


class MetricsView(ApiView):
    """Prometheus metrics for every channel the caller may see."""

    role = "admin"

    @extend_schema(responses={(200, "text/plain"): str, **errors()})
    def get(self, request: Request) -> HttpResponse:
        """Metrics in Prometheus text format."""
        statuses, down, seen = [], [], []
        for row in Channel.objects.all():
            if allowed(request, self.role, row):
                seen.append(row)
                status, _ = channels.status_of(row)
                if status is None:
                    down.append(row.name)
                    continue
                try:  # reads each subscription's head: the channel may go meanwhile
                    subs = lag.subscription_lag(row, status)
                except (ChannelEngineError, OSError):
                    down.append(row.name)
                else:
                    statuses.append({**status, "subscription_lag": subs})
        text = render(statuses, down) + "\n".join(kafka_lines(seen)) + "\n"
        return HttpResponse(text, content_type=CONTENT_TYPE)

"""What the UI shows of a channel, gathered in one place for the pages and their
self-refreshing parts: the engine's status, the rate charts, export lag, recent runs."""
from __future__ import annotations

import time
from typing import Any

from appliance import channels, lag
from appliance.models import Channel, ExportRun, KafkaRun, TaskRun
from appliance.ui import charts, run_records

RECENT = 20
RUNS_READ = 500  # task runs read for the page: idle ones folded, RECENT busy ones shown


def engine_status(row: Channel, segments: bool = False
                  ) -> tuple[dict[str, Any] | None, str, list[str]]:
    """The engine's status of a channel, or None and why it could not be had, and the
    paths missing when its storage is (channels.status_detail)."""
    return channels.status_detail(row, segments)


def export_lag(row: Channel, status: dict[str, Any],
               subscriptions: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """How far exports are behind: their subscription's lag (None for a channel that is
    never exported; events None before its subscription was made); `subscriptions`:
    lag.subscription_lag's figures when the caller has them."""
    newest = ExportRun.objects.filter(channel=row.name).first()
    if row.export_interval_ms is None and newest is None:
        return None
    last_ok = ExportRun.objects.filter(channel=row.name, outcome=ExportRun.OK).first()
    queue = status["subscriptions"].get(row.export_subscription)  # made by its first run
    if queue is not None and subscriptions is not None:
        age = subscriptions[row.export_subscription]["oldest_untaken_age_ms"]
    else:
        oldest = None if queue is None else lag.oldest_untaken_ms(row, queue["partitions"])
        age = None if oldest is None else max(0, int(time.time() * 1000) - oldest)
    return {"subscription": row.export_subscription,
            "events": None if queue is None else queue["events_untaken"],
            "age_ms": age,
            "last_ok": last_ok,
            "running": newest if newest and newest.outcome == ExportRun.RUNNING else None}


def dashboard_row(row: Channel) -> dict[str, Any]:
    """One line of the dashboard."""
    status, error, missing = engine_status(row)
    line: dict[str, Any] = {"row": row, "status": status, "error": error, "missing": missing,
                            "charts": charts.channel_charts(row.name)}
    if status is not None:
        line["export"] = export_lag(row, status)
    return line


def channel_state(row: Channel) -> dict[str, Any]:
    """Everything the channel page's status part shows."""
    status, error, missing = engine_status(row, segments=True)
    state: dict[str, Any] = {
        "row": row, "status": status, "error": error, "missing": missing,
        "advice": channels.STORAGE_ADVICE,
        "charts": charts.channel_charts(row.name, charts.LARGE),
        "runs": run_records.recent(TaskRun.objects.filter(channel=row.name)[:RUNS_READ],
                                   RECENT),
        "exports": list(ExportRun.objects.filter(channel=row.name)[:RECENT]),
        "kafka_runs": list(KafkaRun.objects.filter(channel=row.name)[:RECENT]),
        "last_flush": TaskRun.objects.filter(channel=row.name,
                                             task="weir.flush_channel").first(),
        "last_retention": TaskRun.objects.filter(channel=row.name,
                                                 task="weir.retention_channel").first(),
    }
    if status is not None:
        subscriptions = lag.subscription_lag(row, status)
        state["export"] = export_lag(row, status, subscriptions)
        state["subscriptions"] = list(subscriptions.values())
        state["kafka_drained"] = any(sub["kafka"] for sub in state["subscriptions"])
        tables = [part.get("segment_table", []) for part in status["partitions"]]
        state["deletable"] = sum(1 for table in tables for seg in table if seg["deletable"])
    return state

"""The engine's background work, as Celery tasks: Kafka's log flusher, Flume's
checkpointer, Kafka's retention check, and the metrics sampler the UI's charts need.

Scheduling: beat runs a fixed schedule (settings.CELERY_BEAT_SCHEDULE) of small
dispatcher tasks, one per kind of work, every WEIR_SCHEDULER_TICK_S. Each dispatcher
reads the channel configs and, for each channel whose interval has passed, enqueues
the per-channel task:

    dispatcher (beat)   per-channel task     interval (from the channel's row)
    ------------------  -------------------  ------------------------------------------
    weir.flusher        weir.flush_channel   every tick: flush_if_due() flushes what
                                             flush_ms says, persists recovery points,
                                             expires lapsed leases
    weir.checkpointer   weir.checkpoint_...  checkpoint_interval_ms (checkpoint_if_due)
    weir.retention      weir.retention_...   retention_check_interval_ms (apply_retention)
    weir.exporter       weir.export_channel  export_interval_ms, when set (exports.py);
                                             on the export queue (celery.py)
    weir.kafka_sinker   weir.kafka_sink_...  kafka_interval_ms, when set with a topic
                                             (kafka_sinks.py); on the Kafka queue
    weir.sample_metrics (itself)             WEIR_SAMPLE_INTERVAL_S: one ChannelSample each
    weir.prune_history  (itself)             every 10 min: runs and samples older than
                                             WEIR_TASK_RUNS_KEEP_HOURS go

Why a dispatcher and not django-celery-beat: the intervals already live in the channel
rows and change with them; a dispatcher reads them at every tick, so a changed interval
holds from the next tick without restarting beat and without a second copy of each
schedule (a PeriodicTask row per channel and kind) to keep in step. "Due" is a Redis key
per kind and channel set with NX and the interval (less half a tick) as its expiry: a
channel's task is enqueued at most once per interval however many dispatchers or ticks
run, and a change of settings deletes the keys so it holds at once. Each message expires
(message_expiry_s) so that workers that were down do not find a backlog of them.

Policy mode's loss window: data appended at t is durable by t + flush_ms + the tick
(WEIR_SCHEDULER_TICK_S), plus the flush's own queueing and run time; exports run on a
queue and worker of their own (celery.py) so that queueing stays short.

Every per-channel task runs through task_runs.run_for_channel: single-flight per
channel, time limits, retries with backoff, and a TaskRun row per run. The flusher
records a run when it flushed or failed, not each idle check (one a second per
channel would drown the others).
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.utils import timezone
from redis.exceptions import RedisError

from appliance.models import Channel, ChannelSample, ExportRun, KafkaRun, TaskRun
from appliance.shared_redis import fast, shared_redis
from appliance.task_runs import run_for_channel
from channel_engine import Channel as EngineChannel

KINDS = ("flush", "checkpoint", "retention", "export", "kafka")
MIN_EXPIRY_S = 60.0


def _due_key(kind: str, name: str) -> str:
    return cache.make_key(f"due:{kind}:{name}")


def dispatch(kind: str, task: Task, interval_ms: Callable[[Channel], float | None]) -> int:
    """Enqueue `task` for every channel whose `kind` interval has passed; return how many."""
    client, tick_ms = shared_redis(), _tick_ms()
    sent = 0
    for row in Channel.objects.only("name", "checkpoint_interval_ms",
                                    "retention_check_interval_ms", "export_interval_ms",
                                    "kafka_interval_ms", "kafka_topic"):
        interval = interval_ms(row)
        # The key lapses half a tick early: a dispatcher that runs a little earlier in its
        # tick than the last one (beat's and the worker's jitter) must not skip the tick,
        # or the flusher's loss window would grow by a whole tick.
        if interval is None:
            continue
        key, ttl_ms = _due_key(kind, row.name), max(1, int(interval - tick_ms / 2))
        # The key holds the interval it was set for: one set for another interval (a
        # tick that read the row before a change committed) is replaced, and the channel
        # is due at once, whichever of the change and the tick came first.
        marked, held = client.pipeline(transaction=False).set(
            key, int(interval), nx=True, px=ttl_ms).get(key).execute()  # one round trip
        if marked or (held != str(int(interval)).encode()
                      and client.set(key, int(interval), px=ttl_ms)):
            task.apply_async((row.name,), expires=message_expiry_s(interval))
            sent += 1
    return sent


def message_expiry_s(interval_ms: float) -> float:
    """How long a dispatched message stays worth running: its interval (a later tick has
    sent its successor by then), at least MIN_EXPIRY_S (a busy worker that is merely late
    must not discard every flush). Workers down for longer find stale messages and drop
    them instead of running a backlog of flushes and checkpoints."""
    return max(interval_ms / 1000, MIN_EXPIRY_S)


def release(kind: str, name: str) -> None:
    """Let the next tick dispatch `kind` for the channel again."""
    shared_redis().delete(_due_key(kind, name))


def settings_changed(sender: Any, instance: Channel, **_: Any) -> None:
    """A channel's settings changed: its next runs follow the new intervals at once. The
    due keys go once the change commits: a dispatcher ticking in between reads the old
    row and would set them again for the old interval."""
    name = instance.name

    def forget() -> None:
        try:  # on the request path (a PATCH, a delete): fail fast
            fast(lambda client: client.delete(*[_due_key(kind, name) for kind in KINDS]))
        except RedisError:
            pass  # without Redis there is no broker either: nothing is scheduled meanwhile
    transaction.on_commit(forget)


post_save.connect(settings_changed, sender=Channel, dispatch_uid="tasks_settings_changed")
post_delete.connect(settings_changed, sender=Channel, dispatch_uid="tasks_channel_deleted")


def _tick_ms() -> float:
    return float(settings.WEIR_SCHEDULER_TICK_S) * 1000


# -- dispatchers (beat) -------------------------------------------------------------------
@shared_task(name="weir.flusher", ignore_result=True, time_limit=60)
def flusher() -> int:
    """Kafka's log flusher: every channel, every tick."""
    return dispatch("flush", flush_channel, lambda row: _tick_ms())


@shared_task(name="weir.checkpointer", ignore_result=True, time_limit=60)
def checkpointer() -> int:
    """Flume's checkpointer: each channel at its checkpoint_interval_ms."""
    return dispatch("checkpoint", checkpoint_channel,
                    lambda row: row.checkpoint_interval_ms)


@shared_task(name="weir.retention", ignore_result=True, time_limit=60)
def retention() -> int:
    """Kafka's retention check: each channel at its retention_check_interval_ms."""
    return dispatch("retention", retention_channel,
                    lambda row: row.retention_check_interval_ms)


@shared_task(name="weir.exporter", ignore_result=True, time_limit=60)
def exporter() -> int:
    """The export trigger: each channel with an export_interval_ms, at that interval."""
    return dispatch("export", export_channel, lambda row: row.export_interval_ms)


@shared_task(name="weir.kafka_sinker", ignore_result=True, time_limit=60)
def kafka_sinker() -> int:
    """The Kafka sink's trigger: each channel with a topic and a kafka_interval_ms."""
    return dispatch("kafka", kafka_sink_channel,
                    lambda row: row.kafka_interval_ms if row.kafka_topic else None)


# -- per-channel work ---------------------------------------------------------------------
@shared_task(bind=True, name="weir.flush_channel", soft_time_limit=60, time_limit=90)
def flush_channel(self: Task, name: str, force: bool = False) -> str:
    """Flush what the channel's flush policy says is due (everything, with force)."""
    def work(channel: EngineChannel) -> tuple[str, dict[str, Any]]:
        if force:
            unflushed = channel.status()["unflushed_events"]
            channel.flush()
            return TaskRun.OK, {"flushed": True, "events": unflushed}
        if channel.flush_if_due():
            return TaskRun.OK, {"flushed": True}
        return TaskRun.NOTHING_DUE, {}
    return run_for_channel(self, name, work, record_nothing_due=False)


@shared_task(bind=True, name="weir.checkpoint_channel", soft_time_limit=300, time_limit=360)
def checkpoint_channel(self: Task, name: str, force: bool = False) -> str:
    """Checkpoint the channel if its interval passed (or now, with force)."""
    def work(channel: EngineChannel) -> tuple[str, dict[str, Any]]:
        result = channel.checkpoint() if force else channel.checkpoint_if_due()
        if result is None:  # checkpointed meanwhile (an operator, a close): due again later
            age = channel.status()["checkpoint"]["age_ms"] or 0
            remaining = max(1.0, channel.config.checkpoint_interval_ms - age)
            shared_redis().set(_due_key("checkpoint", name), 1, px=int(remaining))
            return TaskRun.NOTHING_DUE, {"checkpoint_age_ms": age}
        return TaskRun.OK, result.to_dict()
    return run_for_channel(self, name, work)


@shared_task(bind=True, name="weir.retention_channel", soft_time_limit=300, time_limit=360)
def retention_channel(self: Task, name: str) -> str:
    """Delete what the channel's retention allows (taken segments; more if opted in)."""
    def work(channel: EngineChannel) -> tuple[str, dict[str, Any]]:
        return TaskRun.OK, channel.apply_retention()
    return run_for_channel(self, name, work)


@shared_task(bind=True, name="weir.export_channel", soft_time_limit=3600, time_limit=3660)
def export_channel(self: Task, name: str) -> str:
    """Export the channel's next events (one export per channel at a time: busy while
    another process runs one, manage.py export_channel included)."""
    from appliance.exports import ExportBusy, nothing_new, run_export

    def work(channel: EngineChannel) -> tuple[str, dict[str, Any]]:
        row = Channel.objects.get(name=name)
        if nothing_new(channel, row.export_subscription,
                       ExportRun.objects.filter(channel=name)):
            return TaskRun.NOTHING_DUE, {}  # no Spark started for nothing
        try:
            run = run_export(row)
        except ExportBusy as exc:
            return TaskRun.BUSY, {"busy": str(exc)}
        if run.outcome != "ok":
            raise ExportFailed(f"export run {run.pk}: {run.error}")
        return TaskRun.OK, {"export_run": run.pk, "rows": run.rows, "bytes": run.bytes}
    return run_for_channel(self, name, work, record_nothing_due=False)


class ExportFailed(Exception):
    """The export job failed (its ExportRun says why)."""


@shared_task(bind=True, name="weir.kafka_sink_channel", soft_time_limit=600, time_limit=660)
def kafka_sink_channel(self: Task, name: str) -> str:
    """Forward the channel's next events to Kafka (one run per channel at a time: busy
    while another process runs one, manage.py drain_to_kafka included)."""
    from appliance.exports import nothing_new
    from appliance.kafka_sinks import SinkBusy, run_sink

    def work(channel: EngineChannel) -> tuple[str, dict[str, Any]]:
        row = Channel.objects.get(name=name)
        if row.kafka_topic and nothing_new(channel, row.kafka_subscription,
                                           KafkaRun.objects.filter(channel=name)):
            return TaskRun.NOTHING_DUE, {}  # no job, no Kafka clients started for nothing
        try:
            run = run_sink(row)
        except SinkBusy as exc:
            return TaskRun.BUSY, {"busy": str(exc)}
        if run is None:
            return TaskRun.NOTHING_DUE, {}
        if run.outcome != "ok":
            raise KafkaSinkFailed(f"Kafka sink run {run.pk}: {run.error}")
        return TaskRun.OK, {"kafka_run": run.pk, "events": run.events,
                            "transactions": run.transactions}
    return run_for_channel(self, name, work, record_nothing_due=False)


class KafkaSinkFailed(Exception):
    """A run of the Kafka sink failed (its KafkaRun says why)."""


@shared_task(bind=True, name="weir.sample_metrics", ignore_result=True, soft_time_limit=60,
             time_limit=90)
def sample_metrics(self: Task) -> int:
    """One ChannelSample per channel (a channel that fails is skipped, the rest go on)."""
    from appliance import channels  # the engine handles live in this process

    now, taken = timezone.now(), 0
    for row in Channel.objects.all():
        try:
            status = channels.open_channel(row).status()
        except Exception:  # noqa: BLE001 -- a sample missed; the flusher records the cause
            continue
        counters = status["counters"]
        ChannelSample.objects.create(
            channel=row.name, at=now, events_untaken=status["events_untaken"],
            events_in_flight=status["events_in_flight"],
            put_successes=counters["put_successes"], take_successes=counters["take_successes"],
            unflushed_events=status["unflushed_events"], bytes_on_disk=status["bytes_on_disk"],
            checkpoint_age_ms=status["checkpoint"]["age_ms"])
        taken += 1
    return taken


@shared_task(name="weir.prune_history", ignore_result=True, time_limit=300)
def prune_history() -> int:
    """Delete task runs and samples older than WEIR_TASK_RUNS_KEEP_HOURS."""
    cutoff = timezone.now() - timedelta(hours=settings.WEIR_TASK_RUNS_KEEP_HOURS)
    runs, _ = TaskRun.objects.filter(started_at__lt=cutoff).delete()
    samples, _ = ChannelSample.objects.filter(at__lt=cutoff).delete()
    return runs + samples

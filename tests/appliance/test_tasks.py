"""The background tasks on a real Celery worker (celery.contrib.testing.worker, threads
pool, two at a time) with the real Redis broker and a real engine: the flusher, the
checkpointer and retention do their work on each channel's own schedule, one at a time
per channel, record every run, and retry a failing channel (failing it for good after the
last retry) while the others go on."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row
from django.conf import settings
from polling import wait_for

from appliance import channels, task_runs, tasks
from appliance.celery import app
from appliance.models import Channel, TaskRun
from channel_engine import StorageError
from channel_engine.queue.checkpointer import Checkpointer

pytestmark = pytest.mark.django_db(transaction=True)  # the worker's threads see the rows


def put(row: Channel, count: int, size: int = 100, per_put: int = 20) -> None:
    for first in range(0, count, per_put):
        with channels.open_channel(row).put() as tx:
            for i in range(first, min(count, first + per_put)):
                tx.put(f"{i:06d}".encode() + b"x" * size)



def runs(task: str, name: str) -> list[TaskRun]:
    return list(TaskRun.objects.filter(task=task, channel=name).order_by("started_at"))


def test_the_beat_schedule_runs_every_task() -> None:
    app.loader.import_default_modules()
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert scheduled == {"weir.flusher", "weir.checkpointer", "weir.retention", "weir.exporter",
                         "weir.kafka_sinker", "weir.sample_metrics", "weir.prune_history"}
    assert scheduled <= set(app.tasks)


TICK_S = 0.5  # the scheduler tick in the flusher test
SLACK_S = 1.0  # the flush task's queueing and run time on a busy 2-core test machine


def test_the_flusher_makes_policy_mode_data_durable_within_flush_ms_plus_a_tick(
        worker: None, root: Path, settings: Any) -> None:
    settings.WEIR_SCHEDULER_TICK_S = TICK_S
    row = channel_row(root, durability="policy", flush_ms=1000, flush_messages=None)
    opened = time.monotonic()  # the log's last flush is its open, just below
    put(row, 50)
    put_at = time.monotonic()
    part = channels.open_channel(row).status()["partitions"][0]
    assert part["unflushed_events"] == 50 and part["recovery_point"] == 0
    next_tick = time.monotonic()

    def tick_then_check() -> bool:  # beat's schedule: the flusher every TICK_S
        nonlocal next_tick
        if time.monotonic() >= next_tick:
            tasks.flusher.delay()
            next_tick += TICK_S
        part = channels.open_channel(row).status()["partitions"][0]
        return bool(part["recovery_point"] == part["log_end_offset"] == 50)

    deadline = put_at + 1.0 + TICK_S + SLACK_S
    while not tick_then_check():
        assert time.monotonic() < deadline, "not durable within flush_ms + tick + slack"
        time.sleep(0.02)
    durable_at = time.monotonic()
    assert durable_at - opened >= 1.0, durable_at - opened  # not before flush_ms
    flushed = wait_for(lambda: runs("weir.flush_channel", "orders"), 5)
    assert flushed[-1].outcome == TaskRun.OK and flushed[-1].detail == {"flushed": True}


def test_the_checkpointer_writes_checkpoints_at_the_interval(worker: None, root: Path) -> None:
    row = channel_row(root, checkpoint_interval_ms=1000)
    channels.open_channel(row).checkpoint()
    first = channels.open_channel(row).status()["checkpoint"]["sequence"]
    def done() -> list[TaskRun]:
        return [r for r in runs("weir.checkpoint_channel", "orders") if r.outcome == TaskRun.OK]

    # beat's ticks, faster than the interval, until three checkpoints (a loaded machine's
    # worker may take longer than 3 s to make them; the interval is what must hold)
    started = time.monotonic()
    while len(done()) < 3:
        assert time.monotonic() < started + 20, f"{len(done())} checkpoints in 20 s"
        tasks.checkpointer.delay()
        time.sleep(0.1)
    # one checkpoint a run (ticks still queued may add runs meanwhile: they count too)
    def each_run_one_checkpoint() -> list[TaskRun] | None:
        made = done()
        sequence = channels.open_channel(row).status()["checkpoint"]["sequence"]
        return made if sequence - first == len(made) == len(done()) else None

    made = wait_for(each_run_one_checkpoint, 10, what="a checkpoint for each OK run")
    gaps = [(b.started_at - a.started_at).total_seconds()
            for a, b in zip(made, made[1:], strict=False)]
    assert all(gap >= 0.8 for gap in gaps), gaps  # never more often than the interval


def test_retention_deletes_consumed_segments_and_nothing_else(worker: None, root: Path) -> None:
    row = channel_row(root, segment_bytes=4096)
    channel = channels.open_channel(row)
    put(row, 100)  # about 30 events a segment
    with channel.take() as tx:
        first = tx.take(100)
    channel.checkpoint()  # takes 0-99 recorded; it deletes the full segments before the last
    put(row, 100, per_put=20)  # the segment that held 99 rolls: consumed, not yet deleted
    segments = channel.status()["partitions"][0]["segments"]
    assert tasks.retention_channel.delay("orders").get(timeout=30) == TaskRun.OK
    run = runs("weir.retention_channel", "orders")[-1]
    assert run.detail["segments_deleted"] >= 1 and run.detail["events_dropped"] == 0
    status = channel.status()["partitions"][0]
    assert status["segments"] == segments - run.detail["segments_deleted"]
    assert status["log_start_offset"] <= 100
    with channel.take() as tx:
        rest = tx.take(200)
    assert [e.offset for e in first + rest] == list(range(200))  # nothing untaken was lost


def test_two_checkpoints_of_one_channel_run_one_at_a_time(
        worker: None, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    channel_row(root)
    slow = Checkpointer.run

    def slow_checkpoint(self: Checkpointer) -> Any:
        time.sleep(0.5)
        return slow(self)

    monkeypatch.setattr(Checkpointer, "run", slow_checkpoint)
    results = [tasks.checkpoint_channel.delay("orders", force=True) for _ in range(2)]
    assert [r.get(timeout=30) for r in results] == [TaskRun.OK, TaskRun.OK]
    # each run is timed from before its wait for the lock: the one that ended last waited
    # for the other, then slept its own 0.5 s
    ends = sorted(run.started_at.timestamp() + run.duration_ms / 1000
                  for run in runs("weir.checkpoint_channel", "orders"))
    assert len(ends) == 2 and ends[1] - ends[0] >= 0.45, ends


def test_a_failing_channel_is_recorded_and_retried_while_the_others_go_on(
        worker: None, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = channel_row(root, name="bad")
    channel_row(root, name="good")
    failures = {"bad": 2}  # its disk fails twice, then recovers (not timing-dependent)
    real = Checkpointer.run

    def flaky_checkpoint(self: Checkpointer) -> Any:
        if failures.get(self.config.name, 0) > 0:
            failures[self.config.name] -= 1
            raise StorageError(bad.checkpoint_dir, OSError(5, "Input/output error"),
                               "writing the checkpoint")
        return real(self)

    monkeypatch.setattr(Checkpointer, "run", flaky_checkpoint)
    failing = tasks.checkpoint_channel.delay("bad", force=True)
    assert tasks.checkpoint_channel.delay("good", force=True).get(timeout=30) == TaskRun.OK
    assert failing.get(timeout=30) == TaskRun.OK
    attempts = runs("weir.checkpoint_channel", "bad")
    assert [r.outcome for r in attempts] == [TaskRun.RETRYING] * 2 + [TaskRun.OK]
    assert "StorageError" in attempts[0].error and "Input/output error" in attempts[1].error
    assert [r.attempt for r in attempts] == [1, 2, 3]
    assert [r.outcome for r in runs("weir.checkpoint_channel", "good")] == [TaskRun.OK]


def test_a_channel_that_keeps_failing_ends_failed_after_its_last_retry(
        worker: None, root: Path) -> None:
    bad = channel_row(root, name="bad")
    channel_row(root, name="good")
    channels.open_channel(bad)
    obstacle = Path(bad.checkpoint_dir) / "checkpoint.tmp"
    obstacle.mkdir()  # every attempt: an I/O error
    try:
        failing = tasks.checkpoint_channel.delay("bad", force=True)
        wait_for(lambda: runs("weir.checkpoint_channel", "bad"), 10, what="a first failure")
        assert tasks.checkpoint_channel.delay("good", force=True).get(timeout=30) == TaskRun.OK
        failing.get(timeout=60, propagate=False)
    finally:
        obstacle.rmdir()  # the channel checkpoints when the test closes it
    assert failing.state == "FAILURE"
    attempts = runs("weir.checkpoint_channel", "bad")
    retries = task_runs.MAX_RETRIES
    assert [r.outcome for r in attempts] == [TaskRun.RETRYING] * retries + [TaskRun.FAILED]
    assert [r.attempt for r in attempts] == list(range(1, retries + 2))
    assert all("StorageError" in r.error for r in attempts)
    [good] = runs("weir.checkpoint_channel", "good")
    assert good.outcome == TaskRun.OK and good.error == ""


class Recorder:
    """Stands in for a per-channel task: records what the dispatcher enqueues."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.expires: list[float] = []

    def apply_async(self, args: tuple[str], expires: float) -> None:
        self.sent.extend(args)
        self.expires.append(expires)


def test_a_tick_while_a_change_commits_does_not_keep_the_old_interval(root: Path) -> None:
    """A dispatcher in another process ticks between the change's save and its commit: it
    reads the old row and marks the channel not due for the old interval. The change's
    commit forgets that mark, so the new interval still holds from the next tick."""
    from django.db import transaction

    from appliance.shared_redis import shared_redis

    row = channel_row(root, checkpoint_interval_ms=3_600_000)
    task = Recorder()

    def tick() -> int:
        return tasks.dispatch("checkpoint", task, lambda r: r.checkpoint_interval_ms)  # type: ignore[arg-type]

    assert tick() == 1
    with transaction.atomic():
        row.checkpoint_interval_ms = 1_000
        row.save()
        # the other process's tick, on the committed (old) row
        shared_redis().set(tasks._due_key("checkpoint", row.name), 3_600_000, px=3_600_000)
    assert tick() == 1 and task.sent == ["orders"] * 2
    # a tick that read the old row before the commit and marks it after: the same
    shared_redis().set(tasks._due_key("checkpoint", row.name), 3_600_000, px=3_600_000)
    assert tick() == 1 and tick() == 0 and task.sent == ["orders"] * 3


def test_a_settings_change_resets_the_schedule_once_it_commits_never_inside(
        root: Path) -> None:
    """Through the path every settings change takes (manage_channels.change_channel: the API's
    PATCH, the UI's form, manage.py): inside its transaction the due key is left alone (a
    tick there reads the old row and would mark it again); once it commits the key is gone
    and the next tick dispatches on the new interval."""
    from django.db.models.signals import post_save

    from appliance.manage_channels import change_channel
    from appliance.shared_redis import shared_redis

    row = channel_row(root, checkpoint_interval_ms=3_600_000)
    task, key = Recorder(), tasks._due_key("checkpoint", row.name)

    def tick() -> int:
        return tasks.dispatch("checkpoint", task, lambda r: r.checkpoint_interval_ms)  # type: ignore[arg-type]

    assert tick() == 1 and tick() == 0
    inside: list[bool] = []

    def during_the_transaction(instance: Channel, **_: Any) -> None:
        inside.append(shared_redis().exists(key) == 1)  # not forgotten yet
        # another process's tick, on the committed (old) row, marks it for the old interval
        shared_redis().set(key, 3_600_000, px=3_600_000)

    post_save.connect(during_the_transaction, sender=Channel, dispatch_uid="test-tick")
    try:
        change_channel(row, {"checkpoint_interval_ms": 1_000})
    finally:
        post_save.disconnect(sender=Channel, dispatch_uid="test-tick")
    assert inside == [True]
    assert shared_redis().exists(key) == 0  # forgotten at the commit
    assert tick() == 1 and task.sent == ["orders"] * 2  # the new interval, at once


def test_a_changed_interval_holds_from_the_next_tick_without_restarting_beat(
        root: Path) -> None:
    row = channel_row(root, checkpoint_interval_ms=3_600_000)
    task = Recorder()

    def tick() -> int:
        return tasks.dispatch("checkpoint", task, lambda r: r.checkpoint_interval_ms)  # type: ignore[arg-type]

    assert tick() == 1 and tick() == 0  # due once an hour: the second tick sends nothing
    row.checkpoint_interval_ms = 1_000
    row.save()  # as PATCH /api/v1/channels/orders does
    assert tick() == 1  # the new interval counts at once
    assert tick() == 0
    time.sleep(1.1)
    assert tick() == 1 and task.sent == ["orders"] * 3
    # a message outlives its interval, with a floor so a merely late worker still runs it
    assert task.expires == [3600.0, tasks.MIN_EXPIRY_S, tasks.MIN_EXPIRY_S]

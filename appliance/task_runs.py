"""How every per-channel background task runs: single-flight, recorded, retried.

    step          what                                                   why
    ------------  -----------------------------------------------------  ---------------------
    look up       the channel row; none: the channel was deleted, done  idempotent
    lock          Redis lock "task-lock:<task>:<channel>", held at most  two workers never
                  the run's hard time limit + WEIR_TASK_LOCK_GRACE_S,    checkpoint one channel
                  waited for at most WEIR_TASK_LOCK_WAIT_S (then the     at once; a dead
                  run is "busy")                                         worker's lock expires
    work          the engine call, in this worker's handle on the        see tasks.py
                  channel (owner or client of the owner); a handle       the operator's
                  whose channel went or was made again under it is let   recreate is not
                  go of (channels.let_go_if_gone)                        blocked by a worker
    record        a TaskRun row: task, channel, start, duration,         the status API and UI
                  outcome, attempt, detail, error
    retry         transient errors (the owner went away, I/O errors,     exponential backoff
                  the disk guard, Redis or the database unreachable)     with full jitter, at
                  are retried; others fail at once                       most MAX_RETRIES times
"""
from __future__ import annotations

import socket
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from celery.utils.time import get_exponential_backoff_interval
from django.conf import settings
from django.core.cache import cache
from django.db import OperationalError
from django.utils import timezone
from redis.exceptions import LockError, RedisError

from appliance import channels
from appliance.models import Channel, TaskRun
from appliance.shared_redis import shared_redis
from channel_engine import Channel as EngineChannel
from channel_engine import ChannelLockedError, DiskSpaceError, StorageError
from channel_engine.errors import OwnerLostError

TRANSIENT = (OwnerLostError, ChannelLockedError, StorageError, DiskSpaceError, RedisError,
             OperationalError, OSError)
MAX_RETRIES = 3
RETRY_BACKOFF_MAX_S = 60
DEFAULT_TIME_LIMIT_S = 600.0  # Celery's default is none; every Weir task names its own
Work = Callable[[EngineChannel], tuple[str, dict[str, Any]]]  # -> (outcome, detail)


def lock_key(task: str, channel: str) -> str:
    """The Redis key of the task's single-flight lock on the channel."""
    return cache.make_key(f"task-lock:{task}:{channel}")


def lock_hold_s(hard_time_limit_s: float | None) -> float:
    """How long a run's lock lasts at most: past the run's hard time limit, by when its
    worker has killed it, plus WEIR_TASK_LOCK_GRACE_S (a worker killed mid-run leaves a
    lock that lapses then)."""
    return float(hard_time_limit_s or DEFAULT_TIME_LIMIT_S) + settings.WEIR_TASK_LOCK_GRACE_S


@contextmanager
def single_flight(task: str, channel: str, hold_s: float, wait_s: float) -> Iterator[bool]:
    """Hold the task's lock on the channel while the block runs; yields False if another
    worker held it for all of wait_s."""
    lock = shared_redis().lock(lock_key(task, channel), timeout=hold_s,
                               blocking_timeout=wait_s)
    acquired = bool(lock.acquire(blocking=wait_s > 0))
    try:
        yield acquired
    finally:
        if acquired:
            try:
                lock.release()
            except LockError:
                pass  # held past hold_s and expired: someone else may hold it now


def record(task: str, channel: str, started_at: datetime, started: float, outcome: str,
           attempt: int, detail: dict[str, Any] | None = None, error: str = "") -> TaskRun:
    """Write the run's TaskRun row."""
    return TaskRun.objects.create(
        task=task, channel=channel, started_at=started_at,
        duration_ms=round((time.perf_counter() - started) * 1000, 3), outcome=outcome,
        attempt=attempt, detail=detail or {}, error=error, worker=socket.gethostname())


def run_for_channel(task: Task, name: str, work: Work,
                    record_nothing_due: bool = True) -> str:
    """Run `work` on channel `name` as described above; return the outcome."""
    started_at, started = timezone.now(), time.perf_counter()
    attempt = task.request.retries + 1
    row = Channel.objects.filter(name=name).first()
    if row is None:
        return "gone"
    hold_s = lock_hold_s(_hard_time_limit(task))
    with single_flight(task.name, name, hold_s, settings.WEIR_TASK_LOCK_WAIT_S) as acquired:
        if not acquired:
            record(task.name, name, started_at, started, TaskRun.BUSY, attempt,
                   error=f"another worker held the lock for {settings.WEIR_TASK_LOCK_WAIT_S} s")
            return TaskRun.BUSY
        try:
            outcome, detail = _work_on(row, work)
        except TRANSIENT as exc:
            retrying = task.request.retries < MAX_RETRIES
            record(task.name, name, started_at, started,
                   TaskRun.RETRYING if retrying else TaskRun.FAILED, attempt,
                   error=_describe(exc))
            if retrying:
                countdown = get_exponential_backoff_interval(
                    factor=1, retries=task.request.retries, maximum=RETRY_BACKOFF_MAX_S,
                    full_jitter=True)
                raise task.retry(exc=exc, countdown=countdown, max_retries=MAX_RETRIES) from exc
            raise
        except (Exception, SoftTimeLimitExceeded) as exc:
            record(task.name, name, started_at, started, TaskRun.FAILED, attempt,
                   error=_describe(exc))
            raise
    if outcome != TaskRun.NOTHING_DUE or record_nothing_due:
        record(task.name, name, started_at, started, outcome, attempt, detail)
    return outcome


def _work_on(row: Channel, work: Work) -> tuple[str, dict[str, Any]]:
    """`work` on this process's handle of the row's channel; a handle whose channel went or
    was made again under it is let go of, as the API does, so that this worker does not
    keep a channel whose files vanished open and block the operator's recreate."""
    try:
        return work(channels.open_channel(row))
    except Exception as exc:
        channels.let_go_if_gone(row, exc)
        raise


def _hard_time_limit(task: Task) -> float | None:
    """The message's hard time limit (apply_async(time_limit=...)), else the task's."""
    limits = task.request.timelimit or (None, None)
    return limits[0] or task.time_limit


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"

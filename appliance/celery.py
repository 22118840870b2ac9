"""The Celery app: `celery -A appliance worker` and `celery -A appliance beat`.

Configured from Django settings (the CELERY_ namespace), Redis as the broker, tasks
found in appliance/tasks.py. See tasks.py for what runs when, and why.

Three queues. Exports (weir.export_channel, whoever sends it: the exporter dispatcher, the
UI's "export now") go to WEIR_EXPORT_QUEUE (weir-export) and Kafka sink runs
(weir.kafka_sink_channel) to WEIR_KAFKA_QUEUE (weir-kafka), each consumed by a worker of
their own; everything else goes to the default queue (weir). One Spark export runs for minutes:
on one shared queue, two of them would hold both of the worker's slots and the flusher
would wait behind them, and policy mode's loss bound (flush_ms plus the scheduler tick)
would no longer hold.
"""
from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")

EXPORT_TASKS = frozenset({"weir.export_channel"})
KAFKA_TASKS = frozenset({"weir.kafka_sink_channel"})

app = Celery("weir")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["appliance"])


@worker_init.connect
def freeze_worker(**_: Any) -> None:
    """Freeze what a worker's main process loaded (Django, the tasks) before it forks its
    pool (appliance/frozen_heap.py): the pool processes inherit those objects frozen, so
    their collections never write to the pages they share with it."""
    from appliance.frozen_heap import freeze_startup_objects

    freeze_startup_objects()


@worker_process_init.connect
def freeze_pool_process(**_: Any) -> None:
    """Freeze what a pool process made while starting, too: it may own channels for its
    whole life (the few objects the main process made between its freeze and the fork
    are collected and frozen here; the frozen ones are not visited)."""
    from appliance.frozen_heap import freeze_startup_objects

    freeze_startup_objects()


def route_task(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
               **_: Any) -> dict[str, str] | None:
    """Celery's router (CELERY_TASK_ROUTES): exports to WEIR_EXPORT_QUEUE, Kafka sink runs
    to WEIR_KAFKA_QUEUE, the rest to the default queue. Reads the settings at each send,
    so tests may point them elsewhere."""
    from django.conf import settings

    if name in EXPORT_TASKS:
        return {"queue": settings.WEIR_EXPORT_QUEUE}
    if name in KAFKA_TASKS:
        return {"queue": settings.WEIR_KAFKA_QUEUE}
    return None

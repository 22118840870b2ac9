"""The Celery app: `celery -A appliance worker` and `celery -A appliance beat`.

Configured from Django settings (the CELERY_ namespace), Redis as the broker, tasks
found in appliance/tasks.py. See tasks.py for what runs when, and why.
"""
from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")

app = Celery("weir")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["appliance"])

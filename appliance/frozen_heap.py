"""The objects a process made while starting, put out of the garbage collector's sight
(gc.freeze), in the appliance's long-lived processes: each gunicorn worker once the app is
loaded (appliance/wsgi.py), each Celery pool process as it starts (appliance/celery.py),
which is also where a channel's owner usually runs.

Why: Django, DRF, Celery and the engine leave about 125,000 objects tracked by the
collector after start, nearly all alive until the process exits, and a full collection
visits every one of them while holding the GIL: 52 ms in a web worker
(bench/README.md). Requests that allocate many containers (a 1000-event produce request
makes a dict and an event per event) leave survivors of the young collections that run
while they are in flight, so a full collection came every ~400 such requests: 130 µs a
request on average, and a 52 ms stall for every request that worker (or that owner)
served at the time. Frozen, those objects sit in a permanent generation that no
collection visits: a full collection then took 0.27 ms. Objects made afterwards are
collected as before; the garbage of the start is collected first, so none of it is kept
for good. (Python's documentation recommends the same before fork() for copy-on-write
sharing: frozen objects' headers are no longer written by collections.)
"""
from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Collect the start's garbage, then freeze every object still tracked."""
    gc.collect()
    gc.freeze()

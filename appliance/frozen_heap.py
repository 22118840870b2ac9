"""The objects a process made while starting, put out of the garbage collector's sight
(gc.freeze), in the appliance's long-lived processes: each gunicorn worker once the app is
loaded (appliance/wsgi.py); each Celery worker's main process before it forks its pool,
and each pool process as it starts (appliance/celery.py): a pool process is also where a
channel's owner usually runs.

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
for good.

Fork: a collection writes to the header of every object it visits, so a pool process
collecting what it inherited would copy every page of its parent's heap it touched
(measured: about 100 MB more PSS over the appliance's pool processes when each froze only
after the fork). Frozen in the parent before the fork, those objects are never visited by
the children: Python's documentation recommends exactly this for copy-on-write sharing.
"""
from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Collect the start's garbage, then freeze every object still tracked."""
    gc.collect()
    gc.freeze()

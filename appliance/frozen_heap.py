"""The objects a process made while starting, put out of the garbage collector's sight
(gc.freeze), in the appliance's long-lived processes: each gunicorn worker once the app is
loaded (appliance/wsgi.py); each Celery worker's main process before it forks its pool,
and each pool process as it starts (appliance/celery.py): a pool process is also where a
channel's owner usually runs.

Why: Django, DRF, Celery and the engine leave about 125,000 objects tracked by the
collector after start, nearly all alive until the process exits, and a full collection
visits every one of them while holding the GIL: 52 ms, measured in one process calling
the produce fast path directly (bench/README.md). Requests that allocate many containers
(a 1000-event produce request makes a dict and an event per event) leave survivors of the
young collections that run while they are in flight, so a full collection came every
~400 such requests: 130 µs a request on average, and a 52 ms stall for every request the
process served at the time (an owner in a pool process has the same heap). Frozen, those
objects sit in a permanent generation that no collection visits: a full collection then
took 0.27 ms. Objects made afterwards are collected as before, except a cycle that runs
through a frozen object (never freed); the start's garbage is collected first, so what
is frozen is what was alive then (the app, its modules and settings: kept for the
process's life anyway).

Fork: a collection writes to the header of every object it visits, so a pool process
collecting what it inherited would copy every page of its parent's heap it touched
(measured: about 135 MB more PSS over the appliance when the pool processes froze only
after the fork, 864 MB against 729 MB in consecutive runs). Frozen in the parent before
the fork, those objects are never visited by the children. Python's documentation gives
the same reason for freezing before fork(); it also disables collection in the parent
until then, so that memory freed by a collection is not reused and written before the
fork. Here the parent collects once, just before freezing, and forks soon after.
"""
from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Collect the start's garbage, then freeze every object still tracked."""
    gc.collect()
    gc.freeze()

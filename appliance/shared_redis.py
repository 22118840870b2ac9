"""This process's client for the shared cache's Redis (CACHES["default"]["LOCATION"]),
for the few things that talk to Redis directly: the throttle's counters and the row
cache's generation. One client per process and location, made on first use; redis-py
clients are thread-safe and reconnect after fork."""
from __future__ import annotations

import os

import redis
from django.conf import settings

_clients: dict[tuple[int, str], redis.Redis] = {}


def shared_redis() -> redis.Redis:
    """The client (short timeouts: callers fall back when Redis is away)."""
    location = settings.CACHES["default"]["LOCATION"]
    key = (os.getpid(), location)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(location, socket_timeout=2,
                                                      socket_connect_timeout=2)
    return client

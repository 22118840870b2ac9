"""This process's clients for the shared cache's Redis (CACHES["default"]["LOCATION"]),
for the few things that talk to Redis directly.

Two clients per process and location, made on first use (redis-py clients are
thread-safe and reconnect after fork):

- fast(): the request path's (the throttle's counters).
  Connect and read time out after WEIR_REDIS_TIMEOUT_S (50 ms), with no retry, and after a
  failure fast() does not try again for WEIR_REDIS_RETRY_S (1 s): it raises RedisError at
  once, so a hung (paused) or stopped Redis costs a request at most one timeout per
  process per second, not one per call. Every caller has a fallback (throttling lets the
  request through).
- shared_redis(): the background tasks' (single-flight locks, the dispatchers' due
  keys): 2 s timeouts, since a task that waits a little beats one that fails.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.retry import Retry

T = TypeVar("T")
_clients: dict[tuple[int, str, bool], redis.Redis] = {}
_down: dict[str, float | str] = {"until": 0.0, "reason": ""}  # the breaker, per process
_lock = threading.Lock()


def _client(quick: bool) -> redis.Redis:
    location = settings.CACHES["default"]["LOCATION"]
    key = (os.getpid(), location, quick)
    client = _clients.get(key)
    if client is None:
        if quick:
            timeout = settings.WEIR_REDIS_TIMEOUT_S
            client = redis.Redis.from_url(location, socket_timeout=timeout,
                                          socket_connect_timeout=timeout,
                                          retry=Retry(NoBackoff(), 0))
        else:
            client = redis.Redis.from_url(location, socket_timeout=2, socket_connect_timeout=2)
        _clients[key] = client
    return client


def shared_redis() -> redis.Redis:
    """The background tasks' client (2 s timeouts: callers fall back when Redis is away)."""
    return _client(quick=False)


class RedisSkipped(RedisConnectionError):
    """fast() did not try: Redis failed less than WEIR_REDIS_RETRY_S ago (already logged)."""


def reset() -> None:
    """Close the breaker: the next fast() call tries Redis (tests)."""
    with _lock:
        _down["until"], _down["reason"] = 0.0, ""


def fast(op: Callable[[redis.Redis], T]) -> T:
    """op(client) on the request path's client; RedisError at once, without trying
    (RedisSkipped: callers need not log it again), for WEIR_REDIS_RETRY_S after the last
    failure."""
    with _lock:
        until, reason = float(_down["until"]), _down["reason"]
    if time.monotonic() < until:
        raise RedisSkipped(f"not tried: Redis failed less than "
                                   f"{settings.WEIR_REDIS_RETRY_S:g} s ago ({reason})")
    try:
        return op(_client(quick=True))
    except RedisError as exc:
        with _lock:
            _down["until"] = time.monotonic() + settings.WEIR_REDIS_RETRY_S
            _down["reason"] = f"{type(exc).__name__}: {exc}"
        raise

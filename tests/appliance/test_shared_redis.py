"""The request path's Redis client fails fast: a short timeout, and no second try for
WEIR_REDIS_RETRY_S after a failure (a hung Redis costs one timeout per process, not one per
call)."""
from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from appliance import shared_redis


@pytest.fixture()
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers (a paused Redis)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def test_it_times_out_fast_and_then_does_not_try_for_a_while(
        settings: Any, silent_server: int) -> None:
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": f"redis://127.0.0.1:{silent_server}/0"}}
    settings.WEIR_REDIS_RETRY_S = 0.5
    tried: list[int] = []

    def ping(client: Any) -> Any:
        tried.append(1)
        return client.ping()
    started = time.monotonic()
    with pytest.raises(RedisTimeoutError):  # its short timeout, not a refusal
        shared_redis.fast(ping)
    # Ten timeouts and more: the wall clock of a loaded machine (parallel test workers
    # beside other work) runs on while the process waits for a core.
    assert time.monotonic() - started < 2.0 and len(tried) == 1
    started = time.monotonic()
    with pytest.raises(RedisError, match="not tried"):
        shared_redis.fast(ping)
    assert time.monotonic() - started < 0.01 and len(tried) == 1
    time.sleep(0.6)
    with pytest.raises(RedisError):
        shared_redis.fast(ping)
    assert len(tried) == 2
    settings.WEIR_REDIS_RETRY_S = 0
    with pytest.raises(RedisError):
        shared_redis.fast(ping)  # leaves the breaker closed for the tests after this one

"""The row cache (appliance/row_cache.py) under a Redis outage: a token revoked while Redis
was away, by a process that could never announce it, is refused by an idle worker once
Redis is back — the worker's generation watch emptied its cache meanwhile. And that watch
is the process's one reader of the generation: one thread, one Redis read a tick, for
the row cache and the channel watcher (appliance/channels.py) alike."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row, wait_for
from django.utils import timezone
from redis.exceptions import RedisError

from appliance import channels, row_cache
from appliance.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_refuses_a_token_revoked_unannounced_during_an_outage_it_slept_through(
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.WEIR_CHANNEL_WATCH_S = 0.05
    row, key = ApiToken.issue("idle", ["produce"], None)
    key_hash = ApiToken.objects.get(pk=row.pk).key_hash
    assert row_cache.token(key_hash) is not None  # cached; the generation watch starts
    real_fast = row_cache.fast

    def redis_away(op: Any) -> Any:
        raise RedisError("paused")
    monkeypatch.setattr(row_cache, "fast", redis_away)
    # revoked behind the cache's back, as by manage.py revoke_token exiting meanwhile
    ApiToken.objects.filter(pk=row.pk).update(revoked_at=timezone.now())
    # the worker serves no request during the outage; its watch empties the cache
    wait_for(lambda: not row_cache._rows, 10, "the watch emptying the cache in the outage")
    monkeypatch.setattr(row_cache, "fast", real_fast)
    assert row_cache.token(key_hash) is None
    settings.WEIR_CHANNEL_WATCH_S = 0
    time.sleep(0.1)  # the watch sees it is turned off and ends


def test_it_reads_the_generation_in_one_thread_for_the_row_cache_and_the_channels(
        settings: Any, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    settings.WEIR_CHANNEL_WATCH_S = 0.05
    readers: list[int] = []  # the thread of every read of the generation but the test's
    checks: list[str | None] = []  # the generation each run of close_stale() came after
    real_fast, real_close_stale = row_cache.fast, channels.close_stale
    away = [False]

    def counted(op: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            readers.append(threading.get_ident())
        if away[0]:
            raise RedisError("paused")
        return real_fast(op)

    def close_stale() -> list[str]:
        checks.append(real_fast(row_cache._read_generation))
        return real_close_stale()
    monkeypatch.setattr(row_cache, "fast", counted)
    monkeypatch.setattr(channels, "close_stale", close_stale)
    row, _ = ApiToken.issue("idle", ["produce"], None)
    assert row_cache.token(ApiToken.objects.get(pk=row.pk).key_hash) is not None
    channels.open_channel(channel_row(root))  # both consumers: a row cached, a channel open
    wait_for(lambda: len(readers) >= 6 and checks, 5, "the watch's ticks")
    assert len(set(readers)) == 1, "one watch thread per process"
    row_cache.changed()  # a new generation: the channel watcher checks its handles again
    wait_for(lambda: len(set(checks)) >= 2, 5, "a check under the new generation")
    ticks = len(readers)
    row_cache._rows[("token", "x")] = (time.monotonic(), object())
    before = len(checks)
    away[0] = True
    wait_for(lambda: not row_cache._rows and len(checks) >= before + 2, 5,
             "an emptied cache and a check every tick while Redis cannot say")
    assert len(set(readers)) == 1 and len(readers) > ticks
    settings.WEIR_CHANNEL_WATCH_S = 0
    wait_for(lambda: not row_cache._watching[0], 2, "the watch's end")

"""The row cache (appliance/row_cache.py) under a Redis outage: a token revoked while Redis
was away, by a process that could never announce it, is refused by an idle worker once
Redis is back — the worker's outage watch emptied its cache meanwhile."""
from __future__ import annotations

import time
from typing import Any

import pytest
from django.utils import timezone
from redis.exceptions import RedisError

from appliance import row_cache
from appliance.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_refuses_a_token_revoked_unannounced_during_an_outage_it_slept_through(
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.WEIR_CHANNEL_WATCH_S = 0.05
    row, key = ApiToken.issue("idle", ["produce"], None)
    key_hash = ApiToken.objects.get(pk=row.pk).key_hash
    assert row_cache.token(key_hash) is not None  # cached; the outage watch starts
    real_fast = row_cache.fast

    def redis_away(op: Any) -> Any:
        raise RedisError("paused")
    monkeypatch.setattr(row_cache, "fast", redis_away)
    # revoked behind the cache's back, as by manage.py revoke_token exiting meanwhile
    ApiToken.objects.filter(pk=row.pk).update(revoked_at=timezone.now())
    time.sleep(0.3)  # the worker serves no request during the outage
    monkeypatch.setattr(row_cache, "fast", real_fast)
    assert row_cache.token(key_hash) is None
    settings.WEIR_CHANNEL_WATCH_S = 0
    time.sleep(0.1)  # the watch sees it is turned off and ends

"""Per-token throttling: each token (or session user) gets WEIR_API_RATE requests per
window; more answer 429 with Retry-After (the seconds until the window ends).

The count lives in Redis (the shared cache's server and key prefix), so the limit
holds across every web worker, not per process. Fixed windows, one INCR per request:
the counter costs one round trip whatever the rate, where DRF's stock throttle reads
and rewrites the whole request history each time (a list as long as the rate). As
with any fixed window, a client may fit up to twice the rate into the two seconds
around a window boundary.

Fails open, fast: without an answer from Redis within WEIR_REDIS_TIMEOUT_S (stopped,
hung), or for WEIR_REDIS_RETRY_S after such a failure (shared_redis.fast), the request is
let through unthrottled and the outage logged once per failure.
"""
from __future__ import annotations

import logging
from typing import Any

from django.core.cache import cache
from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from appliance.models import ApiToken
from appliance.shared_redis import RedisSkipped, fast

log = logging.getLogger(__name__)


class TokenRateThrottle(SimpleRateThrottle):
    """WEIR_API_RATE (DRF's DEFAULT_THROTTLE_RATES["token"]) per token or user."""

    scope = "token"
    wait_s = 0.0

    def allow_request(self, request: Request, view: Any) -> bool:
        """Count the request in its window; without Redis (no answer within
        WEIR_REDIS_TIMEOUT_S, shared_redis.fast), let it through (losing the limit for a while
        beats refusing every producer, or holding them all) and say so in the log."""
        if self.rate is None:
            return True
        now = self.timer()
        window = int(now // self.duration)
        key = cache.make_key(f"{self.get_cache_key(request, view)}:{window}")
        def count_in(client: Any) -> int:
            pipe = client.pipeline(transaction=False)
            pipe.incr(key)
            pipe.expire(key, self.duration + 1)
            return int(pipe.execute()[0])
        try:
            count = fast(count_in)
        except RedisError as exc:
            if not isinstance(exc, RedisSkipped):
                log.warning("throttling off: the cache at REDIS_URL is unreachable (%s)", exc)
            return True
        self.wait_s = (window + 1) * self.duration - now
        return count <= self.num_requests

    def wait(self) -> float:
        """Seconds until the window ends (Retry-After)."""
        return self.wait_s

    def get_cache_key(self, request: Request, view: Any) -> str:
        """One bucket per token, per session user, or per client address."""
        if isinstance(request.auth, ApiToken):
            ident = f"t{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"u{request.user.pk}"
        else:
            ident = f"a{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}

"""Per-token throttling: each token (or session user) gets WEIR_API_RATE requests per
window; more answer 429 with Retry-After (the seconds until the window ends).

The count lives in Redis (the shared cache's server and key prefix), so the limit
holds across every web worker, not per process. Fixed windows, counted with INCRBY, where
DRF's stock throttle reads and rewrites the whole request history each time (a list as
long as the rate). As with any fixed window, a client may fit up to twice the rate into
the two seconds around a window boundary.

Leases. A round trip per request would be a tenth of a small produce request's cost, so a
process takes a lease of the window's allowance at once, 1/LEASE_SHARE of the rate (at
most MAX_LEASE requests), and spends it locally; a rate below LEASE_SHARE per window is
counted one request at a time, as before. Redis's count is of requests leased, so the
limit still holds across processes: a lease that crosses the limit is cut to the part
below it, and a process that met the limit refuses for the rest of the window without
asking again. What a process leased and did not spend is lost when the window ends. The
threads of a process share its lease, but threads that find it spent at the same moment
each take a new one, so with P processes of T threads a token may get up to P x T x lease
requests fewer than its rate in a window (6.25% at the default 2 web workers x 8 threads,
when all 16 lease at once at the window's end; (P - 1) x lease, 0.4%, when the threads
lease one at a time), never more.

Fails open, fast: without an answer from Redis within WEIR_REDIS_TIMEOUT_S (stopped,
hung), or for WEIR_REDIS_RETRY_S after such a failure (shared_redis.fast), the request is
let through unthrottled and the outage logged once per failure.

A bucket's Redis key for a window (the cache's make_key: prefix, version) is made once
and remembered (_keys), not at every request; a change of CACHES (tests) forgets them.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from django.core.cache import cache
from django.core.signals import setting_changed
from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from appliance.models import ApiToken
from appliance.shared_redis import RedisSkipped, fast

log = logging.getLogger(__name__)
COUNTED = "weir.throttle_counted"  # environ key: already counted (appliance/fast_produce.py)
LEASE_SHARE = 256
MAX_LEASE = 256
_SPENT = -1  # a bucket whose window's allowance is spent, across every process
_leases: dict[str, int] = {}  # bucket (token and window) -> requests left in this process
_lock = threading.Lock()
_keys: dict[tuple[str, int], str] = {}  # (bucket, window) -> its key in Redis


class TokenRateThrottle(SimpleRateThrottle):
    """WEIR_API_RATE (DRF's DEFAULT_THROTTLE_RATES["token"]) per token or user."""

    scope = "token"
    wait_s = 0.0

    def allow_request(self, request: Request, view: Any) -> bool:
        """Count the request in its window, once (appliance/fast_produce.py may have)."""
        if self.rate is None or request.META.get(COUNTED):
            return True
        return self._allow(self.get_cache_key(request, view))

    def allow_token(self, token: ApiToken) -> bool:
        """Count a request of `token`, for callers outside DRF (appliance/fast_produce.py)."""
        if self.rate is None:
            return True
        return self._allow(self.cache_format % {"scope": self.scope, "ident": f"t{token.pk}"})

    def _allow(self, ident: str) -> bool:
        """Count one request of bucket `ident` in the current window; without Redis (no
        answer within WEIR_REDIS_TIMEOUT_S, shared_redis.fast), let it through (losing the
        limit for a while beats refusing every producer, or holding them all) and say so in
        the log."""
        now = self.timer()
        window = int(now // self.duration)
        self.wait_s = (window + 1) * self.duration - now
        key = _key(ident, window)
        lease = min(MAX_LEASE, max(1, self.num_requests // LEASE_SHARE))
        if lease > 1:
            with _lock:
                left = _leases.get(key, 0)
                if left > 0:
                    _leases[key] = left - 1
                if left != 0:
                    return left > 0

        def count_in(client: Any) -> int:
            pipe = client.pipeline(transaction=False)
            pipe.incrby(key, lease)
            pipe.expire(key, self.duration + 1)
            return int(pipe.execute()[0])
        try:
            leased = fast(count_in)
        except RedisError as exc:
            if not isinstance(exc, RedisSkipped):
                log.warning("throttling off: the cache at REDIS_URL is unreachable (%s)", exc)
            return True
        granted = max(0, min(lease, self.num_requests - (leased - lease)))
        if lease > 1:
            with _lock:
                if len(_leases) > 10_000:  # buckets of windows gone by
                    _leases.clear()
                left = max(0, _leases.get(key, 0))  # another thread's lease meanwhile
                _leases[key] = left + granted - 1 if granted else (left or _SPENT)
        return granted > 0

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


def _key(ident: str, window: int) -> str:
    """The Redis key of bucket `ident` in `window`, made once (module doc)."""
    key = _keys.get((ident, window))
    if key is None:
        if len(_keys) > 10_000:  # windows gone by
            _keys.clear()
        key = _keys[(ident, window)] = cache.make_key(f"{ident}:{window}")
    return key


def _caches_changed(setting: str, **_: Any) -> None:
    """Forget the keys made under other CACHES settings (their prefix may differ)."""
    if setting == "CACHES":
        _keys.clear()


setting_changed.connect(_caches_changed, dispatch_uid="throttling_keys")

"""Per-token throttling: each token (or session user) gets WEIR_API_RATE requests; more
answer 429 with Retry-After. The history lives in the shared Redis cache, so the limit
holds across every web worker, not per process."""
from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from appliance.models import ApiToken

log = logging.getLogger(__name__)


class TokenRateThrottle(SimpleRateThrottle):
    """WEIR_API_RATE (DRF's DEFAULT_THROTTLE_RATES["token"]) per token or user."""

    scope = "token"

    def allow_request(self, request: Request, view: Any) -> bool:
        """Throttle by the shared history; without Redis, let the request through (losing
        the limit for a while beats refusing every producer) and say so in the log."""
        try:
            return bool(super().allow_request(request, view))
        except RedisError as exc:
            log.warning("throttling off: the cache at REDIS_URL is unreachable (%s)", exc)
            return True

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        """One bucket per token, per session user, or per client address."""
        if isinstance(request.auth, ApiToken):
            ident = f"t{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"u{request.user.pk}"
        else:
            ident = f"a{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
